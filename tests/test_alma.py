"""ALMA: what is its own beyond the catalogue's contract (tests/test_attacks.py).

It keeps the smallest adversarial iterate it judged; targeted success means the target; it costs
one gradient a step; its constraint and penalty are the paper's; a sample's numbers do not
depend on its batch; bad settings are refused in one line; and it is as strong as DDN on the
digits net (median minimum ℓ2 on 100 test digits, slow).
"""

from __future__ import annotations

import math

import pytest
import torch
from test_ddn import Watched, predict
from test_minimum_norm import AlwaysZero, Shifted

from advbench.core.errors import AdvbenchError
from advbench.core.steps import lp_norm
from advbench.robustness.attacks.alma import ALMA, dlr_constraint, p2_slope
from advbench.robustness.attacks.ddn import DDN
from advbench.robustness.attacks.oracles import TransferOracle, WhiteBoxOracle
from advbench.robustness.data.target_classes import target_classes

pytestmark = pytest.mark.usefixtures("one_thread")

N = 60


@pytest.fixture(scope="module")
def batch(digits_tensors) -> tuple[torch.Tensor, torch.Tensor]:
    _, _, x, y = digits_tensors
    return x[:N], y[:N]


def min_l2(res, x: torch.Tensor) -> torch.Tensor:
    return torch.where(res.success, lp_norm(res.x_adv - x, "l2"), torch.full((x.shape[0],), math.inf))


@pytest.mark.parametrize("targeted", [False, True])
def test_returned_norm_is_the_smallest_adversarial_iterate_seen(targeted: bool, tiny_model, batch) -> None:
    x, y = batch
    target = target_classes(torch.arange(N), y, 10, seed=0) if targeted else None
    oracle = Watched(tiny_model, N, x)
    res = ALMA(steps=60)(oracle, x, y, eps=torch.full((N,), 1e3), norm="l2", target=target)
    smallest = torch.full((N,), math.inf)
    for rows, norms in oracle.seen:
        smallest[rows] = torch.minimum(smallest[rows], norms)
    assert torch.equal(torch.isfinite(smallest), res.success) and res.success.float().mean() >= 0.9
    assert torch.allclose(min_l2(res, x), smallest, rtol=1e-5), "the returned norm exceeds an example found earlier"
    assert sum(int(r.numel()) for r, _ in oracle.seen) > 5 * N, "ALMA keeps searching after its first adversarial iterate"
    pred = predict(tiny_model, res.x_adv)
    assert torch.equal(res.success, (pred == target) if targeted else (pred != y))
    assert res.x_adv.min() >= 0.0 and res.x_adv.max() <= 1.0


def test_targeted_success_means_the_target(tiny_model, batch) -> None:
    x, y = batch
    target = target_classes(torch.arange(N), y, 10, seed=0)
    res = ALMA(steps=100)(WhiteBoxOracle(tiny_model, N), x, y, eps=torch.full((N,), 1.0), norm="l2", target=target)
    pred = predict(tiny_model, res.x_adv)
    assert res.success.float().mean() >= 0.9
    assert (pred[res.success] == target[res.success]).all()
    assert torch.equal(res.x_adv[~res.success], x[~res.success])


def test_one_gradient_a_step_and_none_past_a_clean_adversarial(tiny_model, batch) -> None:
    x, y = batch
    oracle = WhiteBoxOracle(tiny_model, N)
    res = ALMA(steps=25)(oracle, x, y, eps=torch.full((N,), 0.5), norm="l2")
    clean_wrong = predict(tiny_model, x) != y
    assert clean_wrong.any() and not clean_wrong.all()
    assert torch.equal(oracle.grad_evals, torch.where(clean_wrong, 1, 25))
    assert torch.equal(res.x_adv[clean_wrong], x[clean_wrong]) and (res.first_success[clean_wrong] == 0).all()
    assert (res.first_success < ALMA(steps=25).strength_budget).all()


def test_a_samples_numbers_do_not_depend_on_its_batch(tiny_model, batch) -> None:
    x, y = batch
    whole = ALMA(steps=30)(WhiteBoxOracle(tiny_model, N), x, y, eps=torch.full((N,), 0.5), norm="l2")
    part = ALMA(steps=30)(WhiteBoxOracle(tiny_model, 7), x[20:27], y[20:27], eps=torch.full((7,), 0.5), norm="l2")
    assert torch.equal(part.success, whole.success[20:27])
    assert torch.allclose(part.x_adv, whole.x_adv[20:27], atol=1e-5)


def test_constraint_is_met_exactly_past_the_tolerance_and_ignores_logit_scale() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0], [1.0, 3.0, 0.0, -1.0], [1.0, 1.0, 0.0, -1.0]])
    y = torch.tensor([0, 0, 0])
    c = dlr_constraint(logits, y, None, 0.0)
    assert torch.allclose(c, torch.tensor([1 / 2, -2 / 3, 0.0]))  # (Z_y − max other) / (z_π1 − z_π3)
    assert dlr_constraint(logits, y, None, 1e-4)[2] > 0, "a tie does not meet the constraint"
    assert torch.allclose(dlr_constraint(3 * logits + 5, y, None, 0.0), c)
    target = torch.tensor([1, 1, 3])
    t = dlr_constraint(logits, y, target, 0.0)  # (max_{j≠t} Z_j − Z_t) / (z_π1 − (z_π3 + z_π4)/2)
    assert torch.allclose(t, torch.tensor([1 / 2.5, -2 / 3.5, 2 / 1.5]))
    with pytest.raises(AdvbenchError, match="needs >= 4 classes"):
        dlr_constraint(logits[:, :3], y, target.clamp(max=2), 0.0)


def test_penalty_slope_is_p2s_derivative() -> None:
    """P2(c) = μc + μρc² + ρ²c³/6 for c ≥ 0, μc/(1 − ρc) below (Birgin et al. 2005), by autograd."""
    c = torch.tensor([-3.0, -0.5, -1e-3, 0.0, 0.2, 2.0], dtype=torch.float64, requires_grad=True)
    rho = torch.tensor([1.0, 2.0, 1.2, 1.0, 3.0, 0.5], dtype=torch.float64)
    mu = torch.tensor([1.0, 0.3, 5.0, 2.0, 1.0, 1e-3], dtype=torch.float64)
    p2 = torch.where(c >= 0, mu * c + mu * rho * c ** 2 + rho ** 2 * c ** 3 / 6, mu * c / (1 - rho * c.clamp(max=0)))
    slope, = torch.autograd.grad(p2.sum(), c)
    assert torch.allclose(p2_slope(c.detach(), rho, mu), slope, rtol=1e-12)


@pytest.mark.parametrize(("name", "value"), [("steps", 0), ("lr_reduction", 0.0), ("lr_reduction", 1.5),
                                             ("alpha", 1.0), ("tau", 0.0), ("gamma", 0.9), ("mu_init", 0.0),
                                             ("logit_tolerance", -1e-4), ("check_steps", 2.5)])
def test_bad_hyperparameters_are_refused_in_one_line(name: str, value: object) -> None:
    with pytest.raises(AdvbenchError) as err:
        ALMA(**{name: value})
    assert str(err.value).startswith(f"ALMA: {name} must be") and "\n" not in str(err.value)


def test_linf_is_refused_with_one_line(tiny_model, batch) -> None:
    x, y = batch
    with pytest.raises(AdvbenchError) as err:
        ALMA()(WhiteBoxOracle(tiny_model, N), x, y, eps=torch.full((N,), 0.1), norm="linf")
    assert str(err.value) == "ALMA supports norms l2, got 'linf'"


def test_transfer_counts_only_what_the_target_says(tiny_model, batch) -> None:
    """On the substitute as its own target the transfer run is the white-box one; a target that
    always says 0 is fooled, at x itself, exactly on the samples labelled otherwise."""
    x, y = batch
    eps = torch.full((N,), 0.8)
    white = ALMA(steps=30)(WhiteBoxOracle(tiny_model, N), x, y, eps=eps, norm="l2")
    same = TransferOracle(Shifted(tiny_model, 3.0), N, substitute=tiny_model)
    res = ALMA(steps=30)(same, x, y, eps=eps, norm="l2")
    assert torch.equal(res.success, white.success) and torch.allclose(res.x_adv, white.x_adv, atol=1e-6)
    assert (same.queries > 0).all()
    zero = ALMA(steps=30)(TransferOracle(AlwaysZero(), N, substitute=tiny_model), x, y, eps=eps, norm="l2")
    assert torch.equal(zero.success, y != 0) and torch.equal(zero.x_adv, x)


def test_bounds_are_the_oracles(tiny_model, batch) -> None:
    """A model on [0, 0.9] keeps every iterate, hence the result, inside [0, 0.9]."""
    x, y = batch
    narrow = Shifted(tiny_model, 0.0)
    narrow.bounds = (0.0, 0.9)
    x = x.clamp(0.0, 0.9)
    res = ALMA(steps=30)(WhiteBoxOracle(narrow, N), x, y, eps=torch.full((N,), 0.8), norm="l2")
    assert res.x_adv.min() >= 0.0 and res.x_adv.max() <= 0.9 and res.success.any()


@pytest.mark.slow
@pytest.mark.parametrize("targeted", [False, True])
def test_as_strong_as_ddn_on_digits(targeted: bool, tiny_model, digits_tensors) -> None:
    """Both at their catalogue defaults (ALMA 1000 steps, DDN 100) on 100 test digits. Measured:
    untargeted median 0.511 (ALMA) vs 0.522 (DDN), targeted 0.900 vs 0.904, 100% found by both."""
    _, _, x, y = digits_tensors
    n = 100
    x, y = x[:n], y[:n]
    target = target_classes(torch.arange(n), y, 10, seed=0) if targeted else None
    eps = torch.full((n,), 1.0)
    oracle = WhiteBoxOracle(tiny_model, n)
    alma = ALMA()(oracle, x, y, eps=eps, norm="l2", target=target)
    ddn = DDN()(WhiteBoxOracle(tiny_model, n), x, y, eps=eps, norm="l2", target=target)
    ours, theirs = min_l2(alma, x), min_l2(ddn, x)
    assert alma.success.float().mean() >= ddn.success.float().mean()
    assert float(ours.median()) <= 1.03 * float(theirs.median()), f"ALMA {ours.median():.4f} vs DDN {theirs.median():.4f}"
    assert (oracle.grad_evals <= ALMA().steps).all()
