"""The metric catalogue is `conf/metric/*.yaml`: one file per option, `_target_` names the class.

Adding a metric is adding a YAML file; nothing here needs editing. Classes are imported
lazily from the dotted `_target_` path, so building one metric never imports the others
(nor their optional dependencies).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from advbench.core.catalog import group_options, load_option
from advbench.core.errors import AdvbenchError
from advbench.quality.metrics.base import QualityMetric

GROUP = "metric"


def available_metrics() -> list[str]:
    """Option names of the metric group (YAML file stems)."""
    return group_options(GROUP)


def metric_config(name: str) -> DictConfig:
    """The shipped YAML of one metric option, unresolved."""
    options = available_metrics()
    if name not in options:
        raise AdvbenchError(f"unknown metric '{name}'; valid: {', '.join(options)}")
    return load_option(GROUP, name)


def import_target(path: str) -> type:
    """`package.module.Class` -> the class, imported on demand."""
    module_name, _, attr = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError):
        raise AdvbenchError(f"metric _target_ '{path}' cannot be imported") from None


def build_metric(cfg: str | Mapping[str, Any] | DictConfig, **overrides: Any) -> QualityMetric:
    """Build a metric from its option name or config node (`cfg.metric`), plus keyword overrides.

    Example: `build_metric("nima", weights=None)` gives a random-init NIMA for tests.
    """
    node = metric_config(cfg) if isinstance(cfg, str) else cfg
    try:
        merged = OmegaConf.merge(node, overrides) if overrides else node
        params = OmegaConf.to_container(merged, resolve=True) if isinstance(merged, DictConfig) else dict(merged)
    except OmegaConfBaseException as exc:
        raise AdvbenchError(f"metric config: {str(exc).splitlines()[0]}") from None
    target = params.pop("_target_", None)
    if not isinstance(target, str):
        raise AdvbenchError(f"metric config needs a '_target_' class path, got keys {sorted(params)}")
    cls = import_target(target)
    if not (isinstance(cls, type) and issubclass(cls, QualityMetric)):
        raise AdvbenchError(f"metric _target_ '{target}' is not a QualityMetric")
    try:
        inspect.signature(cls).bind(**params)
    except TypeError as exc:
        raise AdvbenchError(f"metric {cls.__name__}: {exc}") from None
    return cls(**params)
