"""FMN (Pintor et al. 2021): what is its own beyond the catalogue's contract (tests/test_attacks.py).

It keeps the smallest adversarial iterate it judged, so the returned norm never exceeds one it
saw earlier; targeted success means the target; it costs one gradient a step; its radius rule
grows ε before a first adversarial (without the growth, ℓ2 found 17% of the digits); the box is
the oracle's; a bad step-size schedule is refused in one line, from Python and the CLI.
The cross-check against Foolbox's FMN is in tests/test_crosscheck_fmn.py (slow).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from test_ddn import Watched, predict
from test_errors_more import SMOKE, invoke, one_line
from test_minimum_norm import AlwaysZero, Shifted

from advbench.core.errors import AdvbenchError
from advbench.core.steps import lp_norm
from advbench.robustness.attacks.fmn import FMN, next_radius
from advbench.robustness.attacks.oracles import TransferOracle, WhiteBoxOracle
from advbench.robustness.data.target_classes import target_classes

pytestmark = pytest.mark.usefixtures("one_thread")

N = 60
NORMS = ["linf", "l2", "l1"]


@pytest.fixture(scope="module")
def batch(digits_tensors) -> tuple[torch.Tensor, torch.Tensor]:
    _, _, x, y = digits_tensors
    return x[:N], y[:N]


@pytest.mark.parametrize("targeted", [False, True])
@pytest.mark.parametrize("norm", NORMS)
def test_returned_norm_is_the_smallest_adversarial_iterate_seen(norm: str, targeted: bool, tiny_model, batch) -> None:
    x, y = batch
    target = target_classes(torch.arange(N), y, 10, seed=0) if targeted else None
    oracle = Watched(tiny_model, N, x, norm)
    res = FMN(steps=40)(oracle, x, y, eps=torch.full((N,), 1e3), norm=norm, target=target)
    smallest = torch.full((N,), math.inf)
    for rows, norms in oracle.seen:
        smallest[rows] = torch.minimum(smallest[rows], norms)
    returned = torch.where(res.success, lp_norm(res.x_adv - x, norm), torch.full((N,), math.inf))
    assert torch.equal(torch.isfinite(smallest), res.success)
    assert torch.allclose(returned, smallest, rtol=1e-5), "the returned norm exceeds an example found earlier"
    assert sum(int(r.numel()) for r, _ in oracle.seen) > 2 * N, "FMN keeps searching after its first adversarial iterate"
    assert res.success.float().mean() >= 0.95, f"found {res.success.float().mean():.0%} in 40 steps"
    pred = predict(tiny_model, res.x_adv)
    assert torch.equal(res.success, (pred == target) if targeted else (pred != y))


@pytest.mark.parametrize("norm", NORMS)
def test_targeted_success_means_the_target(norm: str, tiny_model, batch) -> None:
    x, y = batch
    target = target_classes(torch.arange(N), y, 10, seed=0)
    res = FMN()(WhiteBoxOracle(tiny_model, N), x, y, eps=torch.full((N,), 1.0), norm=norm, target=target)
    pred = predict(tiny_model, res.x_adv)
    assert res.success.float().mean() >= 0.9
    assert (pred[res.success] == target[res.success]).all()
    assert torch.equal(res.x_adv[~res.success], x[~res.success])


@pytest.mark.parametrize("norm", NORMS)
def test_one_gradient_a_step_and_none_past_a_clean_adversarial(norm: str, tiny_model, batch) -> None:
    x, y = batch
    oracle = WhiteBoxOracle(tiny_model, N)
    res = FMN(steps=25)(oracle, x, y, eps=torch.full((N,), 0.5), norm=norm)
    clean_wrong = predict(tiny_model, x) != y
    assert clean_wrong.any() and not clean_wrong.all()
    assert torch.equal(oracle.grad_evals, torch.where(clean_wrong, 1, 25))
    assert (oracle.queries == 0).all(), "the white-box verdict reads the logits the gradient call returned"
    assert torch.equal(res.x_adv[clean_wrong], x[clean_wrong]) and (res.first_success[clean_wrong] == 0).all()
    assert (res.first_success < FMN(steps=25).strength_budget).all()


def test_radius_rule() -> None:
    """Shrink while adversarial (never above the smallest norm found), grow once one was found,
    and before that take the larger of the boundary estimate and the grown radius."""
    radius = torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0])
    hit = torch.tensor([True, True, False, False, False])
    smallest = torch.tensor([0.5, 2.0, 0.7, math.inf, math.inf])
    reach = torch.tensor([9.0, 9.0, 9.0, 3.0, 0.2])
    got = next_radius(radius, hit, smallest, reach, 0.1)
    assert torch.allclose(got, torch.tensor([0.5, 0.9, 1.1, 3.0, 1.1]))
    first = next_radius(torch.zeros(2), torch.tensor([False, False]), torch.full((2,), math.inf), torch.tensor([0.3, 0.4]), 0.1)
    assert torch.allclose(first, torch.tensor([0.3, 0.4])), "the first radius is the boundary estimate"


@pytest.mark.parametrize("norm", NORMS)
def test_transfer_counts_only_what_the_target_says(norm: str, tiny_model, batch) -> None:
    """On the substitute as its own target the transfer run is the white-box one; a target that
    always says 0 is fooled, at x itself, exactly on the samples labelled otherwise."""
    x, y = batch
    eps = torch.full((N,), 0.3)
    white = FMN(steps=30)(WhiteBoxOracle(tiny_model, N), x, y, eps=eps, norm=norm)
    same = TransferOracle(Shifted(tiny_model, 3.0), N, substitute=tiny_model)
    res = FMN(steps=30)(same, x, y, eps=eps, norm=norm)
    assert torch.equal(res.success, white.success) and torch.allclose(res.x_adv, white.x_adv, atol=1e-6)
    assert (same.queries > 0).all()
    zero = FMN(steps=30)(TransferOracle(AlwaysZero(), N, substitute=tiny_model), x, y, eps=eps, norm=norm)
    assert torch.equal(zero.success, y != 0) and torch.equal(zero.x_adv, x)


@pytest.mark.parametrize("norm", NORMS)
def test_bounds_are_the_oracles(norm: str, tiny_model, batch) -> None:
    """A model on [0, 0.9] keeps every iterate, hence the result, inside [0, 0.9]."""
    x, y = batch
    narrow = Shifted(tiny_model, 0.0)
    narrow.bounds = (0.0, 0.9)
    x = x.clamp(0.0, 0.9)
    res = FMN(steps=30)(WhiteBoxOracle(narrow, N), x, y, eps=torch.full((N,), 0.3), norm=norm)
    assert res.x_adv.min() >= 0.0 and res.x_adv.max() <= 0.9 and res.success.any()


def test_a_final_step_above_the_first_is_refused_in_one_line() -> None:
    with pytest.raises(AdvbenchError) as err:
        FMN(max_stepsize=0.5, min_stepsize=0.6)
    assert str(err.value) == "FMN: min_stepsize must be at most max_stepsize (0.5), got 0.6"
    assert FMN(max_stepsize=0.5, min_stepsize=0.5).min_stepsize == 0.5


def test_a_bad_schedule_fails_on_the_cli_before_any_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    result = invoke(tmp_path, monkeypatch, *SMOKE, "attack=fmn", "attack.params.min_stepsize=2",
                    f"out_dir={tmp_path / 'out'}")
    one_line(result, "min_stepsize must be at most max_stepsize (1), got 2")
    assert not (tmp_path / "cache").exists() and not (tmp_path / "out" / "records").exists()
