"""KonCept512 (Hosu et al., IEEE TIP 2020) as released for PyTorch (ZhengyuZhao/koniq-PyTorch).

The seed paper uses this port: Inception-ResNet-v2 features (ImageNet, Cadene layout) and a
4-layer MLP head with BatchNorm and dropout, trained on KonIQ-10k at 512x384 with inputs
normalised by mean = std = 0.5. Checkpoint: a plain state dict with keys `base.*`, `fc.*`.
"""

from __future__ import annotations

import torch
from torch import nn

from advbench.quality.metrics.author_weights import WeightFile
from advbench.quality.metrics.common import (
    Normalize,
    PretrainedMetric,
    WeightPath,
    resize,
)
from advbench.quality.metrics.inception_resnet_v2 import inception_resnet_v2_features


class KonCeptNet(nn.Module):
    """The authors' `model_qa(num_classes=1)`."""

    def __init__(self) -> None:
        super().__init__()
        self.base = inception_resnet_v2_features()
        self.fc = nn.Sequential(
            nn.Linear(1536, 2048), nn.ReLU(inplace=True), nn.BatchNorm1d(2048), nn.Dropout(p=0.25),
            nn.Linear(2048, 1024), nn.ReLU(inplace=True), nn.BatchNorm1d(1024), nn.Dropout(p=0.25),
            nn.Linear(1024, 256), nn.ReLU(inplace=True), nn.BatchNorm1d(256), nn.Dropout(p=0.5),
            nn.Linear(256, 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.base(x).flatten(1)).squeeze(1)


class KonCept512(PretrainedMetric):
    """KonCept512 score on the KonIQ-10k MOS scale (0-100, higher is better)."""

    higher_better = True
    score_range = (0.0, 100.0)
    input_size = (384, 512)

    def __init__(self, weights: WeightPath = None, name: str = "koncept") -> None:
        super().__init__(name)
        self.normalize = Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
        self.net = KonCeptNet()
        self.load_weights(weights=weights)

    def weight_files(self) -> dict[str, WeightFile]:
        return {"weights": WeightFile(self.net, "the KonCept512 state dict of ZhengyuZhao/koniq-PyTorch")}

    def score(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(self.normalize(resize(x, self.input_size)))
