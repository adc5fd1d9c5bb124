"""LinearityIQA (Li, Jiang & Jiang, ACM MM 2020, "Norm-in-Norm loss").

Replica of `IQAModel` from lidq92/LinearityIQA with the released settings (`p1q2.pth`:
ResNeXt-101 32x8d, average pooling, P6 = P7 = 1, no end BatchNorm, KonIQ-10k at 498x664).
Features of stages 6 (layer3) and 7 (layer4) are pooled, reduced to 64-d each and regressed
together; the overall output is linearly re-scaled with `k[0]`, `b[0]` stored in the checkpoint,
as the authors' `IQAPerformance.linear_mapping(..., i=0)` and fixed test demo do (`k[1]`, `b[1]`
and `k[2]`, `b[2]` map the stage-wise side outputs). Checkpoint: `{'model': state_dict, 'k': [..],
'b': [..]}`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from advbench.core.errors import AdvbenchError
from advbench.quality.metrics.author_weights import WeightFile, expand
from advbench.quality.metrics.common import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    Normalize,
    PretrainedMetric,
    WeightPath,
    resize,
    resnet_trunk,
    stage_channels,
)


def _reduction(in_features: int) -> nn.Sequential:
    """`dr6` / `dr7`: 3 linear layers with BatchNorm down to 64-d, ReLU at the end."""
    return nn.Sequential(
        nn.Linear(in_features, 1024), nn.BatchNorm1d(1024),
        nn.Linear(1024, 256), nn.BatchNorm1d(256),
        nn.Linear(256, 64), nn.BatchNorm1d(64), nn.ReLU(),
    )


class IQAModel(nn.Module):
    """The authors' network; attribute names match their checkpoint keys."""

    def __init__(self, arch: str) -> None:
        super().__init__()
        self.features = resnet_trunk(arch, "linearity")
        c6, c7 = stage_channels(self.features[6]), stage_channels(self.features[7])
        self.dr6 = _reduction(c6)
        self.dr7 = _reduction(c7)
        self.regr6 = nn.Linear(64, 1)
        self.regr7 = nn.Linear(64, 1)
        self.regression = nn.Linear(64 * 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Overall (pre-mapping) quality; the stage-wise `regr6`/`regr7` outputs are training aids."""
        x6 = self.features[:7](x)
        x7 = self.features[7](x6)
        f6 = self.dr6(x6.mean(dim=(-2, -1)))
        f7 = self.dr7(x7.mean(dim=(-2, -1)))
        return self.regression(torch.cat([f6, f7], dim=1)).squeeze(1)


class Linearity(PretrainedMetric):
    """LinearityIQA score on the KonIQ-10k MOS scale (0-100, higher is better)."""

    higher_better = True
    score_range = (0.0, 100.0)

    def __init__(
        self,
        weights: WeightPath = None,
        arch: str = "resnext101_32x8d",
        resize_to: tuple[int, int] | None = (498, 664),
        name: str = "linearity",
    ) -> None:
        super().__init__(name)
        self.input_size = tuple(resize_to) if resize_to is not None else None
        self.normalize = Normalize(IMAGENET_MEAN, IMAGENET_STD)
        self.net = IQAModel(arch)
        # Linear re-scaling of the overall output fitted on the training set (k[0], b[0]).
        self.register_buffer("k", torch.tensor(1.0))
        self.register_buffer("b", torch.tensor(0.0))
        loaded = self.load_weights(weights=weights)
        if "weights" in loaded:
            self._set_mapping(loaded["weights"], weights)

    def weight_files(self) -> dict[str, WeightFile]:
        return {"weights": WeightFile(self.net, "p1q2.pth of lidq92/LinearityIQA", container="model")}

    def _set_mapping(self, checkpoint: Any, path: WeightPath) -> None:
        try:
            k, b = float(checkpoint["k"][0]), float(checkpoint["b"][0])
        except (KeyError, IndexError, TypeError, ValueError):
            raise AdvbenchError(
                f"{self.name}: '{expand(path)}' lacks the linear mapping; expected keys 'k' and 'b' "
                "(lists of floats) next to 'model', as the authors save them"
            ) from None
        self.k.fill_(k)
        self.b.fill_(b)

    def score(self, x: torch.Tensor) -> torch.Tensor:
        if self.input_size is not None:
            x = resize(x, self.input_size)
        return self.net(self.normalize(x)) * self.k + self.b
