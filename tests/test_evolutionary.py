"""Evolutionary attack: labels only, exact per-sample query counts within the budget, the authors'
candidate geometry and weighted coordinate choice, determinism, batch independence, targeted
starts, and the norm falling with queries on the digits model.

The catalogue contract (bounds, success agrees with the model, targeted means the target,
samples do not interact, the engine's records) runs on conf/attack/evolutionary.yaml in
test_attacks.py with a short budget.
"""

from __future__ import annotations

import pytest
import torch
from contract import assert_decision_queries
from torch import nn

from advbench.cli.config import compose_config
from advbench.core.errors import AdvbenchError
from advbench.core.sample_draws import uniform
from advbench.core.steps import lp_norm
from advbench.robustness.attacks.evolutionary import Evolutionary, weighted_choice
from advbench.robustness.attacks.oracles import DecisionOracle, WhiteBoxOracle
from advbench.robustness.data.target_classes import target_classes
from advbench.robustness.evaluation.measure import evaluate_batch
from advbench.robustness.specs import SearchSettings
from advbench.robustness.threat import ThreatModel

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def batch(digits_tensors):
    _, _, x, y = digits_tensors
    return x[:24], y[:24]


def attack(model: nn.Module, x, y, target=None, sample_id=None, **kw):
    oracle = DecisionOracle(model, len(y))
    evo = Evolutionary(**{"max_queries": 300, "checkpoints": [100, 200], **kw})
    res = evo(oracle, x, y, eps=torch.full((len(y),), 0.8), norm="l2", target=target, sample_id=sample_id)
    return res, oracle


def test_queries_are_counted_exactly_per_sample_and_stop_at_the_budget(tiny_model, batch) -> None:
    x, y = batch
    assert_decision_queries(tiny_model, x, y, lambda m, xs, ys, ids: attack(m, xs, ys, sample_id=ids), 300)


def test_labels_only_and_white_box_access_is_refused(tiny_model, batch) -> None:
    x, y = batch
    with pytest.raises(AdvbenchError, match="decision"):
        Evolutionary()(WhiteBoxOracle(tiny_model, len(y)), x, y, eps=torch.full((len(y),), 0.8), norm="l2")
    with pytest.raises(AdvbenchError, match="l2"):
        Evolutionary()(DecisionOracle(tiny_model, len(y)), x, y, eps=torch.full((len(y),), 0.1), norm="linf")


def test_deterministic_and_independent_of_the_batch(tiny_model, batch) -> None:
    x, y = batch
    whole, _ = attack(tiny_model, x, y)
    again, _ = attack(tiny_model, x, y)
    assert torch.equal(whole.x_adv, again.x_adv) and torch.equal(whole.first_success, again.first_success)
    ids = torch.arange(len(y))
    part, _ = attack(tiny_model, x[7:13], y[7:13], sample_id=ids[7:13])
    assert torch.allclose(part.x_adv, whole.x_adv[7:13], atol=1e-5)
    assert torch.equal(part.info["norm_at_100"], whole.info["norm_at_100"][7:13])
    other, _ = attack(tiny_model, x[7:13], y[7:13], sample_id=ids[7:13], seed=1)
    assert not torch.equal(other.x_adv, part.x_adv), "the seed drives the draws"


def test_targeted_means_the_target_and_fails_cleanly_without_a_start(tiny_model, batch) -> None:
    x, y = batch
    target = target_classes(torch.arange(len(y)), y, 10, seed=0)
    res, _ = attack(tiny_model, x, y, target=target)
    assert res.success.float().mean() > 0.5
    assert (tiny_model(res.x_adv).argmax(1)[res.success] == target[res.success]).all()
    starts = (tiny_model(x).argmax(1) == y)[None, :] & (y[None, :] == target[:, None])  # correctly classified
    nearest = torch.cdist(x.flatten(1), x.flatten(1)).masked_fill(~starts, float("inf")).amin(1)
    assert torch.equal(res.success, torch.isfinite(nearest)), "a sample starts where its batch has a start"
    assert (lp_norm(res.x_adv - x, "l2")[res.success] < nearest[res.success]).all(), "and only gets closer"
    alone = (y != 3) & (tiny_model(x).argmax(1) != 3)  # no image of class 3 left: a target of 3 has no start
    res, oracle = attack(tiny_model, x[alone], y[alone], target=torch.full((int(alone.sum()),), 3))
    assert not res.success.any() and torch.equal(res.x_adv, x[alone])
    assert (oracle.queries == 1).all() and torch.isinf(res.info["norm_at_300"]).all()


def test_median_minimum_l2_falls_clearly_with_queries(tiny_model, digits_tensors) -> None:
    """The norm_at checkpoints of one run: the accuracy-vs-queries curve comes down as queries grow."""
    _, _, x, y = digits_tensors
    x, y = x[:40], y[:40]
    res, _ = attack(tiny_model, x, y, max_queries=1000, checkpoints=[100, 300])
    assert res.success.all()
    med = [float(res.info[f"norm_at_{q}"].median()) for q in (100, 300, 1000)]
    assert med[1] < 0.9 * med[0] and med[2] < 0.7 * med[1], f"median minimum l2 at 100/300/1000 queries: {med}"
    assert med[2] < 1.3
    assert torch.allclose(res.info["norm_at_1000"], lp_norm(res.x_adv - x, "l2"))


def test_engine_records_norms_queries_and_checkpoints(tiny_model, batch) -> None:
    """Through the engine: min_eps is the returned example's norm, queries within the budget,
    the checkpoint columns never below it (the catalogue's engine check of this attack is slow)."""
    x, y = (t[:16] for t in batch)
    threat = ThreatModel(norm="l2", goal="untargeted", eps=1.5, knowledge="decision")
    out = evaluate_batch(Evolutionary(max_queries=300, checkpoints=[100]), tiny_model, x, y, None, threat,
                         SearchSettings())
    assert out["min_eps_source"] == "norm" and (out["grad_evals"] == 0).all() and (out["queries"] <= 300).all()
    fresh = tiny_model(x).argmax(1) == y
    assert torch.equal(out["success_at_budget"], out["min_eps"] <= 1.5) and out["success_at_budget"][fresh].any()
    assert torch.equal(out["min_eps"][fresh], out["adv_norm"][fresh])
    assert (out["norm_at_100"] >= out["norm_at_300"]).all()
    assert torch.allclose(out["norm_at_300"][fresh].double(), out["min_eps"][fresh].double())


def test_candidates_move_mu_towards_x_on_the_sphere_and_stay_in_bounds() -> None:
    """The authors' geometry: a candidate lies at (1 − μ)·d from x (before clipping), off the line
    to x by the upsampled noise, and inside the input bounds."""
    evo = Evolutionary(sigma=0.05)
    x = torch.full((3, 1, 8, 8), 0.5)
    cur = x + 0.3 * torch.randn(3, 1, 8, 8, generator=torch.Generator().manual_seed(0)).clamp(-1, 1)
    mu = torch.tensor([0.01, 0.1, 0.5])
    z = torch.randn(3, 1, 4, 4, generator=torch.Generator().manual_seed(1))
    cand = evo._candidate(x, cur, z, mu, (0.0, 1.0))
    d = lp_norm(cur - x, "l2")
    assert torch.allclose(lp_norm(cand - x, "l2"), (1 - mu) * d, rtol=1e-5)
    off_line = lp_norm(cand - (x + (1 - mu).reshape(-1, 1, 1, 1) * (cur - x)), "l2")
    assert (off_line > 0.01 * d).all() and (off_line < 0.1 * d).all()
    far = evo._candidate(torch.zeros(1, 1, 8, 8), torch.ones(1, 1, 8, 8), z[:1], mu[:1], (0.0, 1.0))
    assert far.min() >= 0 and far.max() <= 1


def test_weighted_choice_picks_k_coordinates_in_proportion_to_the_weights() -> None:
    weights = torch.tensor([[1.0, 2.0, 3.0, 4.0, 0.0]]).expand(20000, -1)
    u = uniform(0, torch.arange(20000), (5,), 1, dtype=torch.float64)
    one = weighted_choice(weights, 1, u)
    assert (one.sum(1) == 1).all() and not one[:, 4].any()
    share = one.double().mean(0)[:4]
    assert torch.allclose(share, torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64), atol=0.015)
    assert (weighted_choice(weights, 3, u).sum(1) == 3).all()


@pytest.mark.parametrize("override", ["search_scale=0", "c_cov=1.5", "mu=0", "success_window=0"])
def test_bad_settings_are_one_line_errors(override: str) -> None:
    with pytest.raises(AdvbenchError, match=override.split("=")[0]):
        compose_config("config", ["attack=evolutionary", f"attack.params.{override}", "threat=l2_decision"])


def test_bench_script_times_decision_attacks_batched_and_one_at_a_time_on_equal_work(tmp_path) -> None:
    """Both rows of each attack pay the same queries, every sample its whole budget, so queries/s compare."""
    from test_crosscheck import assert_batched_and_single_rows_do_equal_work

    assert_batched_and_single_rows_do_equal_work(tmp_path, ["--decision", "--decision-queries", "30"],
                                                 ["Boundary-30", "Evolutionary-30"], 30)
