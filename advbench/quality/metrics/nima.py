"""NIMA (Talebi & Milanfar, IEEE TIP 2018) as the seed paper used it: truskovskiyk/nima.pytorch v1.

That release puts the NIMA head (ReLU, dropout 0.75, linear to 10 bins, softmax) on a
MobileNetV2 in the module layout of tonylins/pytorch-mobilenet-v2 (not torchvision's: every
inverted residual has an expansion conv, the first included), trained on AVA. Images are
resized to 224x224 and ImageNet-normalised; the score is the mean of the predicted rating
distribution over 1..10. Checkpoint `pretrain-model.pth`: plain state dict, keys
`base_model.0.<layer>...` and `head.2.*`.
"""

from __future__ import annotations

import torch
from torch import nn

from advbench.quality.metrics.author_weights import WeightFile
from advbench.quality.metrics.common import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    Normalize,
    PretrainedMetric,
    WeightPath,
    resize,
)

# (expansion t, output channels c, repeats n, first stride s), MobileNetV2 Table 2.
_INVERTED_RESIDUALS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                       (6, 160, 3, 2), (6, 320, 1, 1))


def _conv_bn(cin: int, cout: int, kernel: int, stride: int, groups: int = 1, act: type[nn.Module] | None = nn.ReLU6
             ) -> list[nn.Module]:
    layers: list[nn.Module] = [nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False),
                               nn.BatchNorm2d(cout)]
    return layers + ([act(inplace=True)] if act is not None else [])


class InvertedResidual(nn.Module):
    """1x1 expand -> 3x3 depthwise -> 1x1 linear projection, identity shortcut when shapes allow."""

    def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = cin * expand
        self.use_res_connect = stride == 1 and cin == cout
        self.conv = nn.Sequential(
            *_conv_bn(cin, hidden, 1, 1),
            *_conv_bn(hidden, hidden, 3, stride, groups=hidden),
            *_conv_bn(hidden, cout, 1, 1, act=None),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv(x)
        return x + out if self.use_res_connect else out


def mobilenet_v2_features() -> nn.Sequential:
    """`features` of the reference MobileNetV2: stem, 17 blocks, 1x1 conv to 1280, AvgPool(7) for 224 input."""
    layers: list[nn.Module] = [nn.Sequential(*_conv_bn(3, 32, 3, 2, act=nn.ReLU))]
    cin = 32
    for t, c, n, s in _INVERTED_RESIDUALS:
        for i in range(n):
            layers.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
            cin = c
    layers.append(nn.Sequential(*_conv_bn(cin, 1280, 1, 1, act=nn.ReLU)))
    layers.append(nn.AvgPool2d(7))
    return nn.Sequential(*layers)


class NIMANet(nn.Module):
    """The authors' `NIMA` module: `base_model` = Sequential(features), `head` -> 10-bin softmax."""

    def __init__(self) -> None:
        super().__init__()
        self.base_model = nn.Sequential(mobilenet_v2_features())
        self.head = nn.Sequential(nn.ReLU(inplace=True), nn.Dropout(p=0.75), nn.Linear(1280, 10), nn.Softmax(dim=1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.base_model(x).flatten(1))


class NIMA(PretrainedMetric):
    """Mean opinion of the predicted AVA rating distribution (1-10, higher is better)."""

    higher_better = True
    score_range = (1.0, 10.0)
    input_size = (224, 224)

    def __init__(self, weights: WeightPath = None, name: str = "nima") -> None:
        super().__init__(name)
        self.normalize = Normalize(IMAGENET_MEAN, IMAGENET_STD)
        self.net = NIMANet()
        self.register_buffer("buckets", torch.arange(1.0, 11.0), persistent=False)
        self.load_weights(weights=weights)

    def weight_files(self) -> dict[str, WeightFile]:
        return {"weights": WeightFile(self.net, "pretrain-model.pth of truskovskiyk/nima.pytorch v1")}

    def score(self, x: torch.Tensor) -> torch.Tensor:
        probs = self.net(self.normalize(resize(x, self.input_size)))
        return probs @ self.buckets
