"""Quality metrics by option name: the shipped `conf/metric/<name>.yaml`, its folders resolved, built.

The option files hold `${advbench:weights}` and `${advbench:cache}` folders, which only the
command line resolves (`advbench.cli.options`), and its `_target_`, which only the command line reads
(`advbench.cli.option_targets`); the quality half takes the built metric. This is the way in for the
`uap` and `iqa` commands and for Python users: `build_metric("nima", weights=None)`.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from advbench.cli.option_targets import target_of
from advbench.cli.options import load_option
from advbench.core.catalog import group_options
from advbench.core.errors import AdvbenchError

if TYPE_CHECKING:
    from advbench.quality.metrics.metric_contract import QualityMetric

GROUP = "metric"


def metric_config(name: str) -> DictConfig:
    """The shipped YAML of one metric option, unresolved."""
    options = group_options(GROUP)
    node = load_option(GROUP, name) if name in options else None
    if node is None:
        raise AdvbenchError(f"unknown metric '{name}'; valid: {', '.join(options)}")
    return node


def metric_spec(cfg: str | Mapping[str, Any], **overrides: Any) -> dict[str, Any]:
    """A metric's config as plain, resolved data: an option name or a config node, keyword overrides on top."""
    node = metric_config(cfg) if isinstance(cfg, str) else cfg
    try:
        merged = OmegaConf.merge(node, overrides) if overrides else node
        spec = OmegaConf.to_container(merged, resolve=True) if isinstance(merged, DictConfig) else dict(merged)
    except OmegaConfBaseException as exc:
        raise AdvbenchError(f"metric config: {str(exc).splitlines()[0]}") from None
    return spec


def build_metric(cfg: str | Mapping[str, Any], **overrides: Any) -> QualityMetric:
    """Build a metric from its option name or config node (`cfg.metric`), plus keyword overrides: the
    class its `_target_` names with the other keys as arguments.

    Example: `build_metric("nima", weights=None)` gives a random-init NIMA for tests.
    """
    from advbench.quality.metrics.metric_contract import QualityMetric  # imports torch: only when building

    params = metric_spec(cfg, **overrides)
    target = params.pop("_target_", None)
    if not isinstance(target, str):
        raise AdvbenchError(f"metric config needs a '_target_' class path, got keys {sorted(params)}")
    try:
        cls = target_of(target)
    except AdvbenchError:
        raise AdvbenchError(f"metric _target_ '{target}' cannot be imported") from None
    if not (isinstance(cls, type) and issubclass(cls, QualityMetric)):
        raise AdvbenchError(f"metric _target_ '{target}' is not a QualityMetric")
    try:
        inspect.signature(cls).bind(**params)
    except TypeError as exc:
        raise AdvbenchError(f"metric {cls.__name__}: {exc}") from None
    return cls(**params)
