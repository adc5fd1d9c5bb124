"""The two private Hydra methods `advbench.cli.compositions` replaces for the length of a command
(`Hydra.get_mode`, `ConfigLoaderImpl.load_sweep_config`) must exist with the signatures it
replaces them with. pyproject.toml bounds hydra-core to the 1.3 series; a release that changes
either method fails here, by name, instead of composing twice or calling a method wrongly."""

from __future__ import annotations

import inspect

import hydra
import pytest
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.hydra import Hydra


@pytest.mark.parametrize(("method", "parameters"), [
    (Hydra.get_mode, ["self", "config_name", "overrides"]),
    (ConfigLoaderImpl.load_sweep_config, ["self", "master_config", "sweep_overrides"]),
], ids=["Hydra.get_mode", "ConfigLoaderImpl.load_sweep_config"])
def test_the_replaced_private_methods_keep_their_signatures(method, parameters) -> None:
    assert list(inspect.signature(method).parameters) == parameters, (
        f"hydra-core {hydra.__version__} changed {method.__qualname__}: advbench/cli/compositions.py replaces it "
        "and must follow (then widen the hydra-core bound in pyproject.toml)")


def test_the_installed_hydra_is_the_series_pyproject_allows() -> None:
    major, minor = (int(part) for part in hydra.__version__.split(".")[:2])
    assert (major, minor) == (1, 3), f"hydra-core {hydra.__version__}: pyproject.toml allows 1.3 only"
