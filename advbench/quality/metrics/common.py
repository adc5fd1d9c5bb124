"""Shared pieces of the published NR metrics: frozen evaluation, preprocessing, ResNet trunks.

Every metric here is a fixed scoring function: it stays in eval mode (BatchNorm running
statistics, no dropout) and its parameters never need gradients; only the input does, so
the UAP trainer and attacks can differentiate through the whole preprocessing.
"""

from __future__ import annotations

import os
import warnings
from collections import OrderedDict
from typing import Any

import torch
import torch.nn.functional as F
import torchvision
from torch import nn

from advbench.core.errors import AdvbenchError
from advbench.quality.metrics.author_weights import WeightFile, load_weight_file
from advbench.quality.metrics.metric_contract import QualityMetric, check_images

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

# torchvision constructors the authors' code uses (or accepts) as feature trunks.
RESNET_ARCHS = (
    "resnet18", "resnet34", "resnet50", "resnet101", "resnet152",
    "resnext50_32x4d", "resnext101_32x8d", "wide_resnet50_2", "wide_resnet101_2",
)

WeightPath = str | os.PathLike[str] | None


class RandomWeightsWarning(UserWarning):
    """A metric was built without its trained weights: its scores are meaningless."""


class Normalize(nn.Module):
    """(x - mean) / std per channel; constants are non-persistent so they stay out of state dicts."""

    def __init__(self, mean: tuple[float, ...], std: tuple[float, ...]) -> None:
        super().__init__()
        self.register_buffer("mean", torch.tensor(mean).view(1, -1, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(std).view(1, -1, 1, 1), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std


def resize(x: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """Differentiable bilinear resize with antialiasing, close to PIL's `Resize` the authors used."""
    if tuple(x.shape[-2:]) == tuple(size):
        return x
    return F.interpolate(x, size=size, mode="bilinear", align_corners=False, antialias=True)


def resize_short_side(x: torch.Tensor, short: int) -> torch.Tensor:
    """Resize so the shorter side equals `short`, keeping the aspect ratio (PIL `Resize(int)`)."""
    h, w = x.shape[-2:]
    if h <= w:
        size = (short, int(short * w / h))
    else:
        size = (int(short * h / w), short)
    return resize(x, size)


def resnet_trunk(arch: str, metric: str, named: bool = False) -> nn.Sequential:
    """A torchvision ResNet without avgpool and fc: the `children()[:-2]` cut the authors use.

    `named=False` numbers the stages 0..7 as `nn.Sequential(*children)` does (keys such as
    `4.0.conv1.weight`); `named=True` keeps torchvision's names (`layer1.0.conv1.weight`) so a
    torchvision ImageNet checkpoint loads directly. Built without weights (no download).
    """
    if arch not in RESNET_ARCHS:
        raise AdvbenchError(f"{metric}: unknown backbone '{arch}'; valid: {', '.join(RESNET_ARCHS)}")
    model = getattr(torchvision.models, arch)(weights=None)
    stages = list(model.named_children())[:-2]
    if named:
        return nn.Sequential(OrderedDict(stages))
    return nn.Sequential(*(module for _, module in stages))


def stage_channels(stage: nn.Module) -> int:
    """Output channels of a ResNet stage (its last BatchNorm)."""
    return [m for m in stage.modules() if isinstance(m, nn.BatchNorm2d)][-1].num_features


class PretrainedMetric(QualityMetric):
    """A published network with fixed weights loaded from the authors' files.

    Subclasses build their layers, list their weight options in `weight_files()` and call
    `load_weights(...)` at the end of `__init__`; they implement `score(x)` on validated input.
    """

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name
        self.pretrained = False

    def weight_files(self) -> dict[str, WeightFile]:  # pragma: no cover - abstract
        """Option name (as in the YAML) -> which sub-network that file fills."""
        raise NotImplementedError

    def load_weights(self, **paths: WeightPath) -> dict[str, Any]:
        """Load every given file; None leaves that part randomly initialised (tests only).

        Returns the raw checkpoint objects by option, for metrics that keep extra values in
        them (LinearityIQA's linear re-scaling). Ends frozen and in eval mode.
        """
        specs = self.weight_files()
        loaded: dict[str, Any] = {}
        for option, spec in specs.items():
            path = paths.get(option)
            if path is not None:
                loaded[option] = load_weight_file(path, spec, self.name, option)
        self.freeze(missing=[option for option in specs if paths.get(option) is None])
        return loaded

    def freeze(self, missing: list[str]) -> None:
        """Eval mode, no parameter gradients; warn when some weights were not loaded."""
        if missing:
            warnings.warn(
                f"{self.name}: built without {', '.join(missing)}; random weights, scores are meaningless",
                RandomWeightsWarning,
                stacklevel=4,
            )
        self.pretrained = not missing
        self.requires_grad_(False)
        self.eval()

    def train(self, mode: bool = True) -> PretrainedMetric:
        """Always eval: the published metric uses BatchNorm running statistics and no dropout."""
        return super().train(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_images(x, self.name)
        return self.score(x)

    def score(self, x: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        """(N, 3, H, W) in [0, 1] -> (N,) scores."""
        raise NotImplementedError
