"""The metric catalogue is `conf/metric/*.yaml`: one file per option, `_target_` names the class.

Adding a metric is adding a YAML file; nothing here needs editing. Classes are imported
lazily from the dotted `_target_` path, so building one metric never imports the others
(nor their optional dependencies). Here a metric is built from its resolved config, plain
data; by option name (the YAML's `${advbench:weights}` folders resolved) it is
`advbench.cli.metrics.build_metric`.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from advbench.core.catalog import group_options
from advbench.core.construct import target_of
from advbench.core.errors import AdvbenchError
from advbench.core.keys import plain
from advbench.quality.metrics.metric_contract import QualityMetric

GROUP = "metric"


def available_metrics() -> list[str]:
    """Option names of the metric group (YAML file stems)."""
    return group_options(GROUP)


def build_metric(spec: Mapping[str, Any], **overrides: Any) -> QualityMetric:
    """Build a metric from its resolved config (`_target_` and the class's arguments), plus keyword overrides.

    Example: `build_metric({"_target_": "advbench.quality.metrics.nima.NIMA", "weights": None})`
    gives a random-init NIMA for tests.
    """
    params = {**plain(spec), **overrides}
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
