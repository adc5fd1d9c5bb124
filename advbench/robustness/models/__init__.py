"""Model registry: every architecture is built already wrapped in its normalisation.

`build_model("resnet56", num_classes=10, in_channels=3)` returns a `Classifier` taking [0, 1]
images. YAML files in `conf/model/` name the architecture and its options; `instantiate_model`
adds what only the data set knows (classes, channels).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

from torch import nn

from advbench.core.construct import construct
from advbench.core.errors import AdvbenchError
from advbench.core.keys import plain
from advbench.robustness.models.base import Classifier
from advbench.robustness.models.denoise import add_denoising
from advbench.robustness.models.ibp_cnn import ibp_large
from advbench.robustness.models.preact_resnet import preact_resnet18
from advbench.robustness.models.resnet_cifar import resnet_cifar
from advbench.robustness.models.small_cnn import small_cnn
from advbench.robustness.models.torchvision_nets import torchvision_net
from advbench.robustness.models.vgg import vgg
from advbench.robustness.models.wide_resnet import wide_resnet

CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2471, 0.2435, 0.2616)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# Keys of a conf/model YAML that describe the option rather than the constructor.
MODEL_META_KEYS = ("name", "input_size")


@dataclass(frozen=True)
class Architecture:
    """A network builder `(num_classes, in_channels, **options)` and its input normalisation."""

    build: Callable[..., nn.Module]
    mean: tuple[float, ...]
    std: tuple[float, ...]


ARCHITECTURES: dict[str, Architecture] = {
    "small_cnn": Architecture(small_cnn, (0.5,), (0.5,)),
    "resnet56": Architecture(partial(resnet_cifar, depth=56), CIFAR_MEAN, CIFAR_STD),
    "resnet110": Architecture(partial(resnet_cifar, depth=110), CIFAR_MEAN, CIFAR_STD),
    "wrn34_10": Architecture(partial(wide_resnet, depth=34, widen_factor=10), CIFAR_MEAN, CIFAR_STD),
    "wrn28_10": Architecture(partial(wide_resnet, depth=28, widen_factor=10), CIFAR_MEAN, CIFAR_STD),
    "preact_resnet18": Architecture(preact_resnet18, CIFAR_MEAN, CIFAR_STD),
    "ibp_large": Architecture(ibp_large, CIFAR_MEAN, CIFAR_STD),
    "vgg16": Architecture(partial(vgg, depth=16), CIFAR_MEAN, CIFAR_STD),
    # torchvision's Inception-v3 weights expect (x - 0.5) / 0.5 (its `transform_input`).
    "inception_v3": Architecture(partial(torchvision_net, "inception_v3"), (0.5,), (0.5,)),
    "resnet50": Architecture(partial(torchvision_net, "resnet50"), IMAGENET_MEAN, IMAGENET_STD),
    "resnet152": Architecture(partial(torchvision_net, "resnet152"), IMAGENET_MEAN, IMAGENET_STD),
}


def build_model(
    arch: str,
    num_classes: int,
    in_channels: int,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    **options: Any,
) -> Classifier:
    """Build `arch` with its default (or the given) normalisation; options go to the builder."""
    if arch not in ARCHITECTURES:
        raise AdvbenchError(f"unknown model architecture '{arch}'; valid: {', '.join(sorted(ARCHITECTURES))}")
    spec = ARCHITECTURES[arch]
    expects = len(spec.mean if mean is None else mean)
    if expects not in (1, in_channels):
        fitting = sorted(a for a, s in ARCHITECTURES.items() if len(s.mean) in (1, in_channels))
        plural = "s" if in_channels != 1 else ""
        raise AdvbenchError(f"model '{arch}' expects {expects}-channel input, but the data set has {in_channels} "
                            f"channel{plural}; models taking {in_channels}-channel input: {', '.join(fitting)}")
    denoise, normalization = options.pop("denoise", None), options.pop("normalization", "outside")
    try:
        inspect.signature(spec.build).bind(num_classes, in_channels, **options)
    except TypeError as exc:
        raise AdvbenchError(f"bad options for model '{arch}' {sorted(options)}: {exc}") from None
    net = spec.build(num_classes, in_channels, **options)
    if denoise is not None:
        net = add_denoising(net, arch, denoise)
    return Classifier(net, arch, in_channels, spec.mean if mean is None else mean, spec.std if std is None else std,
                      normalization)


def instantiate_model(model_cfg: Mapping[str, Any], num_classes: int, in_channels: int) -> Classifier:
    """Instantiate a `conf/model` entry for a data set with `num_classes` and `in_channels`."""
    args = {k: v for k, v in plain(model_cfg).items() if k not in MODEL_META_KEYS}
    return construct(args, num_classes=num_classes, in_channels=in_channels)


__all__ = ["ARCHITECTURES", "Architecture", "Classifier", "build_model", "instantiate_model"]
