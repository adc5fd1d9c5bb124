"""Cross-check of APGD-ℓ1 and `attack=autoattack` under ℓ1 against the original AutoAttack
(pyautoattack 0.2.0, norm='L1') on the tiny digits model, the first 200 test digits, ℓ1 ε 1.25.

- APGD-CE-ℓ1 alone against the original's `APGDAttack(norm='L1')` (100 iterations, one start,
  no ε schedule);
- AutoAttack standard: the original's `version='standard'` with norm='L1' runs APGD-CE (5
  restarts) and APGD-T (5 target classes), both with the 3ε/2ε/ε schedule, then FAB-T and Square
  in their ℓ1 versions; both sides run all four.

Random starts come from other generators, so single samples may differ; what must hold is
the number: robust accuracy within 1 point (2 samples) of the original's, the same verdict on
most samples, every example inside the ℓ1 ball and the [0, 1] box.

Measured here (one thread, 2-core machine, shared): APGD-CE-ℓ1 56.0 % vs the original's 56.0 %,
the same verdict on 96.0 % of the samples, 0.3 s vs 0.5 s; AutoAttack (all four members on both sides)
53.5 % vs 53.5 %, 100 %, 13.7 s vs 16.8 s. Other budgets, same model and samples (the default thread count), ours vs the
original: APGD-CE-ℓ1 at ε 1.0 / 1.5 / 2.0 / 3.0: 73.0 / 44.5 / 24.0 / 2.0 % vs 73.5 / 44.0 / 24.0 /
4.0 %; AutoAttack's two APGD members alone at ε 1.0 / 1.5 / 1.75 / 2.0: 69.0 / 39.5 / 26.5 / 14.5 % vs
68.5 / 41.0 / 26.5 / 15.0 % (the whole original at 1.5: 40.0 %).
"""

from __future__ import annotations

import time

import pytest
import torch
from contract import assert_close_to_the_original

from advbench.cli.option_targets import member_attack
from advbench.core.norms import norm
from advbench.robustness.attacks.apgd import APGD
from advbench.robustness.attacks.autoattack import AutoAttack
from advbench.robustness.attacks.oracles import WhiteBoxOracle

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]  # ~40 s

SAMPLES = 200
EPS = 1.25
L1 = norm("l1")


def _ours_apgd(model, x, y):
    return APGD(n_iter=100, loss="ce", seed=0)(WhiteBoxOracle(model, len(y)), x, y,
                                               eps=torch.full((len(y),), EPS), norm="l1")


def _theirs_apgd(model, x, y):
    autopgd = pytest.importorskip("pyautoattack.autopgd_base")
    return autopgd.APGDAttack(model, n_iter=100, norm="L1", n_restarts=1, eps=EPS, seed=0, loss="ce",
                              device="cpu").perturb(x, y)


def _ours_autoattack(model, x, y):
    attack = AutoAttack(build_member=member_attack, version="standard", seed=0).for_norm("l1")
    assert attack.members == ["apgd_ce", "apgd_t", "fab_t", "square_autoattack"]
    return attack(WhiteBoxOracle(model, len(y)), x, y, eps=torch.full((len(y),), EPS), norm="l1")


def _theirs_autoattack(model, x, y):
    """The original's standard version under ℓ1, its four members."""
    original = pytest.importorskip("pyautoattack").AutoAttack(model, norm="L1", eps=EPS, version="standard", seed=0)
    return original.run_standard_evaluation(x, y, batch_size=len(y))[0]


CASES = {"apgd-ce": (_ours_apgd, _theirs_apgd), "autoattack": (_ours_autoattack, _theirs_autoattack)}


@pytest.fixture(scope="module", params=sorted(CASES))
def both(request, tiny_model, digits_tensors) -> dict:
    """Robust flags, examples and wall seconds of both sides, in this process."""
    _, _, x, y = digits_tensors
    x, y = x[:SAMPLES], y[:SAMPLES]
    ours_fn, theirs_fn = CASES[request.param]
    tic = time.perf_counter()
    res = ours_fn(tiny_model, x, y)
    ours_s = time.perf_counter() - tic
    tic = time.perf_counter()
    adv = theirs_fn(tiny_model, x, y)
    theirs_s = time.perf_counter() - tic
    with torch.no_grad():
        robust, theirs = tiny_model(res.x_adv).argmax(1) == y, tiny_model(adv).argmax(1) == y
    return {"case": request.param, "x": x, "x_adv": res.x_adv, "robust": robust, "theirs": theirs,
            "success": res.success, "seconds": (ours_s, theirs_s)}


def test_robust_accuracy_within_one_point_of_the_original(both) -> None:
    assert_close_to_the_original(both["robust"], both["theirs"], f"{both['case']} l1 eps={EPS} (wall "
                                 f"{both['seconds'][0]:.1f} s vs {both['seconds'][1]:.1f} s)")


def test_every_example_is_inside_the_l1_ball_and_the_box(both) -> None:
    x, x_adv = both["x"], both["x_adv"]
    assert x_adv.min() >= 0 and x_adv.max() <= 1
    assert (L1.distance(x_adv, x) <= EPS * (1 + 1e-5) + 1e-6).all()
    assert torch.equal(both["success"], ~both["robust"]), "success is what the model says on the returned example"


def test_the_ensemble_under_l1_runs_the_originals_l1_settings() -> None:
    """APGD-CE with the constructor's 5 restarts and APGD-T towards 5 classes, both on the ε schedule."""
    resolved = AutoAttack(build_member=member_attack, version="standard", seed=0).for_norm("l1").params()["resolved"]
    assert resolved["apgd_ce"]["n_restarts"] == 5 and resolved["apgd_ce"]["large_eps"] is True
    assert resolved["apgd_t"]["n_target_classes"] == 5 and resolved["apgd_t"]["n_restarts"] == 1
    assert resolved["apgd_t"]["large_eps"] is True
    assert resolved["fab_t"]["n_target_classes"] == 9 and resolved["fab_t"]["n_restarts"] == 1
    assert resolved["square_autoattack"]["n_queries"] == 5001
    assert AutoAttack(build_member=member_attack, version="standard", seed=0).for_norm("linf").members == ["apgd_ce", "apgd_t", "fab_t",
                                                                               "square_autoattack"]
