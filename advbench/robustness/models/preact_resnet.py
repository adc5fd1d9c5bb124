"""PreActResNet-18 (He et al. 2016, identity mappings) for CIFAR-10, in RobustBench's layout.

Parameter names follow RobustBench's `PreActResNet` (`conv1`, `layer{1..4}.{i}` with `bn1,
conv1, bn2, conv2, shortcut.0`, optional `bn`, `linear`) so its CIFAR-10 state dicts load as
they are. `out_shortcut` (RobustBench's `PreActBlockV2`) feeds the projection shortcut the
pre-activated input instead of the raw one; `bn_before_fc` adds the final BN + ReLU that some
checkpoints have. `width` scales the channels (64 in the published nets) for tiny tests.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from advbench.robustness.models.architectures import ARCHITECTURES, CIFAR_MEAN, CIFAR_STD


class _PreActBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int, out_shortcut: bool) -> None:
        super().__init__()
        self.out_shortcut = out_shortcut
        self.bn1 = nn.BatchNorm2d(c_in)
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False)) \
            if stride != 1 or c_in != c_out else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pre = F.relu(self.bn1(x))
        shortcut = x if self.shortcut is None else self.shortcut(pre if self.out_shortcut else x)
        return self.conv2(F.relu(self.bn2(self.conv1(pre)))) + shortcut


class PreActResNet(nn.Module):
    def __init__(self, num_blocks: list[int], num_classes: int, in_channels: int, width: int = 64,
                 bn_before_fc: bool = False, out_shortcut: bool = False) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, width, 3, 1, 1, bias=False)
        c_in = width
        for stage, n in enumerate(num_blocks):
            c_out = width * 2**stage
            blocks = [_PreActBlock(c_in if i == 0 else c_out, c_out, (1 if stage == 0 else 2) if i == 0 else 1, out_shortcut)
                      for i in range(n)]
            setattr(self, f"layer{stage + 1}", nn.Sequential(*blocks))
            c_in = c_out
        self.bn = nn.BatchNorm2d(c_in) if bn_before_fc else None
        self.linear = nn.Linear(c_in, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.layer4(self.layer3(self.layer2(self.layer1(self.conv1(x)))))
        if self.bn is not None:
            out = F.relu(self.bn(out))
        return self.linear(F.adaptive_avg_pool2d(out, 1).flatten(1))


@ARCHITECTURES.register("preact_resnet18", CIFAR_MEAN, CIFAR_STD)
def preact_resnet18(num_classes: int, in_channels: int, width: int = 64, bn_before_fc: bool = False,
                    out_shortcut: bool = False) -> nn.Module:
    return PreActResNet([2, 2, 2, 2], num_classes, in_channels, width, bn_before_fc, out_shortcut)
