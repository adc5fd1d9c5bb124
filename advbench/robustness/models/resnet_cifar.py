"""He et al. (2016) CIFAR ResNets: 3 stages of n basic blocks, depth = 6n + 2 (ResNet-56: n=9)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from advbench.core.errors import AdvbenchError
from advbench.robustness.models.architectures import ARCHITECTURES, CIFAR_MEAN, CIFAR_STD


class _PadShortcut(nn.Module):
    """Option A shortcut: subsample and zero-pad channels, no parameters (as in the paper)."""

    def __init__(self, extra_channels: int) -> None:
        super().__init__()
        self.extra = extra_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.pad(x[:, :, ::2, ::2], (0, 0, 0, 0, self.extra // 2, self.extra - self.extra // 2))


class _BasicBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut = _PadShortcut(c_out - c_in) if stride != 1 or c_in != c_out else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class CifarResNet(nn.Module):
    def __init__(self, depth: int, num_classes: int, in_channels: int, base_width: int = 16) -> None:
        super().__init__()
        if depth < 8 or (depth - 2) % 6:
            raise AdvbenchError(f"CIFAR ResNet depth must be 6n + 2 with n >= 1, got {depth}")
        n = (depth - 2) // 6
        widths = [base_width, 2 * base_width, 4 * base_width]
        self.conv = nn.Conv2d(in_channels, widths[0], 3, 1, 1, bias=False)
        self.bn = nn.BatchNorm2d(widths[0])
        blocks: list[nn.Module] = []
        c_in = widths[0]
        for stage, width in enumerate(widths):
            for i in range(n):
                blocks.append(_BasicBlock(c_in, width, 2 if stage > 0 and i == 0 else 1))
                c_in = width
        self.blocks = nn.Sequential(*blocks)
        self.stage_ends = [n, 2 * n, 3 * n]  # block counts after each stage (where denoising blocks go)
        self.fc = nn.Linear(c_in, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.blocks(F.relu(self.bn(self.conv(x))))
        return self.fc(F.adaptive_avg_pool2d(out, 1).flatten(1))


# Stacked registrations apply bottom-up: resnet56 is listed first.
@ARCHITECTURES.register("resnet110", CIFAR_MEAN, CIFAR_STD, depth=110)
@ARCHITECTURES.register("resnet56", CIFAR_MEAN, CIFAR_STD, depth=56)
def resnet_cifar(num_classes: int, in_channels: int, depth: int = 56, base_width: int = 16) -> nn.Module:
    return CifarResNet(depth, num_classes, in_channels, base_width)
