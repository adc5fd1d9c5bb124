"""EAD (Chen et al. 2018): what is its own beyond the catalogue's contract (tests/test_attacks.py).

Its projected shrinkage-thresholding; the minimum-norm contract under ℓ1, untargeted and targeted,
white-box and crafted on a substitute (`l1_transfer`), on a short schedule; one gradient evaluation
and one forward a step, counted; the returned ℓ1 norm is the smallest of the adversarial iterates it
judged; the two decision rules pick from the same iterates, each the smallest in its own distance; κ
holds on every example kept; β moves EAD towards the ℓ1 optimum of the linear model
(tests/test_known_optimum.py); any norm but ℓ1 is refused in one line. The cross-check against
Foolbox's EADAttack is in tests/test_crosscheck_ead.py (slow).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from test_ddn import Watched, predict
from test_errors_more import SMOKE, invoke, one_line
from test_known_optimum import N as LINEAR_N
from test_known_optimum import problem  # noqa: F401  (the linear model's fixture)

from advbench.core.errors import AdvbenchError
from advbench.core.norms import L1_NORM
from advbench.robustness.attacks.ead import EAD, elastic_net, shrink
from advbench.robustness.attacks.minimum_norm import goal_margin
from advbench.robustness.attacks.oracles import TransferOracle, WhiteBoxOracle
from advbench.robustness.data.target_classes import target_classes

pytestmark = pytest.mark.usefixtures("one_thread")

N = 60
SHORT = {"iterations": 100, "binary_search_steps": 5, "initial_const": 0.1}


@pytest.fixture(scope="module")
def batch(digits_tensors) -> tuple[torch.Tensor, torch.Tensor]:
    _, _, x, y = digits_tensors
    return x[:N], y[:N]


def test_shrink_moves_each_coordinate_beta_towards_the_input_within_the_box() -> None:
    x = torch.tensor([[0.5, 0.5, 0.5, 0.0, 1.0, 0.5]])
    z = torch.tensor([[0.8, 0.2, 0.505, -0.3, 1.4, 0.495]])
    assert torch.allclose(shrink(z, x, 0.01, (0.0, 1.0)), torch.tensor([[0.79, 0.21, 0.5, 0.0, 1.0, 0.5]]))


@pytest.mark.parametrize("targeted", [False, True])
def test_contract_and_cost(targeted: bool, tiny_model, batch) -> None:
    """In the box, x itself where nothing was found, success exactly where the model agrees (the
    target where targeted), first_success dating exactly the examples within eps; one gradient and
    one forward a step (plus the clean forward), within the declared budget, none for a sample
    adversarial as it is."""
    x, y = batch
    target = target_classes(torch.arange(N), y, 10, seed=0) if targeted else None
    eps = torch.linspace(0.2, 1.5, N) * (4.5 if targeted else 1.5)
    attack = EAD(**SHORT)
    oracle = WhiteBoxOracle(tiny_model, N)
    res = attack(oracle, x, y, eps=eps, norm="l1", target=target)
    assert res.x_adv.min() >= 0 and res.x_adv.max() <= 1
    pred = predict(tiny_model, res.x_adv)
    assert torch.equal(res.success, (pred == target) if targeted else (pred != y))
    assert torch.equal(res.x_adv[~res.success], x[~res.success])
    d = L1_NORM.distance(res.x_adv, x)
    assert torch.equal(res.first_success >= 0, res.success & (d <= eps))
    assert bool((d[res.success] > eps[res.success]).any()), "eps must not cap a minimum-norm attack"
    assert res.success.float().mean() >= (0.8 if targeted else 0.95), f"found {res.success.float().mean():.0%}"
    declared = attack.declared_cost("white", "targeted" if targeted else "untargeted", 10).grad_evals
    assert declared == attack.strength_budget == 500
    already = predict(tiny_model, x) == target if targeted else predict(tiny_model, x) != y
    assert (oracle.grad_evals <= declared).all() and torch.equal(oracle.grad_evals == 0, already)
    assert torch.equal(oracle.queries, oracle.grad_evals + 1), "one forward a step judges its iterate"
    assert (res.first_success <= oracle.grad_evals).all()


@pytest.mark.parametrize("targeted", [False, True])
def test_under_l1_transfer_it_optimises_the_substitute_and_the_target_judges(targeted: bool, tiny_model, substitute,
                                                                             batch) -> None:
    """`l1_transfer`: every gradient is the substitute's, every iterate judged by one counted label of the
    target, so success is the target's verdict on the example returned (x where none fooled it)."""
    x, y = batch
    target = target_classes(torch.arange(N), y, 10, seed=0) if targeted else None
    eps = torch.linspace(0.2, 1.5, N) * (4.5 if targeted else 1.5)
    attack = EAD(**SHORT)
    oracle = TransferOracle(tiny_model, N, substitute=substitute)
    res = attack(oracle, x, y, eps=eps, norm="l1", target=target)
    assert res.x_adv.min() >= 0 and res.x_adv.max() <= 1
    pred = predict(tiny_model, res.x_adv)
    assert torch.equal(res.success, (pred == target) if targeted else (pred != y))
    assert torch.equal(res.x_adv[~res.success], x[~res.success])
    assert torch.equal(res.first_success >= 0, res.success & (L1_NORM.distance(res.x_adv, x) <= eps))
    assert res.success.float().mean() > 0.3, f"found {res.success.float().mean():.0%}"
    assert (oracle.grad_evals <= attack.strength_budget).all()
    assert torch.equal(oracle.queries, oracle.grad_evals + 1), "one label of the target a step judges its iterate"


@pytest.mark.parametrize("targeted", [False, True])
def test_returned_norm_is_the_smallest_adversarial_iterate_judged(targeted: bool, tiny_model, batch) -> None:
    x, y = batch
    target = target_classes(torch.arange(N), y, 10, seed=0) if targeted else None
    oracle = Watched(tiny_model, N, x, "l1")
    res = EAD(**SHORT)(oracle, x, y, eps=torch.full((N,), 1e3), norm="l1", target=target)
    smallest = torch.full((N,), math.inf)
    for rows, norms in oracle.seen:
        smallest[rows] = torch.minimum(smallest[rows], norms)
    returned = torch.where(res.success, L1_NORM.distance(res.x_adv, x), torch.full((N,), math.inf))
    assert torch.equal(torch.isfinite(smallest), res.success)
    assert torch.allclose(returned, smallest, rtol=1e-5)


def test_each_decision_rule_keeps_the_smallest_in_its_own_distance(tiny_model, batch) -> None:
    """The rule only picks among iterates (the c search follows success, not the rule), so both rules
    see the same ones: the L1 rule's example has the smaller ℓ1 norm, the EN rule's the smaller
    elastic-net distance, and they differ on some samples."""
    x, y = batch
    eps = torch.full((N,), 1e3)
    beta = 0.01
    l1 = EAD(**SHORT, beta=beta)(WhiteBoxOracle(tiny_model, N), x, y, eps=eps, norm="l1")
    en = EAD(**SHORT, beta=beta, decision_rule="EN")(WhiteBoxOracle(tiny_model, N), x, y, eps=eps, norm="l1")
    assert torch.equal(l1.success, en.success)
    s = l1.success
    d_l1, d_en = (L1_NORM.distance(r.x_adv, x)[s] for r in (l1, en))
    e_l1, e_en = (elastic_net(r.x_adv - x, beta)[s] for r in (l1, en))
    assert (d_l1 <= d_en * (1 + 1e-6)).all() and (e_en <= e_l1 * (1 + 1e-6)).all()
    assert (d_l1 < d_en * (1 - 1e-3)).any(), "the rules should keep different iterates somewhere"


def test_confidence_holds_on_every_kept_example(tiny_model, batch) -> None:
    x, y = batch
    res = EAD(**SHORT, confidence=2.0)(WhiteBoxOracle(tiny_model, N), x, y, eps=torch.full((N,), 1.0), norm="l1")
    with torch.inference_mode():
        margin = goal_margin(tiny_model(res.x_adv), y, None)
    assert res.success.float().mean() >= 0.9
    assert (margin[res.success] <= -2.0 + 1e-4).all()


def test_a_larger_beta_comes_closer_to_the_l1_optimum(problem) -> None:  # noqa: F811
    """On the linear model (median norm / boxed ℓ1 optimum, measured): β = 1e-3 (the paper's) 1.44,
    β = 1e-2 (Foolbox's default) 1.09, as Foolbox 3.3.4's EADAttack at each (1.45, 1.09)."""
    model, x, y, costs = problem
    optimum = costs["l1"].amin(dim=1)
    ratio = {}
    for beta in (1e-3, 1e-2):
        res = EAD(beta=beta)(WhiteBoxOracle(model, LINEAR_N), x, y, eps=torch.ones(LINEAR_N), norm="l1")
        assert res.success.all()
        ratio[beta] = float((L1_NORM.distance(res.x_adv, x) / optimum).median())
    assert 1 <= ratio[1e-2] <= 1.15 and ratio[1e-2] < ratio[1e-3] - 0.2, ratio


def test_norms_but_l1_are_refused_in_one_line(tiny_model, batch, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    x, y = batch
    with pytest.raises(AdvbenchError, match="EAD supports norms l1, got 'l2'"):
        EAD(**SHORT)(WhiteBoxOracle(tiny_model, N), x, y, eps=torch.ones(N), norm="l2")
    result = invoke(tmp_path, monkeypatch, *SMOKE, "attack=ead", "threat=l2", f"out_dir={tmp_path / 'out'}")
    one_line(result, "EAD supports norms l1, got 'l2'")
