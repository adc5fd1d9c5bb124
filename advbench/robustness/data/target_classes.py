"""Per-sample target classes for targeted attacks.

The target must not depend on which attack, defense or batch order is used, so it is a pure
function of (seed, sample_id): a counter-based hash, not a stateful generator.
"""

from __future__ import annotations

import torch

_MASK = (1 << 63) - 1


def _hash(seed: int, sample_ids: torch.Tensor) -> torch.Tensor:
    """SplitMix64-style mixing, kept in 63 bits so it stays a non-negative int64."""
    z = (sample_ids.to(torch.int64) * 2654435761 + seed * 40503 + 12345) & _MASK
    z = (z ^ (z >> 31)) * 0x5851F42D4C957F2D & _MASK
    z = (z ^ (z >> 29)) * 0x14057B7EF767814F & _MASK
    return z ^ (z >> 32)


def target_classes(sample_ids: torch.Tensor, labels: torch.Tensor, num_classes: int, seed: int) -> torch.Tensor:
    """Uniform draw among the `num_classes - 1` classes other than each label."""
    if num_classes < 2:
        raise ValueError(f"targeted attacks need at least 2 classes, got {num_classes}")
    offset = 1 + _hash(seed, sample_ids) % (num_classes - 1)
    return (labels.to(torch.int64) + offset) % num_classes
