"""Shared test helpers: the budgeted and the minimum-norm attack contracts as one assertion each, and
a model that counts the images it is shown (the exact query cost of decision and score attacks)."""

from __future__ import annotations

import torch
from torch import nn

from advbench.attacks.base import Attack, AttackResult
from advbench.attacks.oracles import WhiteBoxOracle
from advbench.attacks.steps import lp_norm


def assert_budgeted_contract(attack: Attack, res: AttackResult, oracle: WhiteBoxOracle, model: nn.Module,
                             x: torch.Tensor, y: torch.Tensor, eps: torch.Tensor, norm: str,
                             target: torch.Tensor | None) -> None:
    """Bounds and budget respected, success exactly where the model agrees, strength and cost within `steps`."""
    assert res.x_adv.shape == x.shape
    assert res.x_adv.min() >= 0 and res.x_adv.max() <= 1
    assert (lp_norm(res.x_adv - x, norm) <= eps * (1 + 1e-5) + 1e-6).all()
    pred = model(res.x_adv).argmax(1)
    agrees = (pred == target) if target is not None else (pred != y)
    assert torch.equal(res.success, agrees), "success must be what the model says on the returned example"
    assert torch.equal(res.success, res.first_success >= 0)
    assert (res.first_success <= attack.steps).all() and (oracle.grad_evals <= attack.steps).all()


class Counting(nn.Module):
    """Forwards to a model and counts the images it was shown."""

    bounds = (0.0, 1.0)

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model, self.rows = model, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.rows += x.shape[0]
        return self.model(x)


def assert_minimizing_contract(res: AttackResult, model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                               eps: torch.Tensor, norm: str, target: torch.Tensor | None) -> None:
    """In bounds, x itself where nothing was found, success exactly where the model agrees, and
    first_success set exactly where the example lies within eps."""
    assert res.x_adv.shape == x.shape
    assert res.x_adv.min() >= 0 and res.x_adv.max() <= 1
    assert torch.equal(res.x_adv[~res.success], x[~res.success])
    pred = model(res.x_adv).argmax(1)
    agrees = (pred == target) if target is not None else (pred != y)
    assert torch.equal(res.success, agrees), "success must be what the model says on the returned example"
    assert torch.equal(res.first_success >= 0, res.success & (lp_norm(res.x_adv - x, norm) <= eps))
