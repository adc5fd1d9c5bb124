"""WideResNet (Zagoruyko & Komodakis 2016) as used by Madry PGD-AT and TRADES on CIFAR-10.

Pre-activation blocks, depth = 6n + 4; WRN-34-10 has n=5, widen factor 10. Depth and width
are options so tests can build a tiny variant.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from advbench.errors import AdvbenchError


class _WideBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.bn1 = nn.BatchNorm2d(c_in)
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.shortcut = nn.Conv2d(c_in, c_out, 1, stride, bias=False) if stride != 1 or c_in != c_out else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pre = F.relu(self.bn1(x))
        out = self.conv2(F.relu(self.bn2(self.conv1(pre))))
        # The projection takes the pre-activated input, as in the reference implementation.
        return out + (x if self.shortcut is None else self.shortcut(pre))


class WideResNet(nn.Module):
    def __init__(self, depth: int, widen_factor: int, num_classes: int, in_channels: int) -> None:
        super().__init__()
        if depth < 10 or (depth - 4) % 6:
            raise AdvbenchError(f"WideResNet depth must be 6n + 4 with n >= 1, got {depth}")
        n = (depth - 4) // 6
        widths = [16, 16 * widen_factor, 32 * widen_factor, 64 * widen_factor]
        self.conv = nn.Conv2d(in_channels, widths[0], 3, 1, 1, bias=False)
        blocks: list[nn.Module] = []
        c_in = widths[0]
        for stage, width in enumerate(widths[1:]):
            for i in range(n):
                blocks.append(_WideBlock(c_in, width, 2 if stage > 0 and i == 0 else 1))
                c_in = width
        self.blocks = nn.Sequential(*blocks)
        self.bn = nn.BatchNorm2d(c_in)
        self.fc = nn.Linear(c_in, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn(self.blocks(self.conv(x))))
        return self.fc(F.adaptive_avg_pool2d(out, 1).flatten(1))


def wide_resnet(num_classes: int, in_channels: int, depth: int = 34, widen_factor: int = 10) -> nn.Module:
    return WideResNet(depth, widen_factor, num_classes, in_channels)
