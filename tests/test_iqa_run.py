"""`advbench iqa run` end to end: records, a skip on rerun, `advbench plot`, a kill -9 resumed exactly,
and bad values as one line each."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from test_cli import assert_one_line_error

from advbench.cli.config import compose_config
from advbench.core.errors import AdvbenchError
from advbench.core.records import read_kind

TINY = ["metric=cnnqa", "n_images=2", "eps=[0.01,0.03]", "threads=1", "progress=false"]
PROVENANCE = ["run_id", "seconds", "created_at"]


def iqa(tmp_path: Path, cache: Path, *args: str, **popen) -> subprocess.CompletedProcess | subprocess.Popen:
    env = {**os.environ, "ADVBENCH_CACHE": str(cache)}
    cmd = [sys.executable, "-m", "advbench", "iqa", "run", *TINY, f"out_dir={tmp_path / 'out'}", *args]
    if popen:
        return subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.mark.slow
def test_sweep_records_skip_and_plot(tmp_path: Path, cache: Path) -> None:
    proc = iqa(tmp_path, cache, "-m", "attack=fgsm,amifgsm")
    assert proc.returncode == 0, proc.stderr
    kind, frame = read_kind([tmp_path / "out" / "records"])
    assert kind.name == "iqa" and len(frame) == 2 * 2 * 2
    assert set(frame["attack"]) == {"fgsm", "amifgsm"} and set(frame["iterations"]) == {1, 10}
    assert (frame["linf"] <= frame["eps"] + 1e-6).all()
    again = iqa(tmp_path, cache, "-m", "attack=fgsm,amifgsm")
    assert again.returncode == 0 and again.stderr.count("skip cnnqa/") == 2, again.stderr
    plot = subprocess.run([sys.executable, "-m", "advbench", "plot", str(tmp_path / "out" / "records"),
                           "--out", str(tmp_path / "fig")], capture_output=True, text=True, timeout=600)
    assert plot.returncode == 0, plot.stderr
    for name in ("msu_scores.csv", "ranking.md", "gain_vs_eps.png", "robustness_vs_eps.png", "gain_vs_iterations.png"):
        assert (tmp_path / "fig" / name).stat().st_size > 0
    scores = pd.read_csv(tmp_path / "fig" / "msu_scores.csv")
    assert len(scores) == 4 and {"robustness_ci", "wasserstein", "energy"} <= set(scores.columns)


@pytest.mark.slow
def test_killed_run_resumes_to_the_records_of_an_uninterrupted_run(tmp_path: Path, cache: Path) -> None:
    args = ["attack=madc", "attack.params.steps=40", "batch_size=1", "chunk_size=1", "n_images=3"]
    whole = iqa(tmp_path / "a", cache, *args) if (tmp_path / "a").mkdir() is None else None
    assert whole.returncode == 0, whole.stderr
    (tmp_path / "b").mkdir()
    running = iqa(tmp_path / "b", cache, *args, popen=True)
    partial = tmp_path / "b" / "out" / "records" / ".partial"
    deadline = time.monotonic() + 300
    while not list(partial.glob("*/chunk-*.parquet")) and time.monotonic() < deadline and running.poll() is None:
        time.sleep(0.2)
    running.send_signal(signal.SIGKILL)
    running.wait()
    assert list(partial.glob("*/chunk-*.parquet")), "the run was killed after at least one chunk"
    assert not list((tmp_path / "b" / "out" / "records").glob("*.parquet")), "killed before the part was written"
    resumed = iqa(tmp_path / "b", cache, *args)
    assert resumed.returncode == 0, resumed.stderr
    a = read_kind([tmp_path / "a" / "out" / "records"])[1].drop(columns=PROVENANCE)
    b = read_kind([tmp_path / "b" / "out" / "records"])[1].drop(columns=PROVENANCE)
    pd.testing.assert_frame_equal(a, b)


@pytest.mark.parametrize(("args", "needle"), [
    (["eps=[-0.01]"], "every budget must be a number in (0, 1]"),
    (["eps=[]"], "at least one budget"),
    (["metric=nope"], "unknown metric 'nope'"),
    (["attack=nope"], "unknown attack 'nope'; valid: amifgsm"),
    (["attack=pgd"], "unknown attack 'pgd'"),
    (["attack.params.steps=0"], "steps must be a whole number >= 1"),
    (["batch_size=auto"], "batch_size must be a whole number >= 1"),
    (["experiment=benchmark"], "unknown experiment 'benchmark'; valid: iqa_defenses, iqa_msu, iqa_offline"),
])
def test_bad_values_are_one_line_before_any_work(args: list[str], needle: str) -> None:
    with pytest.raises(AdvbenchError) as caught:
        compose_config("iqa", [*TINY, *args])
    assert needle in str(caught.value) and "\n" not in str(caught.value)


def test_bad_values_on_the_command_line(tmp_path: Path, cache: Path) -> None:
    """The CLI prints them in one line (here two: one found composing, one found loading the images)."""
    (tmp_path / "empty").mkdir()
    assert_one_line_error(iqa(tmp_path, cache, "eps=[0.01,-1]"), "every budget must be a number in (0, 1]")
    assert_one_line_error(iqa(tmp_path, cache, f"data={tmp_path / 'empty'}"), "no images in")
