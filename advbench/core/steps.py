"""Norm-specific primitives every gradient attack shares, in both halves: norms, step directions,
projections, momentum, Adam.

Every function works on a batch with a per-sample budget `eps` of shape (N,), so one call
can carry samples at different budgets (the minimum-ε search and the budget sweeps of
`advbench iqa run` rely on this).
"""

from __future__ import annotations

import math

import torch

_TINY = 1e-12


def per_sample(v: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Reshape a (N,) tensor to broadcast against `like` (N, ...)."""
    return v.reshape(-1, *([1] * (like.dim() - 1)))


def lp_norm(v: torch.Tensor, norm: str) -> torch.Tensor:
    flat = v.flatten(1)
    if norm == "linf":
        return flat.abs().amax(dim=1)
    if norm == "l2":
        return flat.norm(p=2, dim=1)
    if norm == "l1":
        return flat.abs().sum(dim=1)
    raise ValueError(f"unknown norm '{norm}'; valid: linf, l2, l1")


def unit_direction(g: torch.Tensor, norm: str) -> torch.Tensor:
    """Steepest-ascent direction of unit `norm`: sign for ℓ∞, g/‖g‖₂ for ℓ2."""
    if norm == "linf":
        return g.sign()
    return g / per_sample(lp_norm(g, norm).clamp_min(_TINY), g)


def accumulate_momentum(momentum: torch.Tensor, grad: torch.Tensor, decay: float) -> torch.Tensor:
    """MI-FGSM's velocity (Dong et al. 2018): decay·m + g/‖g‖₁, per sample, so steps of any scale weigh alike."""
    return decay * momentum + grad / per_sample(lp_norm(grad, "l1").clamp_min(_TINY), grad)


def project(x_adv: torch.Tensor, x: torch.Tensor, eps: torch.Tensor, norm: str) -> torch.Tensor:
    """Project onto the `norm` ball of radius eps (per sample) around x."""
    delta = x_adv - x
    if norm == "linf":
        e = per_sample(eps, delta)
        delta = torch.maximum(torch.minimum(delta, e), -e)
    else:
        n = lp_norm(delta, norm)
        factor = torch.where(n > eps, eps / n.clamp_min(_TINY), torch.ones_like(n))
        delta = delta * per_sample(factor, delta)
    return x + delta


def cosine_anneal(i: int, steps: int, first: float, last: float) -> float:
    """Iteration i's (0-based, of `steps`) value of a schedule annealed on a cosine from `first` towards
    `last`, as Foolbox and adv-lib anneal DDN's and FMN's step sizes (it reaches `last` only after the
    last step)."""
    return last + (first - last) * (1 + math.cos(math.pi * i / steps)) / 2


def clip(x: torch.Tensor, bounds: tuple[float, float]) -> torch.Tensor:
    """Clip to the model's input range; this never increases any ℓp norm of x_adv − x."""
    return x.clamp(bounds[0], bounds[1])


def linf_box(x: torch.Tensor, eps: torch.Tensor, bounds: tuple[float, float]) -> tuple[torch.Tensor, torch.Tensor]:
    """The ℓ∞ ball around x intersected with bounds, as per-pixel limits (lo, hi), computed once per attack.

    With them an ℓ∞ step is one fused add and one clamp (`step_in_box`) instead of a projection
    and a clip: on cheap models (quality metrics, 8x8 digits) those element-wise passes cost as
    much as the model's own forward and backward.
    """
    e = per_sample(eps, x)
    return (x - e).clamp_min(bounds[0]), (x + e).clamp_max(bounds[1])


def step_in_box(x_adv: torch.Tensor, direction: torch.Tensor, alpha: torch.Tensor, lo: torch.Tensor,
                hi: torch.Tensor) -> torch.Tensor:
    """x_adv + α·d clamped into [lo, hi] (`linf_box`): the ℓ∞ step of `ascend`, up to rounding."""
    return torch.clamp(torch.addcmul(x_adv, per_sample(alpha, x_adv), direction), lo, hi)


def ascend(x_adv: torch.Tensor, x: torch.Tensor, direction: torch.Tensor, alpha: torch.Tensor,
           eps: torch.Tensor, norm: str, bounds: tuple[float, float]) -> torch.Tensor:
    """One projected step: x_adv + α·d, back into the ε-ball, then into bounds."""
    stepped = x_adv + per_sample(alpha, x_adv) * direction
    return clip(project(stepped, x, eps, norm), bounds)


DUAL_NORM = {"linf": "l1", "l2": "l2", "l1": "linf"}
"""The dual of each norm: |⟨g, δ⟩| ≤ ‖g‖_dual·‖δ‖, so a linear boundary at f lies |f|/‖g‖_dual away."""


def adam_step(grad: torch.Tensor, m: torch.Tensor, v: torch.Tensor, t: int | torch.Tensor, lr: float,
              betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> torch.Tensor:
    """One Adam update to subtract (m, v updated in place; t counts from 1, per element when a
    tensor: ZOO's per-coordinate step counts).

    Element-wise state on the rows an attack still optimises, so samples never share
    moments and a sample's trajectory does not depend on its batch.
    """
    b1, b2 = betas
    m.mul_(b1).add_(grad, alpha=1 - b1)
    v.mul_(b2).addcmul_(grad, grad, value=1 - b2)
    m_hat = m / (1 - b1 ** t)
    v_hat = v / (1 - b2 ** t)
    return lr * m_hat / (v_hat.sqrt() + eps)


def rmsprop_step(grad: torch.Tensor, square_avg: torch.Tensor, buffer: torch.Tensor, lr: torch.Tensor,
                 alpha: float, momentum: float, eps: float = 1e-8) -> torch.Tensor:
    """One RMSProp-with-momentum update to subtract, as torch.optim.RMSprop takes it (square_avg
    and buffer updated in place), with a per-sample step size `lr` of shape (N,).

    Element-wise state like `adam_step`'s, so a sample's trajectory does not depend on its batch;
    `lr` per sample because ALMA decays each sample's step from its own first success.
    """
    square_avg.mul_(alpha).addcmul_(grad, grad, value=1 - alpha)
    buffer.mul_(momentum).addcdiv_(grad, square_avg.sqrt().add_(eps))
    return buffer * per_sample(lr, buffer)
