"""APGD-ℓ1 (Croce & Hein 2021): the ε schedule's stages, that only the last stage can succeed, the
gradient count, the sparsity of its steps, independence from the batch, and its refusals. The
catalogue contract runs on its YAMLs under ℓ1 in test_attacks.py; the cross-check against the
original in test_crosscheck_autoattack_l1.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from advbench.cli.config import compose_config
from advbench.cli.spec_builder import cell_spec
from advbench.core.errors import AdvbenchError
from advbench.core.norms import norm
from advbench.robustness.attacks.apgd import APGD
from advbench.robustness.attacks.apgd_sparse import checkpoint_every, stages
from advbench.robustness.attacks.oracles import WhiteBoxOracle
from advbench.robustness.cost import cell_cost

pytestmark = pytest.mark.usefixtures("one_thread")
L1 = norm("l1")


@pytest.fixture(scope="module")
def batch(digits_tensors):
    _, _, x, y = digits_tensors
    return x[:100], y[:100]


def attack(model, x, y, eps, sample_id=None, **kw):
    oracle = WhiteBoxOracle(model, len(y))
    res = APGD(**kw)(oracle, x, y, eps=torch.full((len(y),), eps), norm="l1", sample_id=sample_id)
    return res, oracle


def test_the_eps_schedule_splits_the_iterations_as_the_original() -> None:
    assert stages(100, False) == [(1, 100)]
    assert stages(100, True) == [(3, 30), (2, 30), (1, 40)]
    assert stages(10, True) == [(3, 3), (2, 3), (1, 4)]
    assert [checkpoint_every(n) for n in (100, 40, 30, 10)] == [4, 1, 1, 1]
    with pytest.raises(AdvbenchError, match="n_iter=4"):
        APGD(n_iter=4, large_eps=True)


def test_robust_samples_take_n_iter_gradients_and_success_is_the_models(tiny_model, batch) -> None:
    x, y = batch
    for large_eps in (False, True):
        res, oracle = attack(tiny_model, x, y, 1.25, n_iter=20, large_eps=large_eps)
        pred = tiny_model(res.x_adv).argmax(1)
        assert torch.equal(res.success, pred != y)
        assert (oracle.grad_evals[~res.success] == 20).all() and (oracle.grad_evals <= 20).all()
        assert (L1.distance(res.x_adv, x) <= 1.25 * (1 + 1e-5)).all()
        assert res.x_adv.min() >= 0 and res.x_adv.max() <= 1


def test_only_the_last_stage_of_the_eps_schedule_can_succeed(tiny_model, batch) -> None:
    """Iterations at 3ε and 2ε never count: a sample breaks at the last stage's start (12 of 20) or later."""
    x, y = batch
    res, _ = attack(tiny_model, x, y, 1.25, n_iter=20, large_eps=True)
    clean_wrong = tiny_model(x).argmax(1) != y
    broke = res.success & ~clean_wrong
    assert broke.sum() > 10
    assert (res.first_success[broke] >= 12).all()


def test_steps_are_sparse_where_the_budget_is_small(tiny_model, batch) -> None:
    """A small budget spent by top-k steps and the ℓ1 projection moves few of the 64 pixels."""
    x, y = batch
    res, _ = attack(tiny_model, x, y, 0.5, n_iter=20)
    changed = (res.x_adv != x).flatten(1).sum(dim=1).float()
    assert changed.median() < 32


def test_batch_order_and_size_do_not_matter(tiny_model, batch) -> None:
    x, y = batch
    x, y = x[:30], y[:30]
    ids = torch.arange(100, 130)
    whole, _ = attack(tiny_model, x, y, 1.25, sample_id=ids, n_iter=20, loss="dlr", large_eps=True)
    rev, _ = attack(tiny_model, x.flip(0), y.flip(0), 1.25, sample_id=ids.flip(0), n_iter=20, loss="dlr",
                    large_eps=True)
    assert torch.allclose(whole.x_adv, rev.x_adv.flip(0), atol=1e-5)
    assert torch.equal(whole.first_success, rev.first_success.flip(0))


def test_the_eps_schedule_is_refused_outside_l1_and_kept_out_of_the_records_when_off() -> None:
    why = APGD(large_eps=True).unsupported("linf", "white", "untargeted")
    assert why is not None and "large_eps" in why and "\n" not in why
    assert APGD(large_eps=True).unsupported("l1", "white", "untargeted") is None
    assert "large_eps" not in APGD().params() and APGD(large_eps=True).params()["large_eps"] is True


def test_the_engine_costs_autoattack_under_l1_with_the_originals_l1_members(tmp_path: Path) -> None:
    """The cell's attack is the one `for_norm` gives for its threat: under ℓ1 AutoAttack's standard
    declares APGD-CE's 5 restarts and APGD-T's 5 classes (500 + 500 gradients), FAB-T's 9 classes (900)
    and Square's 5,001 queries; under ℓ∞ APGD-CE runs one start and APGD-T 9 classes (100 + 900 + 900)."""
    costs, restarts = {}, {}
    for threat in ("l1", "linf"):
        spec = cell_spec(compose_config("config", ["attack=autoattack", f"threat={threat}", f"cache_dir={tmp_path}"]))
        costs[threat] = cell_cost(spec).per_run
        resolved = spec.attack.attack.for_norm(spec.threat.norm).params()["resolved"]
        restarts[threat] = (resolved["apgd_ce"]["n_restarts"], resolved["apgd_t"]["n_target_classes"])
    assert restarts == {"l1": (5, 5), "linf": (1, 9)}
    assert (costs["l1"].grad_evals, costs["l1"].queries) == (500 + 500 + 900, 5001)
    assert (costs["linf"].grad_evals, costs["linf"].queries) == (100 + 900 + 900, 5001)
