"""The architecture registry: each network builder registers itself, with its input normalisation.

    @ARCHITECTURES.register("resnet56", CIFAR_MEAN, CIFAR_STD, depth=56)
    def resnet_cifar(num_classes, in_channels, depth=56, ...): ...

The decorator's arguments after the normalisation are bound into the builder (a `partial`), so
one builder can serve several names; stacked decorators register bottom-up. `models/__init__`
imports the builder modules in the order the registry lists them.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

from torch import nn

from advbench.core.registry import Registry

CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2471, 0.2435, 0.2616)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class Architecture:
    """A network builder `(num_classes, in_channels, **options)` and its input normalisation."""

    build: Callable[..., nn.Module]
    mean: tuple[float, ...]
    std: tuple[float, ...]


def _architecture(name: str, build: Callable[..., nn.Module], mean: tuple[float, ...], std: tuple[float, ...],
                  *bound: Any, **fixed: Any) -> Architecture:
    return Architecture(partial(build, *bound, **fixed) if bound or fixed else build, mean, std)


ARCHITECTURES: Registry[Architecture] = Registry("model architecture", _architecture)
"""Every architecture by `model.arch` name, in registration order."""
