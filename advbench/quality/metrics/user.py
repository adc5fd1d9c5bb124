"""Metrics users bring: their own `nn.Module` from images to one score each, attacked like a shipped one.

From Python, `advbench.evaluate_metric(net, images, higher_better=...)` wraps the object in a
`UserMetric`; on the command line, `metric=python metric.target=<file.py>:<attr>`
(`conf/metric/python.yaml`) builds a `PythonMetric`, importing the class or factory as
`model=python` does (`advbench.core.user_code`) and loading `metric.weights`, a state dict,
key by key (`advbench.core.torchfile.load_state_file`). Either way the network's parameters
are frozen (only the input's gradient is wanted) and its code, weights and behaviour key the
cells (`user_identity`): an edited `forward` or helper module, another state dict, a flag that
changes its scores at run time or the other direction is another cell.

A user's metric has no published range; without `score_range` the records say NaN for it,
and the attacks read its raw scores (their step sizes do not depend on the scale: sign steps,
Adam, MADC's relative steps).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from advbench.core.digests import code_digest
from advbench.core.errors import AdvbenchError
from advbench.core.fingerprint import behaviour_digest
from advbench.core.keys import plain_value
from advbench.core.torchfile import load_state_file
from advbench.core.user_code import build_user_module, source_digest
from advbench.quality.metrics.author_weights import expand
from advbench.quality.metrics.metric_contract import QualityMetric, check_images


class UserMetric(QualityMetric):
    """A user's network in the metric contract: (N, 3, H, W) in [0, 1] -> (N,) scores.

    `source`: what else than the network's own classes decides its scores (the digest of the
    file a command-line target is in), added to the cell key with `code_digest` (its classes'
    files and the user's modules they import).
    """

    def __init__(self, net: nn.Module, name: str, higher_better: Any, score_range: Sequence[float] | None = None,
                 source: Mapping[str, str] | None = None, key: str = "higher_better") -> None:
        super().__init__()
        if not isinstance(higher_better, bool):
            raise AdvbenchError(f"{key} must be true or false (does a higher score mean a better image?), "
                                f"got {higher_better!r}")
        self.net = net.requires_grad_(False)
        self.name = name
        self.higher_better = higher_better
        self.range_known = score_range is not None
        self.score_range = checked_range(score_range, key.replace("higher_better", "score_range"))
        self._source = dict(source or {})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_images(x, self.name)
        return self.net(x)

    def code_identity(self) -> dict[str, Any]:
        return {"code_sha256": code_digest(self.net), **self._source}


def user_identity(metric: QualityMetric, images: torch.Tensor) -> dict[str, str]:
    """The cell key's entries for a metric's own code: its `code_identity` and, for a user's metric
    (one that has any), its behaviour on two probe images of the cell's size (`core.fingerprint`),
    since a flag set at run time or a value in a closure changes its scores and none of its files.
    None for advbench's metrics, whose code is the release's."""
    code = metric.code_identity()
    if not code:
        return {}
    what = f"metric '{getattr(metric, 'name', type(metric).__name__)}'"
    return {**code, "behaviour_sha256": behaviour_digest(metric, tuple(images.shape[1:]), what, samples=2)}


def checked_range(score_range: Any, key: str) -> tuple[float, float]:
    """Two finite numbers, low < high; None (unknown) stands as (0, 1), a scale of one for the attacks."""
    if score_range is None:
        return (0.0, 1.0)
    values = plain_value(score_range)
    numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)] \
        if isinstance(values, list) else []
    if len(numbers) != 2 or len(values) != 2 or not all(math.isfinite(v) for v in numbers) or not numbers[0] < numbers[1]:
        raise AdvbenchError(f"{key} must be [low, high], two finite numbers with low < high, or null; got {score_range!r}")
    return (float(numbers[0]), float(numbers[1]))


class PythonMetric(UserMetric):
    """`metric=python`: the user's class or factory (`metric.target`, `metric.kwargs`), with
    `metric.weights` (a state dict file; null: the network's own) loaded into it.

    `labels` are the option's keys that name it (`label`), which the builder ignores.
    """

    def __init__(self, target: str | None = None, kwargs: Mapping[str, Any] | None = None, weights: str | None = None,
                 higher_better: bool | None = None, score_range: list[float] | None = None, name: str = "python",
                 **labels: Any) -> None:
        if target is None:
            raise AdvbenchError("metric=python needs metric.target=<module>:<attr> or <path/to/file.py>:<attr>")
        if higher_better is None:
            raise AdvbenchError("metric=python needs metric.higher_better=true or false: whether a higher score "
                                "means a better image (the attacks push scores that way)")
        options = plain_value(kwargs) or {}
        if not isinstance(options, dict):
            raise AdvbenchError(f"metric.kwargs must be a mapping of keyword arguments, got {options!r}")
        net = build_user_module(target, options, "metric")
        if weights is not None:
            load_state_file(expand(weights), net, "metric.weights file")
        super().__init__(net, name, higher_better, score_range, source_digest(target), key="metric.higher_better")
