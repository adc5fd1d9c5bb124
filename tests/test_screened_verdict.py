"""The gradient attacks' verdict on an iterate, screened from its gradient call's forward before the backward.

On a deterministic white-box target the early-stopping loop of BIM, PGD, MIM and FGSM judges each
iterate from the logits its gradient call's forward hands over (`WhiteBoxOracle.value_and_grads`'
`screen`) before the backward is launched, steps every row, and drops the broken ones only on
iterations where some broke, so that on a GPU the host does not drain the device's queue every
iteration. What it returns and counts is what judging after the backward and dropping before the
step gave.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from advbench.robustness.attacks.gradient import BIM, MIM, PGD
from advbench.robustness.attacks.oracles import WhiteBoxOracle

pytestmark = pytest.mark.usefixtures("one_thread")

N = 120


class Events(nn.Module):
    """The model, noting each backward through its logits."""

    def __init__(self, model: nn.Module, events: list[str]) -> None:
        super().__init__()
        self.model, self.events = model, events

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.model(x)
        if out.requires_grad:
            out.register_hook(lambda g: self.events.append("backward"))
        return out


class Noted(WhiteBoxOracle):
    def __init__(self, model: nn.Module, n: int, events: list[str]) -> None:
        super().__init__(model, n)
        self.events = events

    def verdict(self, *args, **kwargs):
        self.events.append("verdict")
        return super().verdict(*args, **kwargs)


def unscreened(cls: type) -> type:
    """The attack judging after the gradient call and dropping broken rows before the step."""
    return type(f"Unscreened{cls.__name__}", (cls,), {"_screens": lambda self, oracle: False})


def test_the_verdict_runs_between_the_forward_and_the_backward(tiny_model, digits_tensors) -> None:
    x, y = digits_tensors[2][:8], digits_tensors[3][:8]
    events: list[str] = []
    BIM(steps=3)(Noted(Events(tiny_model, events), 8, events), x, y, eps=torch.full((8,), 1e-6), norm="linf")
    assert events == ["verdict", "backward"] * 3 + ["verdict"], "the last iterate is judged on a forward of its own"


@pytest.mark.parametrize("cls", [BIM, PGD, MIM])
@pytest.mark.parametrize("norm,eps", [("linf", 0.1), ("l2", 0.8)])
@pytest.mark.parametrize("targeted", [False, True])
def test_screening_changes_no_result_and_no_count(cls: type, norm: str, eps: float, targeted: bool, tiny_model,
                                                  digits_tensors) -> None:
    x, y = digits_tensors[2][:N], digits_tensors[3][:N]
    target = (y + 1) % 10 if targeted else None
    runs = []
    for attack in (cls(steps=12), unscreened(cls)(steps=12)):
        oracle = WhiteBoxOracle(tiny_model, N)
        res = attack(oracle, x, y, eps=torch.full((N,), eps), norm=norm, target=target)
        runs.append((res.x_adv, res.first_success, oracle.grad_evals, oracle.queries))
    (screened, plain) = runs
    breaks = screened[1][screened[1] > 0]
    assert breaks.unique().numel() > 2, "samples break at several iterations"
    for got, want in zip(screened, plain):
        assert torch.equal(got, want)
