"""The cell of the quality half's Python API, built from its Python values: where `advbench.evaluate_metric`
meets `advbench iqa run`'s options.

The API names options (the attack, and `metric=python` for the caller's module) and gives values (the
budgets, seed, device, folders, image count and size, judges, the attack's parameters) as Python objects;
this assembles the config `advbench iqa run` would compose from them as plain data (`cli.choices`, Hydra
only where its composition is needed, its values never written into override strings) and runs the
command line's job on it, so its options, defaults and checks are the command line's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from advbench.cli.choices import api_config
from advbench.cli.quality_tasks import iqa_job

IQA_PRIMARY = "iqa"
"""`advbench iqa run`'s primary config (`conf/iqa/iqa.yaml`)."""


def metric_part(choices: Mapping[str, str], values: Mapping[str, Any], overrides: Sequence[str] = (), *,
                metric: Any, name: str, given: Any = None) -> Any:
    """The part `advbench.evaluate_metric` writes: `advbench iqa run`'s cell of options `choices`
    (`{"metric": "python", "attack": "ifgsm"}`) with `values` (`{"eps": [0.004], "attack.params.steps": 5,
    ...}`) and the caller's `overrides` on top, scoring the built `metric` under the records' `name` on the
    images `given` (None: the config's `data`). The part's path."""
    return iqa_job(api_config(choices, values, overrides, primary=IQA_PRIMARY), metric, name, given)
