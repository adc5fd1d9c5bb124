"""Inception-ResNet-v2 (Szegedy et al., 2017) in the module layout of Cadene's `pretrainedmodels`.

torchvision does not ship this network. KonCept512's PyTorch release builds its backbone from
`pretrainedmodels.inceptionresnetv2` as `nn.Sequential(*children()[:-1])`, so the checkpoint
keys are `<index>.<branch path>`; this file reproduces that structure (module order, branch
names, BatchNorm eps = 0.001, residual scales 0.17 / 0.10 / 0.20) without the package.
"""

from __future__ import annotations

import torch
from torch import nn


class BasicConv2d(nn.Module):
    """Conv (no bias) -> BatchNorm(eps=1e-3) -> ReLU, the TensorFlow-ported unit."""

    def __init__(self, cin: int, cout: int, kernel_size: int | tuple[int, int], stride: int = 1,
                 padding: int | tuple[int, int] = 0) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel_size, stride=stride, padding=padding, bias=False)
        self.bn = nn.BatchNorm2d(cout, eps=0.001)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.bn(self.conv(x)))


def _chain(*layers: nn.Module) -> nn.Module:
    """One layer as is, several as an nn.Sequential (how the reference nests its branches)."""
    return layers[0] if len(layers) == 1 else nn.Sequential(*layers)


class Branches(nn.Module):
    """Parallel branches `branch0..k` concatenated on channels (Mixed_5b, Mixed_6a, Mixed_7a)."""

    def __init__(self, *branches: nn.Module) -> None:
        super().__init__()
        self.n_branches = len(branches)
        for i, branch in enumerate(branches):
            self.add_module(f"branch{i}", branch)

    def concat(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([getattr(self, f"branch{i}")(x) for i in range(self.n_branches)], dim=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.concat(x)


class ResidualBranches(Branches):
    """Block35 / Block17 / Block8: branches -> 1x1 `conv2d` -> x + scale * out (-> ReLU)."""

    def __init__(self, channels: int, branches: list[nn.Module], concat_channels: int, scale: float,
                 relu: bool = True) -> None:
        super().__init__(*branches)
        self.scale = scale
        self.conv2d = nn.Conv2d(concat_channels, channels, kernel_size=1)
        self.relu = nn.ReLU() if relu else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(x + self.scale * self.conv2d(self.concat(x)))


def mixed_5b() -> Branches:
    return Branches(
        BasicConv2d(192, 96, 1),
        _chain(BasicConv2d(192, 48, 1), BasicConv2d(48, 64, 5, padding=2)),
        _chain(BasicConv2d(192, 64, 1), BasicConv2d(64, 96, 3, padding=1), BasicConv2d(96, 96, 3, padding=1)),
        _chain(nn.AvgPool2d(3, stride=1, padding=1, count_include_pad=False), BasicConv2d(192, 64, 1)),
    )


def block35(scale: float = 0.17) -> ResidualBranches:
    return ResidualBranches(320, [
        BasicConv2d(320, 32, 1),
        _chain(BasicConv2d(320, 32, 1), BasicConv2d(32, 32, 3, padding=1)),
        _chain(BasicConv2d(320, 32, 1), BasicConv2d(32, 48, 3, padding=1), BasicConv2d(48, 64, 3, padding=1)),
    ], 128, scale)


def mixed_6a() -> Branches:
    return Branches(
        BasicConv2d(320, 384, 3, stride=2),
        _chain(BasicConv2d(320, 256, 1), BasicConv2d(256, 256, 3, padding=1), BasicConv2d(256, 384, 3, stride=2)),
        nn.MaxPool2d(3, stride=2),
    )


def block17(scale: float = 0.10) -> ResidualBranches:
    return ResidualBranches(1088, [
        BasicConv2d(1088, 192, 1),
        _chain(BasicConv2d(1088, 128, 1), BasicConv2d(128, 160, (1, 7), padding=(0, 3)),
               BasicConv2d(160, 192, (7, 1), padding=(3, 0))),
    ], 384, scale)


def mixed_7a() -> Branches:
    return Branches(
        _chain(BasicConv2d(1088, 256, 1), BasicConv2d(256, 384, 3, stride=2)),
        _chain(BasicConv2d(1088, 256, 1), BasicConv2d(256, 288, 3, stride=2)),
        _chain(BasicConv2d(1088, 256, 1), BasicConv2d(256, 288, 3, padding=1), BasicConv2d(288, 320, 3, stride=2)),
        nn.MaxPool2d(3, stride=2),
    )


def block8(scale: float = 0.20, relu: bool = True) -> ResidualBranches:
    return ResidualBranches(2080, [
        BasicConv2d(2080, 192, 1),
        _chain(BasicConv2d(2080, 192, 1), BasicConv2d(192, 224, (1, 3), padding=(0, 1)),
               BasicConv2d(224, 256, (3, 1), padding=(1, 0))),
    ], 448, scale, relu)


def inception_resnet_v2_features() -> nn.Sequential:
    """Stem to `avgpool_1a` (indices 0..15), i.e. the network without `last_linear`.

    The final pooling is the reference's fixed `AvgPool2d(8)`: on KonCept512's 384x512
    input the last map is 10x14 and the pool averages its top-left 8x8 window to 1x1.
    """
    return nn.Sequential(
        BasicConv2d(3, 32, 3, stride=2),          # 0 conv2d_1a
        BasicConv2d(32, 32, 3),                   # 1 conv2d_2a
        BasicConv2d(32, 64, 3, padding=1),        # 2 conv2d_2b
        nn.MaxPool2d(3, stride=2),                # 3 maxpool_3a
        BasicConv2d(64, 80, 1),                   # 4 conv2d_3b
        BasicConv2d(80, 192, 3),                  # 5 conv2d_4a
        nn.MaxPool2d(3, stride=2),                # 6 maxpool_5a
        mixed_5b(),                               # 7
        nn.Sequential(*(block35() for _ in range(10))),   # 8 repeat
        mixed_6a(),                               # 9
        nn.Sequential(*(block17() for _ in range(20))),   # 10 repeat_1
        mixed_7a(),                               # 11
        nn.Sequential(*(block8() for _ in range(9))),     # 12 repeat_2
        block8(scale=1.0, relu=False),            # 13 block8
        BasicConv2d(2080, 1536, 1),               # 14 conv2d_7b
        nn.AvgPool2d(8, count_include_pad=False),  # 15 avgpool_1a
    )
