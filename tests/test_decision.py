"""HopSkipJump and Boundary: labels-only access, exact per-sample query counts, checkpoints, starts, the engine.

The catalogue contract (bounds, success agrees with the model, targeted means the target,
samples do not interact) runs on conf/attack/hsj.yaml and boundary.yaml in test_attacks.py with short budgets.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
import torch
from contract import assert_decision_queries
from torch import nn

from advbench.core.errors import AdvbenchError
from advbench.core.steps import lp_norm
from advbench.robustness.attacks.boundary import Boundary
from advbench.robustness.attacks.decision import HopSkipJump
from advbench.robustness.attacks.oracles import DecisionOracle, WhiteBoxOracle
from advbench.robustness.data.target_classes import target_classes

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def batch(digits_tensors):
    _, _, x, y = digits_tensors
    return x[:24], y[:24]


ATTACKS = {"hsj": HopSkipJump, "boundary": Boundary}
NAMES = list(ATTACKS)


def make(name: str = "hsj", **kw) -> HopSkipJump | Boundary:
    return ATTACKS[name](**{"max_queries": 400, "checkpoints": [100, 200], **kw})


def attack(model: nn.Module, x, y, norm="l2", target=None, sample_id=None, name="hsj", **kw):
    oracle = DecisionOracle(model, len(y))
    res = make(name, **kw)(oracle, x, y, eps=torch.full((len(y),), 0.8), norm=norm, target=target, sample_id=sample_id)
    return res, oracle


@pytest.mark.parametrize(("name", "norm"), [("hsj", "l2"), ("hsj", "linf"), ("boundary", "l2")])
def test_queries_are_counted_exactly_per_sample_and_stop_at_the_budget(name: str, norm: str, tiny_model, batch) -> None:
    x, y = batch
    assert_decision_queries(tiny_model, x, y, lambda m, xs, ys, ids: attack(m, xs, ys, norm, sample_id=ids, name=name),
                            400)


@pytest.mark.parametrize("name", NAMES)
def test_the_oracle_gives_labels_only_and_white_box_access_is_refused(name: str, tiny_model, batch) -> None:
    x, y = batch
    oracle = DecisionOracle(tiny_model, len(y))
    assert not hasattr(oracle, "logits") and not hasattr(oracle, "value_and_grad")
    labels = oracle.labels(x.requires_grad_(True), torch.arange(len(y)))
    assert labels.dtype == torch.long and labels.shape == y.shape and labels.grad_fn is None
    with pytest.raises(AdvbenchError, match="decision"):
        make(name)(WhiteBoxOracle(tiny_model, len(y)), x.detach(), y, eps=torch.full((len(y),), 0.8), norm="l2")


@pytest.mark.parametrize("name", NAMES)
def test_deterministic_and_independent_of_the_batch(name: str, tiny_model, batch) -> None:
    x, y = batch
    whole, _ = attack(tiny_model, x, y, name=name)
    again, _ = attack(tiny_model, x, y, name=name)
    assert torch.equal(whole.x_adv, again.x_adv) and torch.equal(whole.first_success, again.first_success)
    ids = torch.arange(len(y))
    part, _ = attack(tiny_model, x[7:13], y[7:13], sample_id=ids[7:13], name=name)
    assert torch.allclose(part.x_adv, whole.x_adv[7:13], atol=1e-5)
    assert torch.equal(part.info["norm_at_100"], whole.info["norm_at_100"][7:13])


@pytest.mark.parametrize("name", NAMES)
def test_checkpoints_and_first_success_are_in_queries(name: str, tiny_model, batch) -> None:
    x, y = batch
    res, oracle = attack(tiny_model, x, y, max_queries=1000, checkpoints=[100, 300, 5000], name=name)
    # checkpoints past the budget drop; the budget is one
    assert set(res.info) == {"norm_at_100", "norm_at_300", "norm_at_1000"}
    a, b, c = (res.info[k] for k in ("norm_at_100", "norm_at_300", "norm_at_1000"))
    assert (b <= a).all() and (c <= b).all() and (c < a).any(), "more queries never hurt and here help"
    found = lp_norm(res.x_adv - x, "l2")
    assert torch.allclose(c[res.success], found[res.success]) and torch.isinf(c[~res.success]).all()
    first = res.first_success
    assert ((first >= 0) == (res.success & (found <= 0.8))).all()
    assert (first <= oracle.queries).all()
    assert (first[b <= 0.8] <= 300).all() and (first[(b > 0.8) & (first >= 0)] > 100).all()


@pytest.mark.parametrize(("name", "bound"), [("hsj", 1.0), ("boundary", 0.8)])
def test_median_minimum_l2_is_small_within_a_small_budget(name: str, bound: float, tiny_model, digits_tensors) -> None:
    _, _, x, y = digits_tensors
    x, y = x[:40], y[:40]
    res, _ = attack(tiny_model, x, y, max_queries=1000, name=name)
    norms = torch.where(res.success, lp_norm(res.x_adv - x, "l2"), torch.full((40,), math.inf))
    assert res.success.all()
    assert norms.median() < bound, f"median minimum l2 {norms.median():.3f} after 1000 queries"


@pytest.mark.parametrize("name", NAMES)
def test_targeted_starts_from_the_batch_and_fails_cleanly_without_one(name: str, tiny_model, batch) -> None:
    x, y = batch
    target = target_classes(torch.arange(len(y)), y, 10, seed=0)
    res, _ = attack(tiny_model, x, y, target=target, name=name)
    assert res.success.float().mean() > 0.5
    assert (tiny_model(res.x_adv).argmax(1)[res.success] == target[res.success]).all()
    alone = (y != 3) & (tiny_model(x).argmax(1) != 3)  # no image of class 3 left: a target of 3 has no start
    res, oracle = attack(tiny_model, x[alone], y[alone], target=torch.full((int(alone.sum()),), 3), name=name)
    assert not res.success.any() and torch.equal(res.x_adv, x[alone])
    assert (oracle.queries == 1).all() and torch.isinf(res.info["norm_at_400"]).all()


def test_end_to_end_under_the_decision_threat(tmp_path: Path, trained_digits_cache: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from advbench.cli.config import compose_config
    from advbench.cli.spec_builder import run_main

    monkeypatch.setenv("ADVBENCH_CACHE", str(trained_digits_cache))
    overrides = ["attack=hsj", "attack.params.max_queries=300", "attack.params.checkpoints=[100,200]",
                 "threat=l2_decision", "dataset.n_samples=16", "defense.recipe.epochs=4", f"out_dir={tmp_path}"]
    frame = pd.read_parquet(run_main(compose_config("config", overrides)))
    assert set(frame["knowledge"]) == {"decision"} and set(frame["min_eps_source"]) == {"norm"}
    assert (frame["queries"] <= 300).all() and (frame["grad_evals"] == 0).all()
    assert {"norm_at_100", "norm_at_200", "norm_at_300"} <= set(frame.columns)
    won = frame["success_at_budget"]
    assert won.any() and (frame.loc[won, "first_success_strength"] <= 300).all()
    assert (frame["norm_at_300"] >= frame["adv_norm"] - 1e-5).all()
