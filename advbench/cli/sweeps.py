"""One composition per sweep job, where Hydra makes two.

Hydra's sweeper composes every job of a batch before launching any, so that a job whose config
cannot compose fails before the others run; its local launcher then composes each job again,
just before running it. A composition of `advbench run`'s config takes 0.1–0.2 s, so the
default benchmark's 32 jobs waited 3–6 s for the repeats before the first cell began.
`compose_each_job_once` hands the launcher the config the sweeper's check composed. The check
still composes every job first; under a launcher that composes elsewhere (joblib's workers,
Slurm) nothing is kept, and its jobs are composed as Hydra does.

Hydra offers no setting for this, and a sweeper plugin would have to live in the
`hydra_plugins` namespace package, which Hydra's plugin scan does not find in an editable
install. So the one method that composes a job (`ConfigLoaderImpl.load_sweep_config`) is
wrapped for the duration of a command, and left alone where a Hydra release lacks it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
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
