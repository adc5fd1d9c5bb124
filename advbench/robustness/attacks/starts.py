"""Random starts of the robustness attacks: points in the ε-ball drawn from the per-sample counter RNG."""

from __future__ import annotations

import torch

from advbench.core.norms import L1_NORM, L2_NORM, Norm, per_sample
from advbench.core.norms import norm as norm_of
from advbench.core.sample_draws import normal, uniform

GAUSSIAN_RESTARTS = frozenset({L2_NORM, L1_NORM})
"""The norms whose FAB restart rescales a standard Gaussian (the original's ℓ2 and ℓ1); the others a uniform draw."""


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


def fab_start(x: torch.Tensor, radius: torch.Tensor, norm: str | Norm, bounds: tuple[float, float], *,
              seed: int, sample_id: torch.Tensor, stream: int = 0) -> torch.Tensor:
    """FAB's restart, the original's (`fab_base.py`): a draw rescaled to norm `radius` (N,), clipped to bounds;
    uniform in [−1, 1]^d under ℓ∞, a standard Gaussian under ℓ2 and ℓ1. Under ℓ∞ and ℓ2 that is
    `Norm.sphere_start` to the bit; under ℓ1 it is not: APGD-ℓ1's start projects the Gaussian onto the ball,
    keeping a few coordinates, where FAB's moves every one, and FAB's restarts follow the original."""
    ball, shape = norm_of(norm), tuple(x.shape[1:])
    if ball in GAUSSIAN_RESTARTS:
        t = normal(seed, sample_id, shape, stream, device=x.device, dtype=x.dtype)
    else:
        t = uniform(seed, sample_id, shape, stream, device=x.device, dtype=x.dtype) * 2 - 1
    return (x + t / per_sample(ball.size(t).clamp_min(1e-12), t) * per_sample(radius, x)).clamp(bounds[0], bounds[1])
