"""Shared test helpers: the budgeted and the minimum-norm attack contracts as one assertion each, a
model that counts the images it is shown (the exact query cost of decision and score attacks), and
the query-cost and determinism checks the query attacks share, the first bad number the command line
tries for an option's declared hyperparameters, and the verdict of a cross-check against the original
AutoAttack."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from advbench.core import hyperparameters as hyper
from advbench.core.steps import lp_norm
from advbench.robustness.attacks.attack_contract import Attack, AttackResult
from advbench.robustness.attacks.oracles import Oracle, WhiteBoxOracle


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
    assert (res.first_success <= attack.strength_budget).all() and (oracle.grad_evals <= attack.strength_budget).all()


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


def assert_decision_queries(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                            run: Callable[[nn.Module, torch.Tensor, torch.Tensor, torch.Tensor | None],
                                          tuple[AttackResult, Oracle]], budget: int) -> None:
    """A labels-only attack's exact query cost: every image the model saw is a counted query, no
    sample passes `budget`, a started sample spends all of it, and alone a sample is shown exactly
    the images it was charged for in the batch. `run(model, x, y, sample_id)` -> (result, oracle)."""
    stub = Counting(model)
    res, oracle = run(stub, x, y, None)
    assert stub.rows == int(oracle.queries.sum()), "every image the model saw is a counted query"
    assert (oracle.queries <= budget).all()
    assert res.x_adv.min() >= 0 and res.x_adv.max() <= 1
    assert torch.equal(res.success, model(res.x_adv).argmax(1) != y), "success is the model's verdict"
    started = res.success & (model(x).argmax(1) == y)
    assert started.any() and (oracle.queries[started] == budget).all(), "a started sample spends its whole budget"
    for i in (0, 5):  # alone, a sample is shown exactly the images it was charged for in the batch
        alone = Counting(model)
        run(alone, x[i:i + 1], y[i:i + 1], torch.tensor([i]))
        assert alone.rows == int(oracle.queries[i])


def assert_seeded_and_batch_independent(run: Callable[[int, torch.Tensor], AttackResult], n: int,
                                        singles: tuple[int, ...]) -> None:
    """Same seed, same result; another seed, other draws; and a sample attacked alone follows the
    search it follows in the batch. `run(seed, rows)` attacks the samples `rows` (their ids)."""
    everyone = torch.arange(n)
    a, b = run(0, everyone), run(0, everyone)
    assert torch.equal(a.x_adv, b.x_adv) and torch.equal(a.first_success, b.first_success)
    assert not torch.equal(a.x_adv, run(1, everyone).x_adv), "the seed drives the search"
    for i in singles:
        alone = run(0, torch.tensor([i]))
        assert torch.allclose(alone.x_adv[0], a.x_adv[i], atol=1e-5)  # batched convolutions round differently
        assert alone.first_success[0] == a.first_success[i]


def first_numeric_case(declared: Callable[[str], Any], names: Iterable[str]) -> tuple[str, Any] | None:
    """A number past an end of the first numeric range among `names` (an option's YAML keys; `declared`
    gives each one's range, or None): what the command line tries for that option."""
    for name in names:
        spec = declared(name)
        if isinstance(spec, (hyper.Whole, hyper.Real)):
            ends = [v for v in spec.bad() if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)]
            if ends:
                return name, ends[0]
    return None


def assert_close_to_the_original(robust: torch.Tensor, theirs: torch.Tensor, said: str) -> None:
    """Robust accuracy within one point of the original's at a budget leaving it between 20 % and 80 %,
    and the same verdict on at least 95 % of samples; `said` is printed beside the figures (`-s`)."""
    ours, original = float(robust.float().mean()), float(theirs.float().mean())
    agree = float((robust == theirs).float().mean())
    print(f"{said}: ours {ours:.2%}, original {original:.2%}, same verdict on {agree:.1%}")
    assert 0.2 <= original <= 0.8, "the budget should leave robust accuracy between 20% and 80%"
    assert abs(ours - original) <= 0.01 + 1e-6, f"robust accuracy {ours:.2%} vs the original's {original:.2%}"
    assert agree >= 0.95
