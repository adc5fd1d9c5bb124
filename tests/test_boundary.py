"""Boundary's two schedules: exact per-sample queries, batch independence, and the trust-region
schedule's strength over the paper's at a budget of 1,000 queries (what ART's schedule buys).

test_decision.py runs the rest of the decision contract (labels only, checkpoints, targeted
starts) on the default schedule.
"""

from __future__ import annotations

import math

import pytest
import torch
from contract import assert_decision_queries, assert_seeded_and_batch_independent

from advbench.cli.config import compose_config
from advbench.core.errors import AdvbenchError
from advbench.core.steps import lp_norm
from advbench.robustness.attacks.boundary import SCHEDULES, Boundary
from advbench.robustness.attacks.oracles import DecisionOracle

pytestmark = pytest.mark.usefixtures("one_thread")


def attack(model, x, y, *, sample_id=None, **kw):
    oracle = DecisionOracle(model, len(y))
    res = Boundary(**{"max_queries": 400, "checkpoints": [100, 200], **kw})(
        oracle, x, y, eps=torch.full((len(y),), 0.8), norm="l2", sample_id=sample_id)
    return res, oracle


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_queries_are_exact_and_within_the_budget(schedule: str, tiny_model, digits_tensors) -> None:
    """197 is no multiple of a volley: a sample's last volley sends only the candidates it can pay."""
    _, _, x, y = digits_tensors
    assert_decision_queries(tiny_model, x[:24], y[:24],
                            lambda m, xs, ys, ids: attack(m, xs, ys, sample_id=ids, schedule=schedule,
                                                          max_queries=197), 197)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_seeded_and_independent_of_the_batch(schedule: str, tiny_model, digits_tensors) -> None:
    _, _, x, y = digits_tensors
    x, y = x[:12], y[:12]
    assert_seeded_and_batch_independent(
        lambda seed, rows: attack(tiny_model, x[rows], y[rows], sample_id=rows, schedule=schedule, seed=seed,
                                  max_queries=200)[0],
        12, (0, 7))


def median_l2(model, x, y, **kw) -> float:
    res, oracle = attack(model, x, y, max_queries=1000, checkpoints=[], **kw)
    assert (oracle.queries <= 1000).all()
    norms = torch.where(res.success, lp_norm(res.x_adv - x, "l2"), torch.full((len(y),), math.inf))
    return float(norms.median())


def test_the_trust_region_schedule_reaches_under_half_the_paper_schedules_l2_at_1000_queries(
        tiny_model, digits_tensors) -> None:
    """About 0.6 against 1.5 on 24 digits (0.39-0.41× for seeds 0-2): the paper's success
    windows fill only after hundreds of steps, so its steps barely adapt within 1,000 queries."""
    _, _, x, y = digits_tensors
    x, y = x[:24], y[:24]
    ours, paper = median_l2(tiny_model, x, y), median_l2(tiny_model, x, y, schedule="paper")
    assert ours < 0.5 * paper, f"median l2 at 1000 queries: trust_region {ours:.3f}, paper {paper:.3f}"


@pytest.mark.parametrize("override", ["schedule=foolbox", "candidates=0"])
def test_bad_settings_are_one_line_errors(override: str) -> None:
    with pytest.raises(AdvbenchError, match=override.split("=")[0]):
        compose_config("config", ["attack=boundary", f"attack.params.{override}", "threat=l2_decision"])
