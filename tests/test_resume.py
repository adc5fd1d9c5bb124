"""Resume, skip, force, locking and cache keys: records are never lost, duplicated or stale.

Each test plays one way a run goes wrong in practice (killed mid-cell, rerun with other
settings, a damaged or foreign chunk, two runs on one folder) and compares the final records
with an uninterrupted run's on every column but timing and provenance.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
from hydra.utils import instantiate

from advbench.cli.config import compose_config
from advbench.cli.spec_builder import cell_spec, model_spec, run_main, target_spec
from advbench.core.errors import AdvbenchError
from advbench.core.records import write_part
from advbench.core.resume import CellFiles, sample_ids
from advbench.robustness.defenses.checkpoint_cache import checkpoint_key
from advbench.robustness.defenses.trained import ensure_checkpoint
from advbench.robustness.evaluation import cell

# Timing and provenance differ between any two runs; everything else must not.
VOLATILE = ["seconds", "run_id", "created_at"]
EVALUATE_BATCH = cell.evaluate_batch
# The conftest cache holds a natural small_cnn trained for 4 epochs; ask for that model.
BASE = ["experiment=smoke", "attack=fgsm", "defense.recipe.epochs=4", "threads=1", "batch_size=8", "chunk_size=16",
        "probe_pool=1"]  # one batch per `evaluate_batch` call, which the kills count


@pytest.fixture(autouse=True)
def _cache(trained_digits_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ADVBENCH_CACHE", str(trained_digits_cache))


def config(out: Path, *extra: str):
    return compose_config("config", [*BASE, f"out_dir={out}", *extra])


def comparable(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.drop(columns=VOLATILE).reset_index(drop=True)


def kill_after(monkeypatch: pytest.MonkeyPatch, batches: int) -> None:
    """Make the next run die (like Ctrl-C) when it starts batch number `batches + 1`."""
    real = EVALUATE_BATCH
    calls = {"n": 0}

    def dying(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] > batches:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(cell, "evaluate_batch", dying)


def count_batches(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    real = EVALUATE_BATCH
    calls = {"n": 0}

    def counting(*args, **kwargs):
        calls["n"] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(cell, "evaluate_batch", counting)
    return calls


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, trained_digits_cache: Path) -> pd.DataFrame:
    """The smoke FGSM cell run once, uninterrupted."""
    saved = os.environ.get("ADVBENCH_CACHE")
    os.environ["ADVBENCH_CACHE"] = str(trained_digits_cache)
    try:
        return pd.read_parquet(run_main(config(tmp_path_factory.mktemp("reference"))))
    finally:
        if saved is None:
            os.environ.pop("ADVBENCH_CACHE")
        else:
            os.environ["ADVBENCH_CACHE"] = saved


def chunks(cfg) -> list[Path]:
    return sorted(Path(cfg.records_dir).glob(".partial/*/chunk-*.parquet"))


@pytest.mark.parametrize("first, second", [(16, 24), (24, 16), (16, 5)])
def test_resume_with_another_chunk_size(first: int, second: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        reference: pd.DataFrame) -> None:
    """The issue's 128-of-480 and 576-for-480: chunks are matched by sample id, not by index."""
    kill_after(monkeypatch, batches=5)  # 40 samples done: two chunks of 16 or one of 24
    with pytest.raises(KeyboardInterrupt):
        run_main(config(tmp_path, f"chunk_size={first}"))
    assert chunks(config(tmp_path))
    calls = count_batches(monkeypatch)
    resumed = pd.read_parquet(run_main(config(tmp_path, f"chunk_size={second}")))
    assert len(resumed) == 64 and resumed["sample_id"].is_unique
    pd.testing.assert_frame_equal(comparable(resumed), comparable(reference))
    done = (40 // first) * first
    assert calls["n"] * 8 >= 64 - done and calls["n"] * 8 < 64, "finished chunks are reused, the rest computed"


def test_truncated_chunk_is_recomputed_with_a_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys,
                                                      reference: pd.DataFrame) -> None:
    kill_after(monkeypatch, batches=4)
    with pytest.raises(KeyboardInterrupt):
        run_main(config(tmp_path))
    first = chunks(config(tmp_path))[0]
    first.write_bytes(first.read_bytes()[:100])
    monkeypatch.undo()
    resumed = pd.read_parquet(run_main(config(tmp_path)))
    assert "ignoring chunk" in capsys.readouterr().err
    pd.testing.assert_frame_equal(comparable(resumed), comparable(reference))


@pytest.mark.parametrize("foreign", ["other_cell", "not_records"])
def test_foreign_chunk_is_recomputed_with_a_warning(foreign: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys, reference: pd.DataFrame) -> None:
    """A parquet that is not this cell's chunk (another cell's records, any table) is never adopted."""
    kill_after(monkeypatch, batches=4)
    with pytest.raises(KeyboardInterrupt):
        run_main(config(tmp_path))
    first = chunks(config(tmp_path))[0]
    if foreign == "other_cell":
        other = pd.read_parquet(first).assign(cell_key="0123456789ab", adv_pred=-1)
    else:
        other = pd.DataFrame({"sample_id": range(32), "x": 1.0})
    other.to_parquet(first)
    monkeypatch.undo()
    resumed = pd.read_parquet(run_main(config(tmp_path)))
    assert "ignoring chunk" in capsys.readouterr().err
    pd.testing.assert_frame_equal(comparable(resumed), comparable(reference))


def test_force_clears_partial_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reference: pd.DataFrame) -> None:
    """force=true must not reuse a chunk left by an earlier run (here: one with wrong numbers)."""
    kill_after(monkeypatch, batches=2)
    with pytest.raises(KeyboardInterrupt):
        run_main(config(tmp_path))
    stale = chunks(config(tmp_path))[0]
    pd.read_parquet(stale).assign(adv_pred=-7).to_parquet(stale)
    monkeypatch.undo()
    forced = pd.read_parquet(run_main(config(tmp_path, "force=true")))
    pd.testing.assert_frame_equal(comparable(forced), comparable(reference))
    assert not chunks(config(tmp_path))
    calls = count_batches(monkeypatch)
    run_main(config(tmp_path, "force=true"))
    assert calls["n"] == 8, "force=true recomputes a finished cell"


def test_skip_when_finished_and_unreadable_part_is_recomputed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys, reference: pd.DataFrame) -> None:
    out = run_main(config(tmp_path))
    calls = count_batches(monkeypatch)
    assert run_main(config(tmp_path)) == out and calls["n"] == 0
    assert "skip" in capsys.readouterr().err
    out.write_bytes(b"PAR1 not really")
    pd.testing.assert_frame_equal(comparable(pd.read_parquet(run_main(config(tmp_path)))), comparable(reference))
    assert calls["n"] == 8 and "unreadable records" in capsys.readouterr().err


def test_kills_leave_no_orphans_after_the_next_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Leftovers of kills (temporary files, chunks of finished cells) go on the next run."""
    finished = run_main(config(tmp_path, "threat=l2"))
    stale_partial = CellFiles(finished).partial
    stale_partial.mkdir(parents=True)
    (stale_partial / "chunk-000000-00016.parquet").write_bytes(b"left by a kill after the part was written")
    records = finished.parent
    orphan_part = records / f".{finished.name}.{'a' * 32}.tmp"
    orphan_part.write_bytes(b"half a part")
    out = cell.part_path(records, cell.cell_identity(cell_spec(config(tmp_path)), *_threat_attack(config(tmp_path))))
    orphan_own = records / f".{out.name}.{'b' * 32}.tmp"
    orphan_own.write_bytes(b"half a part")
    kill_after(monkeypatch, batches=2)
    with pytest.raises(KeyboardInterrupt):
        run_main(config(tmp_path))
    orphan_chunk = CellFiles(out).partial / f".chunk-000016-00016.parquet.{'c' * 32}.tmp"
    orphan_chunk.write_bytes(b"half a chunk")
    monkeypatch.undo()
    run_main(config(tmp_path))
    leftovers = [p for p in records.rglob("*") if p.is_file() and ".locks" not in p.parts]
    assert sorted(leftovers) == sorted([finished, out]), leftovers


def _threat_attack(cfg):
    dataset = instantiate(cfg.dataset)
    return cell.build_threat(cell_spec(cfg), dataset.budgets), instantiate(cfg.attack.params)


def key_of(tmp_path: Path, *extra: str) -> str:
    cfg = config(tmp_path, *extra)
    threat = cell.build_threat(cell_spec(cfg), dict(cfg.dataset.budgets))
    return cell.cell_key(cell.cell_identity(cell_spec(cfg), threat, instantiate(cfg.attack.params)))


@pytest.mark.parametrize("change", [
    "dataset.test_fraction=0.25", "dataset.split_seed=1", "dataset.n_samples=32", "model.width=8",
    "defense.recipe.epochs=5", "defense.recipe.lr=0.002", "seed=1", "search.resolution=0.2",
])
def test_cell_key_covers_every_input_that_changes_the_numbers(change: str, tmp_path: Path) -> None:
    assert key_of(tmp_path, change) != key_of(tmp_path)


@pytest.mark.parametrize("same", ["batch_size=4", "chunk_size=3", "threads=2", "run_id=x", "force=true"])
def test_cell_key_ignores_what_leaves_the_numbers_alone(same: str, tmp_path: Path) -> None:
    assert key_of(tmp_path, same) == key_of(tmp_path)


def test_cell_key_covers_the_data_root(tmp_path: Path, fake_cifar_root: Path) -> None:
    cifar = ["dataset=cifar10", "model=resnet56"]
    assert key_of(tmp_path, *cifar, f"dataset.root={fake_cifar_root}") != key_of(tmp_path, *cifar, f"dataset.root={tmp_path}")


def test_cell_key_covers_the_checkpoint_content(tmp_path: Path) -> None:
    """Same `checkpoint=` path, new weights in it: the records of the old weights are stale."""
    from advbench.robustness.models.checkpoint_files import load_checkpoint, save_checkpoint

    cfg = config(tmp_path)
    model = model_spec(cfg.model).build(10, 1)
    meta = load_checkpoint(ensure_checkpoint(target_spec(cfg)), model)
    ckpt = save_checkpoint(tmp_path / "mine.pt", model, meta)
    first = run_main(config(tmp_path, f"checkpoint={ckpt}"))
    with torch.no_grad():
        next(model.parameters()).mul_(-1)
    save_checkpoint(ckpt, model, meta)
    second = run_main(config(tmp_path, f"checkpoint={ckpt}"))
    assert second != first and second.is_file()
    assert not pd.read_parquet(first)["adv_pred"].equals(pd.read_parquet(second)["adv_pred"])


@pytest.mark.parametrize("change", ["defense.recipe.epochs=5", "model.width=8", "dataset.split_seed=1",
                                    "dataset.test_fraction=0.25", "seed=1"])
def test_checkpoint_cache_is_keyed_on_content(change: str) -> None:
    base = ["defense=natural", "defense.recipe.epochs=4"]
    changed, unchanged = (target_spec(compose_config("train", o)) for o in ([*base, change], base))
    assert checkpoint_key(changed) != checkpoint_key(unchanged)


def test_checkpoint_cache_key_is_shared_by_train_and_run() -> None:
    """`advbench train` writes the file a smoke `run` (any n_samples) looks up."""
    train = compose_config("train", ["defense=natural"])
    run = compose_config("config", ["experiment=smoke", "dataset.n_samples=7"])
    assert checkpoint_key(target_spec(train)) == checkpoint_key(target_spec(run))


def test_run_trains_a_new_checkpoint_when_the_recipe_changes(tmp_path: Path) -> None:
    """The issue: `defense.recipe.epochs` changed, yet the cell skipped on the old model."""
    first = run_main(config(tmp_path))
    second = run_main(config(tmp_path, "defense.recipe.epochs=1"))
    assert first != second
    meta = torch.load(ensure_checkpoint(target_spec(config(tmp_path, "defense.recipe.epochs=1"))), weights_only=True)["meta"]
    assert meta["config"]["recipe"]["epochs"] == 1


def test_sample_ids_without_an_id_attribute() -> None:
    class Plain(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 3

        def __getitem__(self, i: int):
            return torch.zeros(1, 2, 2), 0, 10 * i

    assert sample_ids(Plain()) == [0, 10, 20]


def test_duplicate_sample_ids_are_an_error(tmp_path: Path) -> None:
    from advbench.core.resume import ChunkStore

    with pytest.raises(AdvbenchError, match="not unique"):
        ChunkStore(tmp_path, "k", "v", [1, 2, 1])


# ----------------------------------------------------------------- real processes, real signals

def advbench_run(out: Path, cache: Path, *extra: str) -> subprocess.Popen:
    args = [sys.executable, "-m", "advbench", "run", *BASE, "attack=bim", "dataset.n_samples=96", "chunk_size=8",
            f"out_dir={out}", *extra]
    env = {**os.environ, "ADVBENCH_CACHE": str(cache), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def wait_for(predicate, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.02)


@pytest.mark.slow
def test_second_run_of_a_running_cell_waits_then_skips(tmp_path: Path, trained_digits_cache: Path,
                                                       reference: pd.DataFrame) -> None:
    """The issue's two sweeps into one folder: the second waits for the cell's lock, then skips
    (before, it computed alongside and crashed with FileNotFoundError when `.partial/` went)."""
    cfg = config(tmp_path)
    files = CellFiles(cell.part_path(Path(cfg.records_dir), cell.cell_identity(cell_spec(cfg), *_threat_attack(cfg))))
    log = tmp_path / "second.err"
    with files.lock():  # this test plays the first run, mid-cell
        files.partial.mkdir(parents=True)
        (files.partial / "chunk-000000-00016.parquet").write_bytes(b"being written by the first run")
        with open(log, "w") as err:
            second = subprocess.Popen([sys.executable, "-m", "advbench", "run", *BASE, f"out_dir={tmp_path}"],
                                      stdout=subprocess.DEVNULL, stderr=err,
                                      env={**os.environ, "ADVBENCH_CACHE": str(trained_digits_cache)})
        wait_for(lambda: "waiting" in log.read_text() or second.poll() is not None, timeout=300)
        assert second.poll() is None, log.read_text()
        write_part(reference, files.part)  # the first run finishes: part written, chunks removed
        files.clear_partial()
    assert second.wait(timeout=300) == 0, log.read_text()
    err = log.read_text()
    assert "skip" in err and "Traceback" not in err, err
    pd.testing.assert_frame_equal(pd.read_parquet(files.part), reference)


@pytest.mark.slow
def test_kill_at_random_points_then_resume_equals_an_uninterrupted_run(tmp_path: Path,
                                                                       trained_digits_cache: Path) -> None:
    """SIGKILL a BIM cell at random moments (start-up, then after a random number of chunks,
    mid-batch or mid-write), rerun, compare all columns.

    Kills are timed by the chunks on disk, not by the clock, so a loaded machine or a fast
    resumed run cannot let the cell finish before it was killed.
    """
    clean = advbench_run(tmp_path / "clean", trained_digits_cache)
    _, err = clean.communicate(timeout=300)
    assert clean.returncode == 0, err
    rng = random.Random(6)
    records = tmp_path / "killed/records"

    def chunks_on_disk() -> int:
        return len(list(records.glob(".partial/*/chunk-*.parquet")))

    kills = 0
    # 12 chunks of 8 samples: once during start-up, then at two random later chunk counts.
    for target in [0, *sorted(rng.sample(range(2, 11), 2))]:
        proc = advbench_run(tmp_path / "killed", trained_digits_cache)
        if target == 0:
            time.sleep(rng.uniform(0.2, 1.0))
        else:
            wait_for(lambda: chunks_on_disk() >= target or proc.poll() is not None, timeout=300)
            time.sleep(rng.uniform(0.0, 0.1))  # land anywhere in the next chunk's batch or write
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            kills += 1
        proc.communicate(timeout=60)
    assert kills >= 2, "the cell finished before it could be killed twice"
    final = advbench_run(tmp_path / "killed", trained_digits_cache)
    _, err = final.communicate(timeout=300)
    assert final.returncode == 0 and "Traceback" not in err, err
    (resumed,) = records.glob("*.parquet")
    (reference,) = (tmp_path / "clean/records").glob("*.parquet")
    pd.testing.assert_frame_equal(comparable(pd.read_parquet(resumed)), comparable(pd.read_parquet(reference)))
    assert not list(records.rglob("*.tmp")) and not any((records / ".partial").iterdir())


def test_unwritable_lock_folder_is_one_line(tmp_path: Path) -> None:
    """A records folder where the lock cannot be made (here `.locks` is a file) is a user error."""
    (tmp_path / "records").mkdir()
    (tmp_path / "records/.locks").write_text("not a folder")
    with pytest.raises(AdvbenchError, match="cannot create the lock file"):
        run_main(config(tmp_path))


# ---- a part must be its own cell, whole -------------------------------------------------------


def _two_cells(tmp_path: Path) -> tuple[Path, Path]:
    parts = []
    for attack in ("fgsm", "bim"):
        cfg = compose_config("config", ["experiment=smoke", f"attack={attack}", "dataset.n_samples=16",
                                        "search.enabled=false", f"out_dir={tmp_path}"])
        parts.append(run_main(cfg))
    return parts[0], parts[1]


def test_a_part_of_another_cell_under_a_cells_name_is_recomputed_and_refused_by_plot(tmp_path: Path, capsys) -> None:
    from click.testing import CliRunner

    from advbench.cli.main import main

    fgsm, bim = _two_cells(tmp_path)
    shutil.copy(fgsm, bim)  # the fgsm records under bim's file name
    plotted = CliRunner().invoke(main, ["plot", str(tmp_path / "records"), "--out", str(tmp_path / "plots")])
    assert plotted.exit_code == 1 and "holds the records of cell" in plotted.output and "its name says" in plotted.output
    checked = CliRunner().invoke(main, ["check", str(tmp_path / "records"), "--min-accuracy", "0"])
    assert checked.exit_code == 1 and "holds the records of cell" in checked.output
    cfg = compose_config("config", ["experiment=smoke", "attack=bim", "dataset.n_samples=16", "search.enabled=false",
                                    f"out_dir={tmp_path}"])
    capsys.readouterr()
    assert run_main(cfg) == bim
    assert "belong to another cell" in capsys.readouterr().err
    assert set(pd.read_parquet(bim)["attack"]) == {"bim"}, "the cell was computed again"


def test_a_part_with_rows_removed_is_recomputed_and_refused_by_plot(tmp_path: Path, capsys) -> None:
    from click.testing import CliRunner

    from advbench.cli.main import main

    fgsm, _ = _two_cells(tmp_path)
    frame = pd.read_parquet(fgsm)
    frame.iloc[:8].to_parquet(fgsm)
    plotted = CliRunner().invoke(main, ["plot", str(tmp_path / "records"), "--out", str(tmp_path / "plots")])
    assert plotted.exit_code == 1 and "holds 8 distinct of cell" in plotted.output
    cfg = compose_config("config", ["experiment=smoke", "attack=fgsm", "dataset.n_samples=16", "search.enabled=false",
                                    f"out_dir={tmp_path}"])
    capsys.readouterr()
    run_main(cfg)
    assert "hold 8 rows for the cell's 16 samples" in capsys.readouterr().err
    assert len(pd.read_parquet(fgsm)) == 16
