"""A killed sweep leaves no worker behind: a job in a worker process ends with its parent (issue 18, item 7)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from advbench.cli.workers import _running, watch_parent
from advbench.core.records import read_records


def _table() -> dict[int, tuple[int, str]]:
    """Every live process of this host: pid -> (parent pid, state), from /proc."""
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rpartition(")")[2].split()
            except OSError:
                continue
            out[int(entry.name)] = (int(fields[1]), fields[0])
    return out


def descendants(root: int) -> set[int]:
    """The processes below `root`, found through /proc."""
    table, found, todo = _table(), set(), [root]
    while todo:
        parent = todo.pop()
        for pid, (ppid, _) in table.items():
            if ppid == parent and pid not in found:
                found.add(pid)
                todo.append(pid)
    return found


def alive(pids: set[int]) -> set[int]:
    """Those of `pids` still running (an exited one its new parent has not reaped is not)."""
    table = _table()
    return {pid for pid in pids if pid in table and table[pid][1] != "Z"}


def wait_gone(pids: set[int], seconds: float) -> set[int]:
    """Wait up to `seconds` for `pids` to end; those still running."""
    deadline = time.monotonic() + seconds
    while (left := alive(pids)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


needs_proc = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc")


def test_a_job_in_the_launching_process_is_not_watched():
    """The basic launcher runs jobs in the `advbench` process: it must outlive its shell (nohup)."""
    import socket
    import threading

    watch_parent((socket.gethostname(), os.getpid()))
    assert "advbench-parent-watch" not in {t.name for t in threading.enumerate()}


@needs_proc
def test_running_tells_a_killed_unreaped_process_from_a_live_one():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert _running(os.getpid()) and _running(child.pid)
        child.kill()
        deadline = time.monotonic() + 5
        while _table().get(child.pid, (0, "Z"))[1] != "Z" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _running(child.pid)  # a zombie until reaped
    finally:
        child.wait()
    assert not _running(child.pid)


WORKER = textwrap.dedent("""
    import os, socket, sys, time
    from advbench.cli.workers import watch_parent

    def say(line):
        # One write per line: the two workers share the pipe, and print() writes the newline apart
        # from the text (two writes under PYTHONUNBUFFERED), so their lines could interleave.
        sys.stdout.write(line + "\\n")
        sys.stdout.flush()

    launcher = (socket.gethostname(), os.getppid())
    if sys.argv[1] == "late":  # its first job starts after the launcher died
        say("late imported")
        while os.getppid() == launcher[1]:
            time.sleep(0.05)
    watch_parent(launcher)
    say(f"{sys.argv[1]} watching")
    time.sleep(60)
""")
LAUNCHER = textwrap.dedent("""
    import subprocess, sys, time
    workers = [subprocess.Popen([sys.executable, "-c", sys.argv[1], mode]) for mode in ("early", "late")]
    print(*(w.pid for w in workers), flush=True)
    time.sleep(120)
""")


@pytest.mark.slow  # two interpreters importing advbench: seconds each on a loaded machine
@needs_proc
def test_a_worker_ends_within_a_second_of_its_parents_death():
    """A launcher stands in for `advbench`, its children for loky workers: one watching when the launcher
    dies, one whose first job starts after that (importing torch takes seconds)."""
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, WORKER], stdout=subprocess.PIPE, text=True)
    workers = set(map(int, launcher.stdout.readline().split()))
    try:
        assert sorted(launcher.stdout.readline().strip() for _ in range(2)) == ["early watching", "late imported"]
        launcher.kill()
        launcher.wait()
        assert wait_gone(workers, 3.0) == set()
        assert launcher.stdout.read() == ""  # the late one ended before it could say it watches
    finally:
        for pid in alive(workers):
            os.kill(pid, signal.SIGKILL)


def sweep(out: Path, cache: Path) -> subprocess.Popen:
    """A two-job joblib sweep whose jobs run for a minute, in its own session (as a terminal's job): at a
    budget no sample breaks at, every sample runs every iteration of every probe, so a job that ends
    within the tests' window was ended, not finished."""
    args = [sys.executable, "-m", "advbench", "run", "-m", "experiment=smoke", "attack=bim,pgd", "attack.params.steps=3000",
            "threat.eps=0.001", "dataset.n_samples=200", "defense.recipe.epochs=4", "hydra/launcher=joblib",
            "hydra.launcher.n_jobs=2", f"out_dir={out}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ADVBENCH_CACHE": str(cache)}
    return subprocess.Popen(args, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            preexec_fn=_as_a_terminals_job)


def _as_a_terminals_job() -> None:
    """Ctrl-C delivered and handled, as in a terminal's job, whatever the test process inherited or
    was left with (a child inherits an ignored or blocked SIGINT)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _signals(pid: int) -> str:
    """The ignored and blocked signal masks of process `pid` (for a failure's message)."""
    try:
        return " ".join(line.strip() for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                        if line.startswith(("SigIgn", "SigBlk", "State")))
    except OSError:
        return "gone"


def started(proc: subprocess.Popen, out: Path) -> set[int]:
    """Wait until both jobs hold their cell's lock (they run in the workers); the sweep's processes."""
    locks = out / "records" / ".locks"
    deadline = time.monotonic() + 120
    while not (locks.is_dir() and len(list(locks.iterdir())) >= 2):
        assert proc.poll() is None and time.monotonic() < deadline, "the sweep did not start its jobs"
        time.sleep(0.2)
    return descendants(proc.pid)


@pytest.mark.slow
@needs_proc
@pytest.mark.parametrize("how", ["SIGKILL", "Ctrl-C"])
def test_killing_a_joblib_sweep_ends_its_workers(how: str, tmp_path: Path, trained_digits_cache: Path):
    proc = sweep(tmp_path / "out", trained_digits_cache)
    workers: set[int] = set()
    try:
        workers = started(proc, tmp_path / "out")
        assert len(workers) >= 2
        if how == "SIGKILL":
            proc.kill()
        else:
            os.killpg(proc.pid, signal.SIGINT)
        left = wait_gone(workers, 15.0)  # seconds on a loaded machine (another test process beside it)
        assert left == set(), {pid: _signals(pid) for pid in {proc.pid, *left}}
        assert proc.wait(timeout=10) != 0
        parts = sorted((tmp_path / "out" / "records").glob("*.parquet"))
        time.sleep(2.0)  # nothing writes a part after its sweep is gone
        assert sorted((tmp_path / "out" / "records").glob("*.parquet")) == parts
        if parts:
            read_records(parts)  # whole parts only
    finally:
        for pid in alive({proc.pid, *workers}):
            os.kill(pid, signal.SIGKILL)
