"""VGG for 32x32 inputs (Simonyan & Zisserman 2015, CIFAR-10 form): 3x3 conv + batch norm + ReLU
stages with max-pooling, one linear classifier on the 512 features left at 1x1. RSE's CIFAR-10
model (Liu et al. 2018) is VGG-16; its noise layers are added by `advbench.robustness.defenses.noise_layers`."""

from __future__ import annotations

from torch import nn

from advbench.core.errors import AdvbenchError
from advbench.robustness.models.architectures import ARCHITECTURES, CIFAR_MEAN, CIFAR_STD

# Output channels per conv layer, "M" a 2x2 max-pool.
LAYOUTS: dict[int, list[int | str]] = {
    11: [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
    13: [64, 64, "M", 128, 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
    16: [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"],
    19: [64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M", 512, 512, 512, 512, "M"],
}


@ARCHITECTURES.register("vgg16", CIFAR_MEAN, CIFAR_STD, depth=16)
def vgg(num_classes: int, in_channels: int, depth: int = 16) -> nn.Module:
    """VGG-`depth` (11, 13, 16 or 19 weight layers); five pools take 32x32 to 1x1."""
    if depth not in LAYOUTS:
        raise AdvbenchError(f"VGG depth must be one of {', '.join(map(str, LAYOUTS))}, got {depth}")
    layers: list[nn.Module] = []
    channels = in_channels
    for item in LAYOUTS[depth]:
        if item == "M":
            layers.append(nn.MaxPool2d(2))
        else:
            layers += [nn.Conv2d(channels, int(item), 3, padding=1), nn.BatchNorm2d(int(item)), nn.ReLU(inplace=True)]
            channels = int(item)
    return nn.Sequential(*layers, nn.Flatten(), nn.Linear(channels, num_classes))
