"""The metric catalogue is `conf/metric/*.yaml`: one file per option, its `_target_` the class.

Adding a metric is adding a YAML file; nothing here needs editing. The command line reads the
option and builds the metric (`advbench.cli.metrics.build_metric`, the class imported lazily
from its path, so building one metric never imports the others nor their optional dependencies);
this half takes the built object.
"""

from __future__ import annotations

from advbench.core.catalog import group_options

GROUP = "metric"


def available_metrics() -> list[str]:
    """Option names of the metric group (YAML file stems)."""
    return group_options(GROUP)
