"""The compositions Hydra repeats, made once.

A composition of `advbench run`'s config takes 0.1–0.2 s, and Hydra makes more than it needs:

* **A single run** is composed twice. Before it runs the job, Hydra composes the whole config
  once only to read `hydra.mode` from it (whether the command line or a config file turned the
  run into a sweep), then composes it again to run. No config this project ships sets
  `hydra.mode` (`tests/test_compositions.py` reads them all to check), so
  `mode_from_command_line` answers from the command line instead, and leaves the question to
  Hydra where the answer could come from elsewhere: `hydra.mode` or `hydra.searchpath` (the
  user's own config folders) among the overrides, or a flag naming another config or folder.
* **A sweep** composes every job of a batch before launching any, so that a job whose config
  cannot compose fails before the others run; its local launcher then composes each job again,
  just before running it: the default benchmark's 32 jobs waited 3–6 s for the repeats.
  `compose_each_job_once` hands the launcher the config the sweeper's check composed. The check
  still composes every job first; under a launcher that composes elsewhere (joblib's workers,
  Slurm) nothing is kept, and its jobs are composed as Hydra does.

Hydra offers no setting for either, and a plugin would have to live in the `hydra_plugins`
namespace package, which Hydra's plugin scan does not find in an editable install. So the one
method that composes for each (`Hydra.get_mode`, `ConfigLoaderImpl.load_sweep_config`) is wrapped
for the duration of a command, and left alone where a Hydra release lacks it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from omegaconf import OmegaConf

LOCAL_LAUNCHER = "hydra._internal.core_plugins.basic_launcher.BasicLauncher"
"""Hydra's launcher that runs the jobs in this process, where the kept configs are taken back."""

KEPT_JOBS = 256
"""The most composed configs kept for their launch at once (one of `advbench run`'s holds about
400 kB of objects, so at most about 100 MB): the jobs of a longer batch beyond these are
composed again, as Hydra does."""


@contextlib.contextmanager
def compose_each_job_once() -> Iterator[None]:
    """While open, composing a sweep job a second time with the same master config and overrides
    returns what the first composition made (once: a third composes anew), where the master
    config's launcher runs the jobs in this process."""
    try:
        from hydra._internal.config_loader_impl import ConfigLoaderImpl
        compose = ConfigLoaderImpl.load_sweep_config
    except (ImportError, AttributeError):  # a Hydra release without that method: its own two compositions
        yield
        return
    kept: dict[tuple[int, int, tuple[str, ...]], Any] = {}

    def load_sweep_config(loader: Any, master_config: Any, sweep_overrides: Sequence[str]) -> Any:
        key = (id(loader), id(master_config), tuple(sweep_overrides))
        if key in kept:
            return kept.pop(key)
        cfg = compose(loader, master_config, list(sweep_overrides))
        if len(kept) < KEPT_JOBS and OmegaConf.select(master_config, "hydra.launcher._target_") == LOCAL_LAUNCHER:
            kept[key] = cfg
        return cfg

    ConfigLoaderImpl.load_sweep_config = load_sweep_config  # type: ignore[method-assign]
    try:
        yield
    finally:
        ConfigLoaderImpl.load_sweep_config = compose  # type: ignore[method-assign]


MODE_KEYS = ("hydra.mode", "hydra.searchpath")
"""Overrides through which a run's mode can come from elsewhere than this project's configs: the
mode itself, or config folders of the user's that may set it."""

OWN_COMPOSITION_FLAGS = {"--config-name", "-cn", "--config-dir", "-cd", "--package", "-p", "--info", "-i",
                         "--hydra-help", "--experimental-rerun"}
"""Flags after which the config Hydra runs is not the one this project composes (another primary
config or folder), or nothing runs at all: Hydra composes for itself, its mode included."""


@contextlib.contextmanager
def mode_from_command_line(flags: Iterable[str], overrides: Sequence[str]) -> Iterator[None]:
    """While open, Hydra's `get_mode` answers "not set" (a run, or a sweep under `-m`) without
    composing, unless an override in `MODE_KEYS` or one of `OWN_COMPOSITION_FLAGS` among `flags`
    (another primary config or config folder) could set the mode."""
    try:
        from hydra._internal.hydra import Hydra
        get_mode = Hydra.get_mode
    except (ImportError, AttributeError):  # a Hydra release without that method: its own composition
        yield
        return
    if set(flags) & OWN_COMPOSITION_FLAGS or any(_key(o).startswith(MODE_KEYS) for o in overrides):
        yield
        return
    Hydra.get_mode = lambda hydra, config_name, overrides: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        Hydra.get_mode = get_mode  # type: ignore[method-assign]


def _key(override: str) -> str:
    """The key an override sets: `hydra.mode` of `++hydra.mode=RUN`, `hydra.launcher` of `hydra/launcher=joblib`."""
    return override.lstrip("+~").partition("=")[0].replace("/", ".")


@contextlib.contextmanager
def composed_once(flags: Iterable[str], overrides: Sequence[str]) -> Iterator[None]:
    """Both, for one command: `mode_from_command_line` and `compose_each_job_once`."""
    with mode_from_command_line(flags, overrides), compose_each_job_once():
        yield
