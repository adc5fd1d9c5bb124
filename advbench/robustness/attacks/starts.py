"""Random starts of the robustness attacks: points in the ε-ball drawn from the per-sample counter RNG."""

from __future__ import annotations

import torch

from advbench.core.norms import Norm
from advbench.core.norms import norm as norm_of


def random_start(x: torch.Tensor, eps: torch.Tensor, norm: str | Norm, bounds: tuple[float, float], *,
                 seed: int, sample_id: torch.Tensor, stream: int = 0) -> torch.Tensor:
    """A point drawn uniformly from the ε-ball (`Norm.random_start`), clipped to bounds.

    The draw is a function of (seed, sample_id, stream) only, so a sample starts from the same
    direction in any batch and at any ε (the minimum-ε search rescales it, nothing more).
    """
    return norm_of(norm).random_start(x, eps, bounds, seed=seed, sample_id=sample_id, stream=stream)


def boundary_start(x: torch.Tensor, eps: torch.Tensor, norm: str | Norm, bounds: tuple[float, float], *,
                   seed: int, sample_id: torch.Tensor, stream: int = 0) -> torch.Tensor:
    """APGD's start on the ε-sphere (`Norm.sphere_start`), clipped to bounds, drawn per sample from
    (seed, sample_id, stream): it begins as far from x as the budget allows."""
    return norm_of(norm).sphere_start(x, eps, bounds, seed=seed, sample_id=sample_id, stream=stream)
