"""The command line as a user meets it: help everywhere, one-line errors, records on disk."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import click
import pandas as pd
import pytest
import torch
from click.testing import CliRunner

from advbench.cli.main import main
from advbench.cli.spec_builder import run_main

ADVBENCH = [sys.executable, "-m", "advbench"]


def walk(group: click.Group, prefix: tuple[str, ...] = ()):
    for name, cmd in group.commands.items():
        yield prefix + (name,), cmd
        if isinstance(cmd, click.Group):
            yield from walk(cmd, prefix + (name,))


@pytest.mark.parametrize("path", [p for p, _ in walk(main)], ids=lambda p: " ".join(p))
def test_every_command_has_help(path: tuple[str, ...]) -> None:
    cmd = dict(walk(main))[path]
    assert (cmd.help or "").strip(), f"advbench {' '.join(path)} has no help text"
    result = CliRunner().invoke(main, [*path, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output


def test_list_shows_options_with_descriptions() -> None:
    result = CliRunner().invoke(main, ["list", "attack"])
    assert result.exit_code == 0
    for name in ("fgsm", "bim", "pgd", "mim"):
        assert name in result.output
    assert "iterative" in result.output.lower()


def test_list_unknown_group_lists_valid_groups() -> None:
    result = CliRunner().invoke(main, ["list", "attacks"])
    assert result.exit_code == 1
    assert "unknown group 'attacks'" in result.output and "attack" in result.output


def run_cli(*args: str, env_extra: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, **(env_extra or {})}
    return subprocess.run([*ADVBENCH, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=600)


def assert_one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode != 0
    err = proc.stderr.strip()
    assert "Traceback" not in proc.stderr + proc.stdout
    assert len(err.splitlines()) == 1, f"expected one line, got:\n{err}"
    for needle in needles:
        assert needle in err, err


def test_unknown_attack_lists_valid_names(tmp_path: Path) -> None:
    proc = run_cli("run", "attack=nope", cwd=tmp_path)
    assert_one_line_error(proc, "unknown attack 'nope'", "bim", "fgsm", "mim", "pgd")


def test_unknown_attack_inside_a_sweep(tmp_path: Path) -> None:
    proc = run_cli("run", "-m", "attack=bim,nope", cwd=tmp_path)
    assert_one_line_error(proc, "unknown attack 'nope'")


@pytest.mark.parametrize("eps", ["-0.1", "0", "nan"])
def test_bad_epsilon(eps: str, tmp_path: Path) -> None:
    proc = run_cli("run", f"threat.eps={eps}", cwd=tmp_path)
    assert_one_line_error(proc, "eps")


def test_unknown_key_is_one_line(tmp_path: Path) -> None:
    proc = run_cli("run", "attack.params.stepz=3", cwd=tmp_path)
    assert_one_line_error(proc, "stepz")


def test_missing_data_root(tmp_path: Path) -> None:
    proc = run_cli("run", "dataset=cifar10", "model=resnet56", f"dataset.root={tmp_path / 'nowhere'}",
                   env_extra={"ADVBENCH_CACHE": str(tmp_path / "cache")}, cwd=tmp_path)
    assert_one_line_error(proc, "nowhere")


def test_missing_cifar_checkpoint_names_the_train_command(tmp_path: Path, fake_cifar_root: Path) -> None:
    proc = run_cli("run", "dataset=cifar10", "model=resnet56", f"dataset.root={fake_cifar_root}",
                   env_extra={"ADVBENCH_CACHE": str(tmp_path / "cache")}, cwd=tmp_path)
    assert_one_line_error(proc, "advbench train dataset=cifar10 model=resnet56 defense=natural")


def test_mismatched_checkpoint(tmp_path: Path) -> None:
    from advbench.robustness.models import build_model
    from advbench.robustness.models.checkpoint_files import save_checkpoint

    other = build_model("resnet56", num_classes=10, in_channels=3)
    ckpt = save_checkpoint(tmp_path / "wrong.pt", other, {
        "dataset": "cifar10", "architecture": "resnet56", "recipe": "natural", "clean_accuracy": 0.1, "config": {},
        "created_at": "2026-01-01T00:00:00Z", "advbench_version": "0.1.0"})
    proc = run_cli("run", f"checkpoint={ckpt}", "experiment=smoke", cwd=tmp_path)
    assert_one_line_error(proc, "wrong.pt")


def test_corrupt_checkpoint(tmp_path: Path) -> None:
    bad = tmp_path / "corrupt.pt"
    bad.write_bytes(b"this is not a checkpoint")
    proc = run_cli("run", f"checkpoint={bad}", "experiment=smoke", cwd=tmp_path)
    assert_one_line_error(proc, "corrupt.pt")


def test_plot_without_records(tmp_path: Path) -> None:
    proc = run_cli("plot", str(tmp_path / "none"), cwd=tmp_path)
    assert_one_line_error(proc, "none")


def test_cfg_job_prints_the_config(tmp_path: Path) -> None:
    proc = run_cli("run", "attack=mim", "threat=l2_targeted", "--cfg", "job", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "decay: 1.0" in proc.stdout and "goal: targeted" in proc.stdout


@pytest.mark.slow
def test_parallel_smoke_sweep_then_plot_end_to_end(tmp_path: Path, trained_digits_cache: Path) -> None:
    env = {"ADVBENCH_CACHE": str(trained_digits_cache)}
    proc = run_cli("run", "-m", "experiment=smoke", "attack=fgsm,bim", "threat=linf,l2_targeted",
                   "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", env_extra=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    parts = sorted((tmp_path / "advbench-out/smoke/records").glob("*.parquet"))
    assert len(parts) == 4
    frame = pd.concat(pd.read_parquet(p) for p in parts)
    assert len(frame) == 4 * 64
    assert set(frame["attack"]) == {"fgsm", "bim"} and set(frame["goal"]) == {"untargeted", "targeted"}
    targeted = frame[frame["goal"] == "targeted"]
    assert (targeted.loc[targeted["success_at_budget"], "adv_pred"] == targeted.loc[targeted["success_at_budget"], "target"]).all()
    assert (targeted["target"] != targeted["label"]).all()

    again = run_cli("run", "-m", "experiment=smoke", "attack=fgsm,bim", "threat=linf,l2_targeted", env_extra=env, cwd=tmp_path)
    assert again.returncode == 0 and again.stderr.count("skip") == 4

    plot = run_cli("plot", str(tmp_path / "advbench-out/smoke/records"), "--out", str(tmp_path / "figs"), cwd=tmp_path)
    assert plot.returncode == 0, plot.stderr
    assert list((tmp_path / "figs").glob("budget_*.png")) and list((tmp_path / "figs").glob("table3_*.md"))


def test_interrupted_run_resumes(tmp_path: Path, trained_digits_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Kill a cell after its first chunk; the rerun reuses that chunk and equals a clean run."""
    from advbench.cli.config import compose_config
    from advbench.robustness.evaluation import cell

    monkeypatch.setenv("ADVBENCH_CACHE", str(trained_digits_cache))
    cfg = compose_config("config", ["experiment=smoke", "attack=fgsm", f"out_dir={tmp_path}", "chunk_size=16", "batch_size=16"])
    real = cell.evaluate_batch
    calls = {"n": 0}

    def dying(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(cell, "evaluate_batch", dying)
    with pytest.raises(KeyboardInterrupt):
        run_main(cfg)
    assert not list(Path(cfg.records_dir).glob("*.parquet")), "no final part after a kill"
    assert len(list(Path(cfg.records_dir).glob(".partial/*/chunk-*.parquet"))) == 2

    calls["n"] = -100
    resumed = pd.read_parquet(run_main(cfg))
    assert calls["n"] == -100 + 2, "only the two missing chunks are recomputed"
    monkeypatch.setattr(cell, "evaluate_batch", real)
    cfg_clean = compose_config("config", ["experiment=smoke", "attack=fgsm", f"out_dir={tmp_path / 'clean'}", "chunk_size=16",
                                          "batch_size=16"])
    clean = pd.read_parquet(run_main(cfg_clean))
    cols = ["sample_id", "success_at_budget", "adv_pred", "min_eps", "first_success_strength"]
    pd.testing.assert_frame_equal(resumed[cols].reset_index(drop=True), clean[cols].reset_index(drop=True))
    assert not (Path(cfg.records_dir) / ".partial").exists() or not any((Path(cfg.records_dir) / ".partial").rglob("*.parquet"))
    assert torch.isfinite(torch.tensor(resumed["min_eps"].to_numpy())).any()
