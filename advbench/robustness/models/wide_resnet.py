"""WideResNet (Zagoruyko & Komodakis 2016) as used by Madry PGD-AT and TRADES on CIFAR-10.

Pre-activation blocks, depth = 6n + 4; WRN-34-10 has n=5, WRN-28-10 n=4, widen factor 10.
Parameter names follow RobustBench's model zoo (`conv1`, `block{1,2,3}.layer.{i}` with
`bn1, conv1, bn2, conv2, convShortcut`, `bn1`, `fc`; the TRADES-derived checkpoints also hold
an unused `sub_block1`), so its CIFAR-10 state dicts load as they are. Depth and width are
options so tests can build a tiny variant with the same key names.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from advbench.core.errors import AdvbenchError
from advbench.robustness.models.architectures import ARCHITECTURES, CIFAR_MEAN, CIFAR_STD


class _WideBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.bn1 = nn.BatchNorm2d(c_in)
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.convShortcut = nn.Conv2d(c_in, c_out, 1, stride, bias=False) if c_in != c_out else None  # noqa: N815

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pre = F.relu(self.bn1(x))
        out = self.conv2(F.relu(self.bn2(self.conv1(pre))))
        # The projection takes the pre-activated input, as in the reference implementation.
        return out + (x if self.convShortcut is None else self.convShortcut(pre))


class _Group(nn.Module):
    """One stage; the extra `.layer` level is there for the checkpoints' key names."""

    def __init__(self, n: int, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.layer = nn.Sequential(*(_WideBlock(c_in if i == 0 else c_out, c_out, stride if i == 0 else 1) for i in range(n)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)


class WideResNet(nn.Module):
    def __init__(self, depth: int, widen_factor: int, num_classes: int, in_channels: int, sub_block1: bool = False) -> None:
        super().__init__()
        if depth < 10 or (depth - 4) % 6:
            raise AdvbenchError(f"WideResNet depth must be 6n + 4 with n >= 1, got {depth}")
        n = (depth - 4) // 6
        widths = [16, 16 * widen_factor, 32 * widen_factor, 64 * widen_factor]
        self.conv1 = nn.Conv2d(in_channels, widths[0], 3, 1, 1, bias=False)
        self.block1 = _Group(n, widths[0], widths[1], 1)
        if sub_block1:
            # Never used in the forward pass; present only so such checkpoints load without edits.
            self.sub_block1 = _Group(n, widths[0], widths[1], 1)
        self.block2 = _Group(n, widths[1], widths[2], 2)
        self.block3 = _Group(n, widths[2], widths[3], 2)
        self.bn1 = nn.BatchNorm2d(widths[3])
        self.fc = nn.Linear(widths[3], num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.block3(self.block2(self.block1(self.conv1(x))))
        out = F.relu(self.bn1(out))
        return self.fc(F.adaptive_avg_pool2d(out, 1).flatten(1))


# Stacked registrations apply bottom-up: wrn34_10 is listed first.
@ARCHITECTURES.register("wrn28_10", CIFAR_MEAN, CIFAR_STD, depth=28, widen_factor=10)
@ARCHITECTURES.register("wrn34_10", CIFAR_MEAN, CIFAR_STD, depth=34, widen_factor=10)
def wide_resnet(num_classes: int, in_channels: int, depth: int = 34, widen_factor: int = 10, sub_block1: bool = False) -> nn.Module:
    return WideResNet(depth, widen_factor, num_classes, in_channels, sub_block1)
