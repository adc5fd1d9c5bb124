"""Inner maximisation for adversarial training (not a benchmark attack).

Training needs a fast, fixed ℓ∞ PGD; the benchmark's attacks in `advbench.attacks` carry
oracles, budgets per sample and bookkeeping that training does not want. Keeping this one
function here also means a bug in an evaluated attack cannot silently weaken the defenses
it is measured against.
"""

from __future__ import annotations

from typing import Callable, Literal

import torch
from torch import nn
from torch.nn import functional as F

Start = Literal["uniform", "gaussian", "none"]
# TRADES starts its KL maximisation from x + 0.001 * N(0, I) (the clean point has zero gradient).
GAUSSIAN_START_STD = 1e-3


def pgd_linf(
    loss_fn: Callable[[torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    eps: float | torch.Tensor,
    step_size: float,
    steps: int,
    start: Start = "uniform",
) -> torch.Tensor:
    """Maximise `loss_fn` (a scalar summed over the batch) in the ℓ∞ ball of radius `eps`.

    Signed-gradient ascent with projection onto the ball and [0, 1] after every step. `eps`
    may be a float or a per-sample tensor broadcastable to `x`. Returns a detached tensor.
    """
    x = x.detach()
    eps_t = torch.as_tensor(eps, dtype=x.dtype, device=x.device)
    if eps_t.dim() == 1:
        eps_t = eps_t.view(-1, *([1] * (x.dim() - 1)))
    if start == "uniform":
        x_adv = x + (torch.rand_like(x) * 2 - 1) * eps_t
    elif start == "gaussian":
        x_adv = x + GAUSSIAN_START_STD * torch.randn_like(x)
    else:
        x_adv = x.clone()
    x_adv = _project(x_adv, x, eps_t)
    for _ in range(steps):
        x_adv.requires_grad_(True)
        (grad,) = torch.autograd.grad(loss_fn(x_adv), x_adv)
        x_adv = _project(x_adv.detach() + step_size * grad.sign(), x, eps_t)
    return x_adv.detach()


def _project(x_adv: torch.Tensor, x: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
    return (x + torch.clamp(x_adv - x, -eps, eps)).clamp(0.0, 1.0)


def cross_entropy_objective(model: nn.Module, y: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """Madry PGD-AT's inner loss; summed so each sample's gradient ignores the batch size."""
    return lambda x_adv: F.cross_entropy(model(x_adv), y, reduction="sum")


def kl_objective(model: nn.Module, clean_probs: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """TRADES's inner loss KL(p(x) || p(x_adv)), summed over the batch."""
    return lambda x_adv: F.kl_div(F.log_softmax(model(x_adv), dim=1), clean_probs, reduction="sum")
