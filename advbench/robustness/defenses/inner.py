"""Inner maximisation for adversarial training (not a benchmark attack).

Training needs a fast, fixed ℓ∞ PGD and the objectives it maximises (Madry's cross-entropy,
TRADES's KL, Ens-AT's single steps); the benchmark's attacks in `advbench.robustness.attacks` carry
oracles, budgets per sample and bookkeeping that training does not want. Keeping this one
function here also means a bug in an evaluated attack cannot silently weaken the defenses
it is measured against.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Callable, Literal

import torch
from torch import nn
from torch.nn import functional as F

Start = Literal["uniform", "gaussian", "none"]
Objective = Callable[[torch.Tensor], torch.Tensor]
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


def fgsm_objective(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> Objective:
    """FGSM's single step: ascend the cross-entropy of the label."""
    return cross_entropy_objective(model, y)


def step_ll_objective(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> Objective:
    """Step-LL: descend the cross-entropy of the least likely class (Kurakin et al., Tramèr et al.'s choice)."""
    with torch.no_grad():
        least = model(x).argmin(1)
    return lambda x_adv: -F.cross_entropy(model(x_adv), least, reduction="sum")


SINGLE_STEPS: dict[str, Callable[[nn.Module, torch.Tensor, torch.Tensor], Objective]] = {
    "fgsm": fgsm_objective,
    "step_ll": step_ll_objective,
}
"""Ens-AT's `single_step:` choices: (source model, x, y) -> the objective of one signed step."""


@contextmanager
def eval_mode(model: nn.Module) -> Iterator[None]:
    """Craft training adversaries with frozen batch-norm statistics, then resume training."""
    model.eval()
    try:
        yield
    finally:
        model.train()
