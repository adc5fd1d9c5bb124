"""SPAQ baseline (Fang et al., CVPR 2020): ResNet-50 regressing quality on smartphone photos.

Replica of `Baseline` + `Image_load` from h4nwei/SPAQ (`BL_demo.py`): the image is resized so
its shorter side is 512, cut into 224x224 patches with stride 112 (plus the patches flush with
the right/bottom edge), each patch is scored by a ResNet-50 whose `fc` outputs one number, and
the image score is the patch mean. Inputs are plain `ToTensor` values (no normalisation).
Checkpoint `BL_release.pt`: state dict under `state_dict`, keys `backbone.*`.
"""

from __future__ import annotations

import torch
import torchvision
from torch import nn

from advbench.core.errors import AdvbenchError
from advbench.quality.metrics.author_weights import WeightFile
from advbench.quality.metrics.common import (
    PretrainedMetric,
    WeightPath,
    resize_short_side,
)


def patch_starts(length: int, patch: int, stride: int) -> list[int]:
    """Top/left offsets of the authors' patch grid along one axis (last patch flush with the end)."""
    starts = list(range(0, length - patch + 1, stride))
    if starts[-1] != length - patch:
        starts.append(length - patch)
    return starts


class Baseline(nn.Module):
    """The authors' `Baseline`: torchvision ResNet-50 with a 1-output `fc`."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = torchvision.models.resnet50(weights=None)
        self.backbone.fc = nn.Linear(self.backbone.fc.in_features, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.backbone(x).squeeze(1)


class SPAQ(PretrainedMetric):
    """SPAQ baseline score on the SPAQ MOS scale (0-100, higher is better)."""

    higher_better = True
    score_range = (0.0, 100.0)
    input_size = None

    def __init__(
        self,
        weights: WeightPath = None,
        short_side: int = 512,
        patch_size: int = 224,
        patch_stride: int = 112,
        name: str = "spaq",
    ) -> None:
        super().__init__(name)
        if short_side < patch_size:
            raise AdvbenchError(f"{name}: short_side must be >= patch_size ({patch_size}), got {short_side}")
        self.short_side = int(short_side)
        self.patch_size = int(patch_size)
        self.patch_stride = int(patch_stride)
        self.net = Baseline()
        self.load_weights(weights=weights)

    def weight_files(self) -> dict[str, WeightFile]:
        return {"weights": WeightFile(self.net, "BL_release.pt of h4nwei/SPAQ", container="state_dict")}

    def patches(self, x: torch.Tensor) -> torch.Tensor:
        """(N, 3, H, W) -> (N, P, 3, patch, patch) on the resized image."""
        x = resize_short_side(x, self.short_side)
        h, w = x.shape[-2:]
        p = self.patch_size
        crops = [x[:, :, top:top + p, left:left + p]
                 for top in patch_starts(h, p, self.patch_stride)
                 for left in patch_starts(w, p, self.patch_stride)]
        return torch.stack(crops, dim=1)

    def score(self, x: torch.Tensor) -> torch.Tensor:
        patches = self.patches(x)
        n, count = patches.shape[:2]
        return self.net(patches.flatten(0, 1)).view(n, count).mean(dim=1)
