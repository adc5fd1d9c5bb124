"""PaQ-2-PiQ (Ying et al., CVPR 2020): ResNet-18 body, RoI pooling, regression head.

Replica of `RoIPoolModel` from the authors' standalone package (baidut/paq2piq): the image
score is the head's output on the RoI covering the whole image. Inputs are used as `ToTensor`
gives them, in [0, 1] at native resolution; the authors apply no mean/std normalisation.
Checkpoint: `RoIPoolModel-fit.10.bs.120.pth`, state dict under `model`, keys `body.*`, `head.*`.
"""

from __future__ import annotations

import torch
from torch import nn
from torchvision.ops import roi_pool

from advbench.quality.metrics.author_weights import WeightFile
from advbench.quality.metrics.common import PretrainedMetric, WeightPath, resnet_trunk


class AdaptiveConcatPool2d(nn.Module):
    """fastai's pooling: [global max, global average] on channels."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x.amax(dim=(-2, -1), keepdim=True), x.mean(dim=(-2, -1), keepdim=True)], dim=1)


class RoIPoolModel(nn.Module):
    """The authors' network; `body` and `head` indices match their checkpoint."""

    pool_size = (2, 2)
    spatial_scale = 1 / 32

    def __init__(self) -> None:
        super().__init__()
        self.body = resnet_trunk("resnet18", "paq2piq")
        self.head = nn.Sequential(
            AdaptiveConcatPool2d(),
            nn.Flatten(),
            nn.BatchNorm1d(1024),
            nn.Dropout(p=0.25),
            nn.Linear(1024, 512),
            nn.ReLU(inplace=True),
            nn.BatchNorm1d(512),
            nn.Dropout(p=0.5),
            nn.Linear(512, 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feats = self.body(x)
        n, _, h, w = x.shape
        # One RoI per image, [batch index, x1, y1, x2, y2] in input pixels: the whole picture.
        box = torch.tensor([0.0, 0.0, float(w), float(h)], device=x.device, dtype=feats.dtype)
        idx = torch.arange(n, device=x.device, dtype=feats.dtype).unsqueeze(1)
        rois = torch.cat([idx, box.expand(n, 4)], dim=1)
        pooled = roi_pool(feats, rois, output_size=self.pool_size, spatial_scale=self.spatial_scale)
        return self.head(pooled).view(n)


class PaQ2PiQ(PretrainedMetric):
    """Global PaQ-2-PiQ score on the LIVE-FB MOS scale (about 0-100, higher is better)."""

    higher_better = True
    score_range = (0.0, 100.0)
    input_size = None

    def __init__(self, weights: WeightPath = None, name: str = "paq2piq") -> None:
        super().__init__(name)
        self.net = RoIPoolModel()
        self.load_weights(weights=weights)

    def weight_files(self) -> dict[str, WeightFile]:
        return {"weights": WeightFile(self.net, "RoIPoolModel-fit.10.bs.120.pth of baidut/paq2piq", container="model")}

    def score(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)
