"""ZOO and NATTACK (score-based): exact per-sample query counts, bounds and budgets, targets,
determinism and batch independence, logits only, strength on the natural digits model.

The catalogue contract (tests/test_attacks.py) runs both at short settings (NATTACK in pixel
space); these tests also hold NATTACK's default arctanh box and ZOO's search over c to it.
"""

from __future__ import annotations

import pytest
import torch
from contract import (
    assert_budgeted_contract,
    assert_minimizing_contract,
    assert_seeded_and_batch_independent,
)
from test_score import CountingModel
from torch import nn

from advbench.core.errors import AdvbenchError
from advbench.core.steps import lp_norm
from advbench.robustness.attacks.nattack import NATTACK
from advbench.robustness.attacks.oracles import ScoreOracle, WhiteBoxOracle
from advbench.robustness.attacks.zeroth_order import ZOO
from advbench.robustness.data.target_classes import target_classes

BUDGETS = {"linf": 0.1, "l2": 0.8}


@pytest.fixture(scope="module")
def batch(digits_tensors):
    _, _, x, y = digits_tensors
    return x[:60], y[:60]


def _clean_adversarial(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return model(x).argmax(1) != y


def test_zoo_counts_every_query_and_spends_exactly_its_steps(tiny_model, batch) -> None:
    """16 coordinates: 33 queries a step, so 300 queries pay the clean check and 9 steps."""
    x, y = batch
    stub = CountingModel(tiny_model, x)
    oracle = ScoreOracle(stub, len(y))
    eps = torch.full((len(y),), 1.0)
    res = ZOO(n_queries=300, coordinates=16, lr=0.1, checkpoints=(100, 200))(oracle, x, y, eps=eps, norm="l2")
    assert torch.equal(oracle.queries, stub.seen), "the oracle counts every row the model saw, per sample"
    spent = torch.where(_clean_adversarial(tiny_model, x, y), 1, 1 + 9 * 33)
    assert torch.equal(oracle.queries, spent), "a sample already adversarial stops at its clean check"
    assert_minimizing_contract(res, tiny_model, x, y, eps, "l2", None)
    dated = res.first_success > 1
    assert dated.any() and ((res.first_success[dated] - 1) % 33 == 0).all(), "dated at a checked iterate"
    found = torch.where(res.success, lp_norm(res.x_adv - x, "l2"), torch.inf)
    curve = torch.stack([res.info[f"norm_at_{q}"] for q in (100, 200, 300)], dim=1)
    assert set(res.info) == {"norm_at_100", "norm_at_200", "norm_at_300"} and torch.equal(curve[:, -1], found)
    assert (curve[:, 1:] <= curve[:, :-1]).all() and (curve[:, 0] > found).any(), "the best norm falls with queries"
    assert not stub.autograd_reachable


def test_zoo_search_over_c_stays_within_the_budget(tiny_model, batch) -> None:
    """Three optimisations of at most 8 steps, each ended early when its loss rose over 2 steps: each
    sample ends its search on its own, queries still exact."""
    x, y = batch
    stub = CountingModel(tiny_model, x)
    oracle = ScoreOracle(stub, len(y))
    eps = torch.full((len(y),), 0.5)
    attack = ZOO(n_queries=1000, coordinates=16, lr=0.1, binary_search_steps=3, iterations=8, abort_every=2)
    res = attack(oracle, x, y, eps=eps, norm="l2")
    # δ grows beyond the gaps between digits here, so the stub can only vouch for the total
    assert int(oracle.queries.sum()) == int(stub.seen.sum()) and (oracle.queries <= 1 + 24 * 33).all()
    assert ((oracle.queries - 1) % 33 == 0).all()
    searched = oracle.queries[~_clean_adversarial(tiny_model, x, y)]
    assert (searched < 1 + 24 * 33).any(), "a stalled optimisation moves on to the next c early"
    assert_minimizing_contract(res, tiny_model, x, y, eps, "l2", None)
    assert res.success.float().mean() > 0.5


def test_zoo_estimates_the_objective_gradient_coordinate_by_coordinate() -> None:
    """On a linear model (float64) the symmetric differences are the C&W objective's exact partials."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 4)).double()
    x = 0.2 + 0.6 * torch.rand(3, 1, 4, 4, dtype=torch.float64)
    delta = 0.01 * torch.randn(3, 16, dtype=torch.float64)
    const = torch.tensor([0.7, 2.0, 5.0], dtype=torch.float64)
    top2 = model(x + delta.view_as(x)).topk(2, dim=1)
    y = top2.indices[:, 0]  # the margin is positive and no σ-step changes which class is the runner-up
    assert (top2.values[:, 0] - top2.values[:, 1] > 1e-3).all()
    attack = ZOO(coordinates=5)
    coords = torch.tensor([[0, 3, 5, 9, 15], [1, 2, 4, 8, 14], [6, 7, 10, 11, 12]])
    grad = attack._coordinate_grad(ScoreOracle(model, 3), x, delta, coords, y, None, const, torch.arange(3))
    d = delta.clone().requires_grad_(True)
    xa = x + d.view_as(x)
    z = model(xa)
    loss = (d.square().sum(1) + const * (z.gather(1, y[:, None]).squeeze(1)
                                         - z.scatter(1, y[:, None], -1e9).amax(1)).clamp_min(0)).sum()
    exact, = torch.autograd.grad(loss, d)
    assert torch.allclose(grad, exact.gather(1, coords), rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("norm", ["linf", "l2"])
def test_nattack_counts_every_query_and_stays_within_the_budget(norm: str, tiny_model, batch) -> None:
    """10 draws and the mean: 11 queries a step, so 100 queries pay the clean check and 9 steps."""
    x, y = batch
    stub = CountingModel(tiny_model, x)
    oracle = ScoreOracle(stub, len(y))
    eps = torch.full((len(y),), BUDGETS[norm])
    attack = NATTACK(n_queries=100, samples=10)
    res = attack(oracle, x, y, eps=eps, norm=norm)
    assert torch.equal(oracle.queries, stub.seen)
    assert torch.equal(oracle.queries[~res.success], torch.full_like(oracle.queries[~res.success], 100))
    assert torch.equal(oracle.queries[res.success], res.first_success[res.success]), "stops at its breaking query"
    assert ((res.first_success[res.success] - 1) % 11 == 0).all()
    assert_budgeted_contract(attack, res, oracle, tiny_model, x, y, eps, norm, None)
    assert (oracle.queries <= attack.n_queries).all() and not stub.autograd_reachable
    assert res.success.any() and (~res.success).any()


@pytest.mark.parametrize("name", ["zoo", "nattack"])
def test_targeted_success_means_the_target(name: str, tiny_model, batch) -> None:
    x, y = batch
    target = target_classes(torch.arange(len(y)), y, 10, seed=0)
    eps = torch.full((len(y),), 2.0)
    oracle = ScoreOracle(tiny_model, len(y))
    if name == "zoo":
        res = ZOO(n_queries=331, coordinates=16, lr=0.1)(oracle, x, y, eps=eps, norm="l2", target=target)
        assert_minimizing_contract(res, tiny_model, x, y, eps, "l2", target)
    else:
        attack = NATTACK(n_queries=232, samples=10)
        res = attack(oracle, x, y, eps=eps, norm="l2", target=target)
        assert_budgeted_contract(attack, res, oracle, tiny_model, x, y, eps, "l2", target)
    assert res.success.float().mean() > 0.2
    assert (tiny_model(res.x_adv[res.success]).argmax(1) == target[res.success]).all()


RUNS = {"zoo": (lambda seed: ZOO(n_queries=331, coordinates=16, lr=0.1, seed=seed), "l2", 0.5),
        "nattack": (lambda seed: NATTACK(n_queries=100, samples=10, seed=seed), "l2", 0.8)}


@pytest.mark.parametrize("name", sorted(RUNS))
def test_deterministic_under_a_seed_and_independent_of_the_batch(name: str, tiny_model, batch) -> None:
    x, y = batch
    make, norm, radius = RUNS[name]
    eps = torch.full((len(y),), radius)

    def run(seed: int, rows: torch.Tensor):
        return make(seed)(ScoreOracle(tiny_model, len(rows)), x[rows], y[rows], eps=eps[rows], norm=norm,
                          sample_id=rows)

    assert_seeded_and_batch_independent(run, len(y), (3, 41))


def test_both_take_scores_only(tiny_model, batch) -> None:
    x, y = batch
    eps = torch.full((len(y),), 0.5)
    for attack in (ZOO(n_queries=10), NATTACK(n_queries=10)):
        with pytest.raises(AdvbenchError, match="score"):
            attack(WhiteBoxOracle(tiny_model, len(y)), x, y, eps=eps, norm="l2")
    with pytest.raises(AdvbenchError, match="norms"):
        ZOO(n_queries=10)(ScoreOracle(tiny_model, len(y)), x, y, eps=eps, norm="linf")
    with pytest.raises(AdvbenchError, match="box"):
        NATTACK(box="sphere")


def test_zoo_finds_small_examples_on_the_natural_digits_model(tiny_model, batch) -> None:
    """With no attack the median minimum ℓ2 of the correctly classified samples is inf and accuracy at ε is
    the clean one; ZOO within 10 steps (1,291 queries; Adam step 0.02) brings the median below ε = 0.8 and
    accuracy at ε far below clean (0.77 and 43% vs 98% when written; 0.53 at the default 20,000)."""
    x, y = batch
    correct = ~_clean_adversarial(tiny_model, x, y)
    res = ZOO(n_queries=1291, lr=0.02)(ScoreOracle(tiny_model, len(y)), x, y, eps=torch.full((len(y),), 0.8),
                                       norm="l2")
    norms = torch.where(res.success, lp_norm(res.x_adv - x, "l2"), torch.inf)[correct]
    assert float(norms.median()) < 0.8, f"median minimum l2 {float(norms.median()):.3f}"
    robust = float((norms > 0.8).float().sum() / len(y))
    assert robust < float(correct.float().mean()) - 0.4, f"robust accuracy {robust:.2f}"


@pytest.mark.parametrize(("norm", "box"), [("l2", "tanh"), ("linf", "clip")])
def test_nattack_lowers_accuracy_on_the_natural_digits_model(norm: str, box: str, tiny_model, batch) -> None:
    """19 steps of 20 draws. ℓ∞ in pixel space: the arctanh box leaves digits' saturated pixels where they
    are (95% robust vs 98% clean at ε∞ = 0.1 when written, 62% with box=clip)."""
    x, y = batch
    clean = float((~_clean_adversarial(tiny_model, x, y)).float().mean())
    res = NATTACK(n_queries=400, samples=20, box=box)(ScoreOracle(tiny_model, len(y)), x, y,
                                                      eps=torch.full((len(y),), BUDGETS[norm]), norm=norm)
    robust = float((~res.success).float().mean())
    assert robust < clean - 0.2, f"robust accuracy {robust:.2f} vs clean {clean:.2f}"
