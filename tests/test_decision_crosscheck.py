"""HopSkipJump and Boundary against Foolbox 3.3.4's on the same model, samples and query budget.

Foolbox queries every sample of the batch in every call, so its per-sample cost is the
number of images its model saw divided by the batch size; advbench gets that many queries
per sample (its budget). advbench must be at least as strong within noise: median ℓ2 (ℓ∞ for
HopSkipJump-ℓ∞) no more than 1.1× Foolbox's.
"""

from __future__ import annotations

import foolbox as fb
import pytest
import torch
from contract import Counting

from advbench.core.steps import lp_norm
from advbench.robustness.attacks.boundary import Boundary
from advbench.robustness.attacks.decision import HopSkipJump
from advbench.robustness.attacks.oracles import DecisionOracle

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]
STEPS = 12  # Foolbox iterations: about 3,200 queries a sample on digits
BOUNDARY_STEPS = 3000  # Foolbox steps: one query each, a second every 10th


CASES = {  # Foolbox attack, advbench attack at a query budget, norm
    "hsj": (lambda: fb.attacks.HopSkipJumpAttack(steps=STEPS), lambda q: HopSkipJump(max_queries=q), "l2"),
    "hsj-linf": (lambda: fb.attacks.HopSkipJumpAttack(steps=STEPS, constraint="linf"),
                 lambda q: HopSkipJump(max_queries=q), "linf"),
    "boundary": (lambda: fb.attacks.BoundaryAttack(steps=BOUNDARY_STEPS), lambda q: Boundary(max_queries=q), "l2"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_at_least_as_strong_as_foolbox(name: str, tiny_model, digits_tensors) -> None:
    _, _, x, y = digits_tensors
    keep = tiny_model(x).argmax(1) == y
    x, y = x[keep][:40], y[keep][:40]
    counted = Counting(tiny_model).eval()
    torch.manual_seed(0)
    fmodel = fb.PyTorchModel(counted, bounds=(0, 1))
    theirs, ours_at, norm = CASES[name]
    _, x_fb, ok = theirs()(fmodel, x, fb.criteria.Misclassification(y), epsilons=None)
    budget = counted.rows // len(y)
    d_fb = torch.where(ok, lp_norm(x_fb - x, norm), torch.full((len(y),), float("inf")))

    oracle = DecisionOracle(tiny_model, len(y))
    ours = ours_at(budget)(oracle, x, y, eps=torch.full((len(y),), 0.8), norm=norm)
    d_ours = torch.where(ours.success, lp_norm(ours.x_adv - x, norm), torch.full((len(y),), float("inf")))
    assert (oracle.queries <= budget).all()
    print(f"{name}: queries/sample {budget}: median {norm} advbench {d_ours.median():.4f}, foolbox {d_fb.median():.4f}")
    assert d_ours.median() <= 1.1 * d_fb.median()
