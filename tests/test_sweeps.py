"""A sweep composes each job once (`cli.sweeps`): Hydra's check composes every job first, its
local launcher reuses what the check composed."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from omegaconf import DictConfig, OmegaConf

from advbench.cli import sweeps
from advbench.cli.main import main


class Compositions:
    """A stand-in for Hydra's job composition: a new object per call, each call counted."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []

    def __call__(self, loader: object, master: object, overrides: list[str]) -> object:
        self.calls.append(tuple(overrides))
        return object()


def master(launcher: str = sweeps.LOCAL_LAUNCHER) -> DictConfig:
    """A sweep's master config, as far as the keeping reads it: which launcher runs the jobs."""
    return OmegaConf.create({"hydra": {"launcher": {"_target_": launcher}}})


def test_a_job_composed_again_gets_the_first_composition_once(monkeypatch: pytest.MonkeyPatch) -> None:
    composed = Compositions()
    monkeypatch.setattr(ConfigLoaderImpl, "load_sweep_config", composed)
    loader, sweep = object(), master()
    with sweeps.compose_each_job_once():
        checked = ConfigLoaderImpl.load_sweep_config(loader, sweep, ["attack=bim"])
        launched = ConfigLoaderImpl.load_sweep_config(loader, sweep, ["attack=bim"])
        third = ConfigLoaderImpl.load_sweep_config(loader, sweep, ["attack=bim"])
        other = ConfigLoaderImpl.load_sweep_config(loader, master(), ["attack=bim"])
    assert launched is checked and third is not checked and other is not checked
    assert composed.calls == [("attack=bim",)] * 3
    assert ConfigLoaderImpl.load_sweep_config is composed  # Hydra's own method again once the command ends


def test_nothing_is_kept_for_a_launcher_that_composes_elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    composed = Compositions()
    monkeypatch.setattr(ConfigLoaderImpl, "load_sweep_config", composed)
    sweep = master("hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher")
    loader = object()
    with sweeps.compose_each_job_once():
        first = ConfigLoaderImpl.load_sweep_config(loader, sweep, ["attack=bim"])
        again = ConfigLoaderImpl.load_sweep_config(loader, sweep, ["attack=bim"])
    assert again is not first and len(composed.calls) == 2


def test_jobs_beyond_the_kept_ones_are_composed_again(monkeypatch: pytest.MonkeyPatch) -> None:
    composed = Compositions()
    monkeypatch.setattr(ConfigLoaderImpl, "load_sweep_config", composed)
    monkeypatch.setattr(sweeps, "KEPT_JOBS", 1)
    loader, sweep = object(), master()
    with sweeps.compose_each_job_once():
        for job in (["attack=bim"], ["attack=pgd"], ["attack=bim"], ["attack=pgd"]):
            ConfigLoaderImpl.load_sweep_config(loader, sweep, job)
    assert composed.calls == [("attack=bim",), ("attack=pgd",), ("attack=pgd",)]


def test_a_sweep_composes_each_job_once_and_runs_them_all(tmp_path: Path, trained_digits_cache: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ADVBENCH_CACHE", str(trained_digits_cache))
    monkeypatch.chdir(tmp_path)
    composed: list[tuple[str, ...]] = []
    real = ConfigLoaderImpl.load_sweep_config

    def counted(self, master_config, sweep_overrides):
        composed.append(tuple(o for o in sweep_overrides if o.startswith("attack=")))
        return real(self, master_config, sweep_overrides)

    monkeypatch.setattr(ConfigLoaderImpl, "load_sweep_config", counted)
    result = CliRunner().invoke(main, ["run", "-m", "experiment=smoke", "attack=fgsm,bim", "dataset.n_samples=8",
                                       f"out_dir={tmp_path / 'out'}"])
    assert result.exit_code == 0, result.output
    assert sorted(composed) == [("attack=bim",), ("attack=fgsm",)]  # Hydra alone composes each twice
    frame = pd.concat(pd.read_parquet(p) for p in (tmp_path / "out" / "records").glob("*.parquet"))
    assert sorted(frame["attack"].unique()) == ["bim", "fgsm"] and len(frame) == 16
