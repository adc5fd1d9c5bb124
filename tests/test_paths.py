"""Where files go (ADVBENCH_CACHE / _DATA / _WEIGHTS) and the Slurm launcher extra."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from advbench.cli.config import compose_config
from advbench.core.errors import AdvbenchError
from advbench.core.paths import location

ADVBENCH = [sys.executable, "-m", "advbench"]


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    """A clean slate: none of advbench's folder variables set, HOME in tmp_path."""
    for variable in ("ADVBENCH_CACHE", "ADVBENCH_DATA", "ADVBENCH_WEIGHTS"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return monkeypatch


def test_everything_defaults_under_home_cache(env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cache = tmp_path / "home" / ".cache" / "advbench"
    assert location("cache") == str(cache)
    assert location("data") == str(cache / "data")
    assert location("weights") == str(cache / "weights")


def test_cache_moves_data_weights_and_checkpoints(env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    env.setenv("ADVBENCH_CACHE", str(tmp_path / "c"))
    run = compose_config("config", ["dataset=cifar10"])
    assert run.cache_dir == str(tmp_path / "c")
    assert run.dataset.root == str(tmp_path / "c" / "data")
    assert compose_config("config", ["dataset=imagenet"]).dataset.root == str(tmp_path / "c" / "data" / "imagenet" / "val")
    assert compose_config("train", []).cache_dir == str(tmp_path / "c")
    vsfa = compose_config("uap_eval", ["metric=vsfa"]).metric
    assert vsfa.weights == str(tmp_path / "c" / "weights" / "vsfa.pt")
    assert vsfa.backbone_weights == str(tmp_path / "c" / "weights" / "resnet50-0676ba61.pth")
    assert compose_config("uap_eval", ["metric=niqe"]).metric.cache_dir == str(tmp_path / "c")


def test_data_and_weights_variables_win_over_the_cache(env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    env.setenv("ADVBENCH_CACHE", str(tmp_path / "c"))
    env.setenv("ADVBENCH_DATA", str(tmp_path / "d"))
    env.setenv("ADVBENCH_WEIGHTS", "")  # empty means unset, not the current directory
    assert compose_config("config", ["dataset=cifar10"]).dataset.root == str(tmp_path / "d")
    assert compose_config("uap_eval", ["metric=nima"]).metric.weights == str(tmp_path / "c" / "weights" / "nima.pth")
    env.setenv("ADVBENCH_WEIGHTS", str(tmp_path / "w"))
    assert compose_config("uap_eval", ["metric=nima"]).metric.weights == str(tmp_path / "w" / "nima.pth")


def test_unknown_folder_kind_is_a_user_error() -> None:
    with pytest.raises(AdvbenchError, match="unknown advbench folder 'tmp'"):
        location("tmp")


def test_slurm_launcher_composes_from_the_command_line(tmp_path: Path) -> None:
    """What the README tells Slurm users to type, with the `advbench[slurm]` extra installed."""
    proc = subprocess.run([*ADVBENCH, "run", "hydra/launcher=submitit_slurm", "hydra.launcher.partition=gpu",
                           "--cfg", "hydra"], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "hydra_submitit_launcher.submitit_launcher.SlurmLauncher" in proc.stdout
    assert "partition: gpu" in proc.stdout


@pytest.mark.slow
def test_sweep_runs_through_submitit_local(tmp_path: Path, trained_digits_cache: Path) -> None:
    """submitit's local executor runs the jobs in child processes, as Slurm would on nodes."""
    proc = subprocess.run([*ADVBENCH, "run", "-m", "experiment=smoke", "attack=fgsm,bim", "dataset.n_samples=16",
                           "hydra/launcher=submitit_local"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=600,
                          env={**os.environ, "ADVBENCH_CACHE": str(trained_digits_cache)})
    assert proc.returncode == 0, proc.stderr
    parts = sorted((tmp_path / "advbench-out/smoke/records").glob("*.parquet"))
    assert len(parts) == 2
    assert set(pd.concat(pd.read_parquet(p) for p in parts)["attack"]) == {"fgsm", "bim"}
    assert list((tmp_path / "advbench-out/smoke/hydra-multirun").rglob(".submitit"))


@pytest.mark.slow
def test_sweep_runs_through_a_local_ray_instance(tmp_path: Path, trained_digits_cache: Path) -> None:
    """The ray launcher (`advbench[ray]`) starts a local Ray instance and runs each cell as a Ray task."""
    proc = subprocess.run([*ADVBENCH, "run", "-m", "experiment=smoke", "attack=fgsm,bim", "dataset.n_samples=16",
                           "defense.recipe.epochs=4", "hydra/launcher=ray", "+hydra.launcher.ray.init.num_cpus=1"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=600,
                          env={**os.environ, "ADVBENCH_CACHE": str(trained_digits_cache), "RAY_USAGE_STATS_ENABLED": "0"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Ray Launcher is launching 2 jobs" in proc.stdout + proc.stderr
    parts = sorted((tmp_path / "advbench-out/smoke/records").glob("*.parquet"))
    assert len(parts) == 2
    assert set(pd.concat(pd.read_parquet(p) for p in parts)["attack"]) == {"fgsm", "bim"}


def test_metrics_built_in_python_find_their_files_under_advbench_cache(env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import torch

    from advbench.quality.metrics.learned import (
        CNNQA,
        WEIGHTS_FILE,
        QualityNet,
        save_weights,
    )
    from advbench.quality.metrics.niqe import NIQE
    from advbench.quality.metrics.niqe_pristine import MODEL_FILE, save_pristine_model

    env.setenv("ADVBENCH_CACHE", str(tmp_path / "c"))
    mu = torch.arange(36, dtype=torch.float64)
    save_pristine_model({"mu": mu, "cov": torch.eye(36, dtype=torch.float64)}, tmp_path / "c" / MODEL_FILE)
    assert torch.equal(NIQE(pristine="fitted").mu, mu)
    torch.manual_seed(0)
    net = QualityNet()
    save_weights(net, tmp_path / "c" / WEIGHTS_FILE)
    loaded = CNNQA().net.state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in net.state_dict().items())
