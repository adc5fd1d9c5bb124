"""Primitives every gradient attack shares, in both halves: norms, step directions and projections
(by name or `core.norms` object), momentum, Adam.

Every function works on a batch with a per-sample budget `eps` of shape (N,), so one call
can carry samples at different budgets (the minimum-ε search and the budget sweeps of
`advbench iqa run` rely on this).
"""

from __future__ import annotations

import math

import torch

from advbench.core.norms import L1_NORM, Norm, per_sample
from advbench.core.norms import norm as norm_of

_TINY = 1e-12


def lp_norm(v: torch.Tensor, norm: str | Norm) -> torch.Tensor:
    """Per-sample norm of a batch; `norm` is a `core.norms` object or its name."""
    return norm_of(norm).size(v)


def unit_direction(g: torch.Tensor, norm: str | Norm) -> torch.Tensor:
    """Steepest-ascent direction of unit `norm` (`Norm.direction`): sign for ℓ∞, g/‖g‖₂ for ℓ2."""
    return norm_of(norm).direction(g)


def accumulate_momentum(momentum: torch.Tensor, grad: torch.Tensor, decay: float) -> torch.Tensor:
    """MI-FGSM's velocity (Dong et al. 2018): decay·m + g/‖g‖₁, per sample, so steps of any scale weigh alike."""
    return decay * momentum + grad / per_sample(L1_NORM.size(grad).clamp_min(_TINY), grad)


def project(x_adv: torch.Tensor, x: torch.Tensor, eps: torch.Tensor, norm: str | Norm) -> torch.Tensor:
    """Project onto the `norm` ball of radius eps (per sample) around x (`Norm.project_ball`)."""
    return norm_of(norm).project_ball(x_adv, x, eps)


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
           eps: torch.Tensor, norm: str | Norm, bounds: tuple[float, float]) -> torch.Tensor:
    """One projected step: x_adv + α·d, back into the ε-ball intersected with bounds (`Norm.project`)."""
    stepped = x_adv + per_sample(alpha, x_adv) * direction
    return norm_of(norm).project(stepped, x, eps, bounds)


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
