"""The CNNs of the IBP paper (Gowal et al. 2018): plain conv/ReLU stacks that interval bounds stay tight on."""

from __future__ import annotations

from torch import nn

from advbench.robustness.models.architectures import ARCHITECTURES, CIFAR_MEAN, CIFAR_STD
from advbench.robustness.models.pool import PoolTo


@ARCHITECTURES.register("ibp_large", CIFAR_MEAN, CIFAR_STD)
def ibp_large(num_classes: int, in_channels: int, width: int = 64, hidden: int = 512) -> nn.Module:
    """Gowal et al.'s "large" model: conv 64, 64, 128 (stride 2), 128, 128, all 3x3; dense 512, 10.

    No batch norm or residual paths, so every layer has an interval rule
    (`advbench.robustness.defenses.certify`). The adaptive pool is the identity on 32x32 CIFAR-10 and
    fixes the dense input at 16x16 on other sizes.
    """
    w = width
    return nn.Sequential(
        nn.Conv2d(in_channels, w, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(w, w, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(w, 2 * w, 3, padding=1, stride=2),
        nn.ReLU(),
        nn.Conv2d(2 * w, 2 * w, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(2 * w, 2 * w, 3, padding=1),
        nn.ReLU(),
        PoolTo(16),
        nn.Flatten(),
        nn.Linear(2 * w * 16 * 16, hidden),
        nn.ReLU(),
        nn.Linear(hidden, num_classes),
    )
