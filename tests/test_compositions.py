"""Hydra's repeated compositions made once (`cli.compositions`): a single run is composed once,
not first to read its mode; a sweep's check composes every job first, its local launcher
reuses what the check composed."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.hydra import Hydra
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from advbench.cli import compositions as sweeps
from advbench.cli.main import main

CONF = Path(__file__).resolve().parents[1] / "conf"


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


def test_no_config_shipped_sets_the_mode_a_run_is_launched_in() -> None:
    """What `mode_from_command_line` stands on: only a primary config or a global-package one (an
    experiment) can set `hydra.mode`, and none of them does; no file is in Hydra's own package."""
    files = sorted(CONF.rglob("*.yaml"))
    assert len(files) > 100
    for path in files:
        text = path.read_text()
        assert "@package hydra" not in text, path
        if path.parent == CONF or "@package _global_" in text:
            assert OmegaConf.select(OmegaConf.load(path), "hydra.mode") is None, path


class RunModes:
    """Counts Hydra's own compositions by the mode they are made for."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.modes: list[RunMode] = []
        real = Hydra.compose_config

        def counted(hydra, *args, **kwargs):
            self.modes.append(kwargs.get("run_mode", RunMode.RUN))
            return real(hydra, *args, **kwargs)

        monkeypatch.setattr(Hydra, "compose_config", counted)


def test_a_single_run_is_composed_once_and_a_mode_on_the_command_line_still_counts(
        tmp_path: Path, trained_digits_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ADVBENCH_CACHE", str(trained_digits_cache))
    monkeypatch.chdir(tmp_path)
    composed = RunModes(monkeypatch)
    run = ["run", "experiment=smoke", "attack=fgsm", "dataset.n_samples=8"]
    result = CliRunner().invoke(main, [*run, f"out_dir={tmp_path / 'one'}"])
    assert result.exit_code == 0, result.output
    assert composed.modes == [RunMode.RUN]  # Hydra alone first composes it for its mode (MULTIRUN)
    assert len(pd.read_parquet(tmp_path / "one" / "records")) == 8
    composed.modes.clear()
    # The mode from the command line: Hydra reads it, and a comma list without -m becomes a sweep.
    result = CliRunner().invoke(main, [*run[:2], "attack=fgsm,bim", *run[3:], "hydra.mode=MULTIRUN",
                                       f"out_dir={tmp_path / 'two'}"])
    assert result.exit_code == 0, result.output
    assert composed.modes[0] == RunMode.MULTIRUN
    assert sorted(pd.read_parquet(tmp_path / "two" / "records")["attack"].unique()) == ["bim", "fgsm"]


@pytest.mark.parametrize("flags, overrides, hydra_asked", [
    ((), ["experiment=smoke", "hydra.run.dir=x", "hydra/launcher=joblib"], False),
    ((), ["++hydra.mode=MULTIRUN"], True),
    ((), ["hydra.searchpath=[file:///my_conf]"], True),
    (("--config-dir",), ["experiment=mine"], True),
    (("-m",), ["attack=fgsm,bim"], False),
], ids=["own-configs", "mode-override", "user-configs", "config-dir", "sweep"])
def test_the_mode_is_left_to_hydra_where_it_could_come_from_elsewhere(
        flags, overrides, hydra_asked, monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[list[str]] = []
    monkeypatch.setattr(Hydra, "get_mode", lambda hydra, config_name, overrides: asked.append(overrides) or "mode")
    with sweeps.mode_from_command_line(flags, overrides):
        mode = Hydra.get_mode(object(), "config", list(overrides))  # type: ignore[arg-type]
    assert (mode == "mode") == hydra_asked and bool(asked) == hydra_asked
    assert Hydra.get_mode(object(), "config", []) == "mode"  # Hydra's own again once the command ends
