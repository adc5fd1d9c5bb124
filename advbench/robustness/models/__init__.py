"""Models: every architecture is built already wrapped in its normalisation.

`build_model("resnet56", num_classes=10, in_channels=3)` returns a `Classifier` taking [0, 1]
images. YAML files in `conf/model/` name the architecture and its options; `specs.ModelSpec.build`
adds what only the data set knows (classes, channels).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

# The order of these imports is the order of the registry: each builder module registers its
# architectures (`@ARCHITECTURES.register` beside the builder) when first imported, so they come
# before any module (denoise) that imports some of them.
# isort: off
from advbench.robustness.models import (  # noqa: F401 - each module registers its architectures
    small_cnn,
    resnet_cifar,
    wide_resnet,
    preact_resnet,
    ibp_cnn,
    vgg,
    torchvision_nets,
)
# isort: on
from advbench.core.errors import AdvbenchError
from advbench.robustness.models.architectures import (
    ARCHITECTURES,
    CIFAR_MEAN,
    CIFAR_STD,
    IMAGENET_MEAN,
    IMAGENET_STD,
    Architecture,
)
from advbench.robustness.models.classifier import Classifier
from advbench.robustness.models.denoise import add_denoising

# Keys of a conf/model YAML that describe the option rather than the constructor.
MODEL_META_KEYS = ("name", "input_size")


def build_model(
    arch: str,
    num_classes: int,
    in_channels: int,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    **options: Any,
) -> Classifier:
    """Build `arch` with its default (or the given) normalisation; options go to the builder."""
    spec = ARCHITECTURES.lookup(arch)
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


__all__ = ["ARCHITECTURES", "CIFAR_MEAN", "CIFAR_STD", "IMAGENET_MEAN", "IMAGENET_STD", "Architecture", "Classifier",
           "build_model"]
