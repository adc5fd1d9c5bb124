"""`advbench.Model` and `advbench.Metric`: a model or a metric object with what advbench cannot see in it, said in one place.

Light on purpose (no torch at import): `advbench.api` re-exports it, and looking up `advbench.evaluate`
must cost no more than `import torch` (`tests/test_startup.py`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import nn


@dataclass(frozen=True)
class Model:
    """A model object with what advbench cannot see in it: how its input is normalised, whether it is
    random, its classes and its name, so that `evaluate(Model(net, mean=[0.5], std=[0.5]))` says all
    of it in one place (a bare `nn.Module` is `Model(net)`).

    `net`: any `nn.Module` from NCHW floats in [0, 1] to logits; `mean`/`std`: the per-channel
    normalisation put in front of it, for a network that expects normalised input; `randomized=True`:
    a stochastic model, judged by a vote, its dropout kept active and its gradients EOT means over
    `eot_samples` passes (default 10); `num_classes`: its classes where the data's labels do not
    show them all (default: its logits tell); `label`: its row's name in records, tables and figures
    (default: its class name).
    """

    net: nn.Module
    mean: Sequence[float] | None = None
    std: Sequence[float] | None = None
    randomized: bool = False
    eot_samples: int | None = None
    num_classes: int | None = None
    label: str | None = None


@dataclass(frozen=True)
class Metric:
    """A quality metric object with what advbench cannot see in it, so that
    `evaluate_metric(Metric(net, higher_better=False, score_range=(0, 100)), images)` says it in one
    place (a bare `nn.Module` is `Metric(net)`).

    `net`: any `nn.Module` from NCHW images in [0, 1] to one score per image, (N,); `higher_better`:
    whether a higher score means a better image (the attacks push scores that way); `score_range`:
    its scores' [low, high], recorded beside them (None: unknown); `label`: the records' metric name
    (default: its class name).
    """

    net: nn.Module
    higher_better: bool = True
    score_range: Sequence[float] | None = None
    label: str | None = None
