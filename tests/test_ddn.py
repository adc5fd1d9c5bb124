"""DDN (Rony et al. 2019): what is its own beyond the catalogue's contract (tests/test_attacks.py).

It keeps the smallest adversarial iterate it judged, so the returned norm never exceeds one it
saw earlier; targeted success means the target; it attacks ℓ2 only; it costs one gradient a
step; a vanishing gradient becomes a random direction keyed by sample, not batch position.
The cross-check against Foolbox's DDN is in tests/test_crosscheck_ddn.py (slow).
"""

from __future__ import annotations

import math

import pytest
import torch
from test_minimum_norm import AlwaysZero, Shifted

from advbench.core.errors import AdvbenchError
from advbench.core.steps import cosine_anneal, lp_norm
from advbench.robustness.attacks.ddn import DDN
from advbench.robustness.attacks.minimum_norm import unit_l2
from advbench.robustness.attacks.oracles import TransferOracle, WhiteBoxOracle
from advbench.robustness.data.target_classes import target_classes

pytestmark = pytest.mark.usefixtures("one_thread")

N = 60


@pytest.fixture(scope="module")
def batch(digits_tensors) -> tuple[torch.Tensor, torch.Tensor]:
    _, _, x, y = digits_tensors
    return x[:N], y[:N]


class Watched(WhiteBoxOracle):
    """A white-box oracle that keeps the `norm` of every iterate its verdict called adversarial."""

    def __init__(self, model, n: int, x: torch.Tensor, norm: str = "l2") -> None:
        super().__init__(model, n)
        self.x, self.norm = x, norm
        self.seen: list[tuple[torch.Tensor, torch.Tensor]] = []  # (batch rows, norms) of adversarial iterates

    def verdict(self, x, y, target, idx, logits=None, undated=None):
        met = super().verdict(x, y, target, idx, logits, undated)
        self.seen.append((idx[met], lp_norm(x[met] - self.x[idx[met]], self.norm)))
        return met


def predict(model, x: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return model(x).argmax(dim=1)


@pytest.mark.parametrize("targeted", [False, True])
def test_returned_norm_is_the_smallest_adversarial_iterate_seen(targeted: bool, tiny_model, batch) -> None:
    x, y = batch
    target = target_classes(torch.arange(N), y, 10, seed=0) if targeted else None
    oracle = Watched(tiny_model, N, x)
    res = DDN(steps=40)(oracle, x, y, eps=torch.full((N,), 1e3), norm="l2", target=target)
    smallest = torch.full((N,), math.inf)
    for rows, norms in oracle.seen:
        smallest[rows] = torch.minimum(smallest[rows], norms)
    returned = torch.where(res.success, lp_norm(res.x_adv - x, "l2"), torch.full((N,), math.inf))
    assert torch.equal(torch.isfinite(smallest), res.success)
    assert torch.allclose(returned, smallest, rtol=1e-5), "the returned norm exceeds an example found earlier"
    assert sum(int(r.numel()) for r, _ in oracle.seen) > 2 * N, "DDN keeps searching after its first adversarial iterate"
    pred = predict(tiny_model, res.x_adv)
    assert torch.equal(res.success, (pred == target) if targeted else (pred != y))


def test_targeted_success_means_the_target(tiny_model, batch) -> None:
    x, y = batch
    target = target_classes(torch.arange(N), y, 10, seed=0)
    res = DDN()(WhiteBoxOracle(tiny_model, N), x, y, eps=torch.full((N,), 1.0), norm="l2", target=target)
    pred = predict(tiny_model, res.x_adv)
    assert res.success.float().mean() >= 0.9
    assert (pred[res.success] == target[res.success]).all()
    assert torch.equal(res.x_adv[~res.success], x[~res.success])


def test_linf_is_refused_with_one_line(tiny_model, batch) -> None:
    x, y = batch
    assert DDN().unsupported("linf", "white", "untargeted") == "DDN supports norms l2, got 'linf'"
    with pytest.raises(AdvbenchError) as err:
        DDN()(WhiteBoxOracle(tiny_model, N), x, y, eps=torch.full((N,), 0.1), norm="linf")
    assert "\n" not in str(err.value) and "l2" in str(err.value)


def test_one_gradient_a_step_and_none_past_a_clean_adversarial(tiny_model, batch) -> None:
    x, y = batch
    oracle = WhiteBoxOracle(tiny_model, N)
    res = DDN(steps=25)(oracle, x, y, eps=torch.full((N,), 0.5), norm="l2")
    clean_wrong = predict(tiny_model, x) != y
    assert clean_wrong.any() and not clean_wrong.all()
    assert torch.equal(oracle.grad_evals, torch.where(clean_wrong, 1, 25))
    assert torch.equal(res.x_adv[clean_wrong], x[clean_wrong]) and (res.first_success[clean_wrong] == 0).all()
    assert (res.first_success < DDN(steps=25).strength_budget).all()


def test_stepsize_anneals_on_a_cosine_from_1_to_0_01() -> None:
    sizes = [cosine_anneal(i, 100, 1.0, 0.01) for i in range(100)]
    assert sizes[0] == 1.0 and sizes[50] == pytest.approx(0.505)
    assert all(a > b for a, b in zip(sizes, sizes[1:])) and sizes[-1] > 0.01


def test_a_zero_gradient_becomes_a_random_direction_keyed_by_sample() -> None:
    grad = torch.zeros(4, 1, 3, 3)
    grad[1] = 2.0
    ids = torch.tensor([7, 8, 9, 10])
    unit = unit_l2(grad, 3, ids)
    assert torch.allclose(lp_norm(unit, "l2"), torch.ones(4))
    assert torch.allclose(unit[1], torch.full((1, 3, 3), 1 / 3))
    alone = unit_l2(grad[2:3], 3, ids[2:3])
    assert torch.equal(unit[2:3], alone), "a sample's draw does not depend on its batch"
    assert not torch.equal(unit[0], unit[2]) and not torch.equal(unit_l2(grad, 4, ids)[0], unit[0])


def test_transfer_counts_only_what_the_target_says(tiny_model, batch) -> None:
    """On the substitute as its own target the transfer run is the white-box one; a target that
    always says 0 is fooled, at x itself, exactly on the samples labelled otherwise."""
    x, y = batch
    eps = torch.full((N,), 0.8)
    white = DDN(steps=30)(WhiteBoxOracle(tiny_model, N), x, y, eps=eps, norm="l2")
    same = TransferOracle(Shifted(tiny_model, 3.0), N, substitute=tiny_model)
    res = DDN(steps=30)(same, x, y, eps=eps, norm="l2")
    assert torch.equal(res.success, white.success) and torch.allclose(res.x_adv, white.x_adv, atol=1e-6)
    assert (same.queries > 0).all()
    zero = DDN(steps=30)(TransferOracle(AlwaysZero(), N, substitute=tiny_model), x, y, eps=eps, norm="l2")
    assert torch.equal(zero.success, y != 0) and torch.equal(zero.x_adv, x)


def test_bounds_are_the_oracles(tiny_model, batch) -> None:
    """A model on [0, 0.9] keeps every iterate, hence the result, inside [0, 0.9]."""
    x, y = batch
    narrow = Shifted(tiny_model, 0.0)
    narrow.bounds = (0.0, 0.9)
    x = x.clamp(0.0, 0.9)
    res = DDN(steps=30)(WhiteBoxOracle(narrow, N), x, y, eps=torch.full((N,), 0.8), norm="l2")
    assert res.x_adv.min() >= 0.0 and res.x_adv.max() <= 0.9 and res.success.any()
