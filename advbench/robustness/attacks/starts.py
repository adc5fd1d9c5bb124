"""Random starts of the robustness attacks: points in the ε-ball drawn from the per-sample counter RNG."""

from __future__ import annotations

import torch

from advbench.core.draws import normal, uniform
from advbench.core.steps import clip, lp_norm, per_sample, unit_direction


def random_start(x: torch.Tensor, eps: torch.Tensor, norm: str, bounds: tuple[float, float], *,
                 seed: int, sample_id: torch.Tensor, stream: int = 0) -> torch.Tensor:
    """A point drawn uniformly from the ε-ball (ℓ∞ cube or ℓ2 ball), clipped to bounds.

    The draw is a function of (seed, sample_id, stream) only, so a sample starts from the same
    direction in any batch and at any ε (the minimum-ε search rescales it, nothing more).
    """
    shape = tuple(x.shape[1:])
    if norm == "linf":
        u = uniform(seed, sample_id, shape, stream, device=x.device, dtype=x.dtype) * 2 - 1
        delta = u * per_sample(eps, x)
    else:
        g = normal(seed, sample_id, shape, stream, device=x.device, dtype=x.dtype)
        d = x[0].numel()
        u = uniform(seed, sample_id, (1,), stream, device=x.device, dtype=torch.float64).squeeze(1)
        radius = (u ** (1.0 / d)).to(x.dtype)
        delta = unit_direction(g, "l2") * per_sample(radius * eps, x)
    return clip(x + delta, bounds)


def boundary_start(x: torch.Tensor, eps: torch.Tensor, norm: str, bounds: tuple[float, float], *,
                   seed: int, sample_id: torch.Tensor, stream: int = 0) -> torch.Tensor:
    """APGD's start on the ε-sphere, clipped to bounds, drawn per sample from (seed, sample_id, stream).

    ℓ∞: u ~ U[−1, 1]^d rescaled so that max|u_i| = 1; ℓ2: a Gaussian direction of length ε
    (Croce & Hein's published start: it begins as far from x as the budget allows).
    """
    shape = tuple(x.shape[1:])
    if norm == "linf":
        u = uniform(seed, sample_id, shape, stream, device=x.device, dtype=x.dtype) * 2 - 1
        direction = u / per_sample(lp_norm(u, "linf").clamp_min(1e-12), u)
    else:
        direction = unit_direction(normal(seed, sample_id, shape, stream, device=x.device, dtype=x.dtype), "l2")
    return clip(x + direction * per_sample(eps, x), bounds)
