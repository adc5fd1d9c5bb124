"""What a record says about a sample: exact ε bookkeeping, brackets of probed ε, both attack
kinds, cost from the oracle, and curves that meet Table 3 at the budget."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf

from advbench.cli.config import compose_config
from advbench.cli.spec_builder import run_main
from advbench.core.catalog import conf_dir
from advbench.core.errors import AdvbenchError
from advbench.core.records import read_records
from advbench.core.steps import clip, lp_norm, unit_direction
from advbench.robustness.attacks.attack_contract import Attack, AttackResult
from advbench.robustness.attacks.gradient import BIM, FGSM, MIM, PGD
from advbench.robustness.attacks.oracles import WhiteBoxOracle
from advbench.robustness.data.target_classes import target_classes
from advbench.robustness.evaluation.cell import _batch_frame
from advbench.robustness.evaluation.measure import evaluate_batch
from advbench.robustness.report.curves import CELL, budget_curve, strength_curve
from advbench.robustness.report.table3 import summary_table
from advbench.robustness.specs import SearchSettings
from advbench.robustness.threat import ThreatModel, goal_met

pytestmark = pytest.mark.usefixtures("one_thread")


def as_frame(out: dict, y: torch.Tensor, target: torch.Tensor | None, threat: ThreatModel, attack: str = "bim",
             strength: int = 20, ids: torch.Tensor | None = None) -> pd.DataFrame:
    """Records as `evaluate_cell` writes them, for one batch."""
    ids = torch.arange(len(y)) if ids is None else ids
    return _batch_frame(out, y, ids, target, 0.0).assign(
        dataset="digits", defense="natural", attack=attack, norm=threat.norm, goal=threat.goal,
        knowledge=threat.knowledge, eps_budget=threat.eps, strength_budget=strength)


def assert_invariants(frame: pd.DataFrame) -> None:
    """The record invariants, per sample, on any records (one or many cells)."""
    hi, lo = frame["min_eps"].to_numpy(np.float64), frame["min_eps_lo"].to_numpy(np.float64)
    budget = frame["eps_budget"].to_numpy(np.float64)
    assert np.array_equal(frame["success_at_budget"].to_numpy(bool), hi <= budget), "success_at_budget ⇔ min_eps <= eps_budget"
    both = np.isfinite(hi) & np.isfinite(lo)
    assert (lo[both] < hi[both]).all(), "min_eps_lo < min_eps where both are finite"
    found = np.isfinite(hi)
    adv_norm = frame["adv_norm"].to_numpy(np.float64)
    assert (adv_norm[found] <= hi[found] * (1 + 1e-5) + 1e-6).all(), "the smallest verified example lies within min_eps"
    targeted = frame["goal"].eq("targeted").to_numpy()
    goal = np.where(targeted, frame["adv_pred"] == frame["target"], frame["adv_pred"] != frame["label"])
    assert np.array_equal(goal, frame["success_at_budget"].to_numpy(bool)), "adv_pred is the example at the budget"


def assert_curve_meets_table(frame: pd.DataFrame) -> None:
    """Budget curve at ε = budget and strength curve at full strength equal Table 3, exactly."""
    table = summary_table(frame).set_index(CELL)
    at_budget = budget_curve(frame).query("eps == eps_budget").set_index(CELL)
    strength = strength_curve(frame).query("strength == strength_budget").set_index(CELL)
    assert len(at_budget) == len(table) == len(strength)
    for key, row in table.iterrows():
        for curve in (at_budget, strength):
            assert curve.loc[key, "asr"] == row["asr"], f"ASR of {key}: curve {curve.loc[key, 'asr']} vs table {row['asr']}"
            if key[CELL.index("goal")] == "untargeted":
                assert curve.loc[key, "accuracy"] == row["accuracy"], f"accuracy of {key}"


@pytest.fixture(scope="module")
def data(digits_tensors):
    _, _, x, y = digits_tensors
    return x[:96], y[:96]


def targets_for(y: torch.Tensor, goal: str, ids: torch.Tensor | None = None) -> torch.Tensor | None:
    ids = torch.arange(len(y)) if ids is None else ids
    return target_classes(ids, y, 10, seed=0) if goal == "targeted" else None


@pytest.mark.parametrize("goal", ["untargeted", "targeted"])
@pytest.mark.parametrize("enabled", [True, False])
def test_a_sample_broken_at_the_budget_records_the_budget_exactly(goal, enabled, tiny_model, data) -> None:
    """0.2 is not a float32: the budget stays float64, so the curve at 0.2 equals the table."""
    x, y = data
    target = targets_for(y, goal)
    threat = ThreatModel(norm="linf", goal=goal, eps=0.2)
    out = evaluate_batch(BIM(steps=5), tiny_model, x, y, target, threat, SearchSettings(enabled=enabled))
    assert out["min_eps"].dtype == torch.float64
    succ = out["success_at_budget"]
    assert succ.any() and (~succ).any() if goal == "targeted" else succ.any()
    if not enabled:
        clean_adv = goal_met(out["clean_pred"], y, target)
        assert (out["min_eps"][succ & ~clean_adv] == 0.2).all()
    frame = as_frame(out, y, target, threat, strength=5)
    assert_invariants(frame)
    assert_curve_meets_table(frame)


@pytest.mark.parametrize(("attack", "norm", "eps", "goal"), [
    (FGSM(), "l2", 0.8, "untargeted"), (BIM(steps=5), "linf", 0.1, "untargeted"),
    (PGD(steps=5, seed=3), "linf", 0.1, "targeted"), (PGD(steps=5, seed=3), "l2", 1.0, "untargeted"),
])
def test_the_bracket_is_made_of_probed_eps(attack, norm, eps, goal, tiny_model, data) -> None:
    """Rerunning the attack at min_eps succeeds and at min_eps_lo fails, for every sample."""
    x, y = data
    target = targets_for(y, goal)
    threat = ThreatModel(norm=norm, goal=goal, eps=eps)
    search = SearchSettings(resolution=0.05)
    out = evaluate_batch(attack, tiny_model, x, y, target, threat, search)
    frame = as_frame(out, y, target, threat)
    assert_invariants(frame)
    assert (frame["min_eps_source"] == "search").all()
    hi, lo = out["min_eps"], out["min_eps_lo"]
    clean_adv = goal_met(out["clean_pred"], y, target)
    assert torch.equal(torch.isnan(lo), clean_adv) and (hi[clean_adv] == 0).all() and (out["adv_norm"][clean_adv] == 0).all()

    def wins_at(eps_each: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        t = None if target is None else target[rows]
        res = attack(WhiteBoxOracle(tiny_model, len(rows)), x[rows], y[rows], eps=eps_each.float(), norm=norm,
                     target=t, sample_id=rows)
        return goal_met(tiny_model(res.x_adv).argmax(1), y[rows], t)

    found = (torch.isfinite(hi) & (hi > 0)).nonzero().squeeze(1)
    failed = (torch.isfinite(lo) & (lo > 0)).nonzero().squeeze(1)
    assert found.numel() > 10 and failed.numel() > 10
    assert wins_at(hi[found], found).all(), "the attack must succeed at min_eps"
    assert not wins_at(lo[failed], failed).any(), "the attack must fail at min_eps_lo"
    narrow = torch.isfinite(hi) & (lo > 0)
    assert ((hi - lo)[narrow] <= search.resolution * eps * (1 + 1e-12)).all()


@pytest.mark.parametrize("norm", ["linf", "l2"])
def test_a_pgd_record_does_not_depend_on_the_batch(norm, tiny_model, data) -> None:
    x, y = data[0][:64], data[1][:64]
    ids = torch.arange(500, 564)
    threat = ThreatModel(norm=norm, goal="untargeted", eps=0.1 if norm == "linf" else 0.8)
    attack = PGD(steps=5, seed=1)
    whole = evaluate_batch(attack, tiny_model, x, y, None, threat, SearchSettings(), sample_id=ids)
    parts = [evaluate_batch(attack, tiny_model, x[i:i + 7], y[i:i + 7], None, threat, SearchSettings(),
                            sample_id=ids[i:i + 7]) for i in range(0, 64, 7)]
    # The model's own arithmetic differs in the last bits between batch sizes (logits by ~1e-5
    # here); ℓ∞ steps take signs and absorb that, ℓ2 steps pass it on to the measured norms.
    measured = ("adv_norm", "dist_linf", "dist_l2", "dist_l2_norm") if norm == "l2" else ()
    for column, value in whole.items():
        if isinstance(value, torch.Tensor):
            tol = 1e-5 if column in measured else 0.0
            torch.testing.assert_close(value, torch.cat([p[column] for p in parts]), rtol=0, atol=tol, equal_nan=True,
                                       msg=column)
    shifted = evaluate_batch(attack, tiny_model, x, y, None, threat, SearchSettings(), sample_id=ids + 1)
    assert not torch.equal(whole["dist_l2"], shifted["dist_l2"]), "the random start must follow the sample id"


class SteppingMinimizer(Attack):
    """A minimizing attack for the engine's tests: walks along sign/normalised gradient at radii
    `step, 2·step, ...` and keeps the first adversarial point. Its examples can lie beyond the
    budget, which exercises the projection; `lie` claims success on every sample."""

    kind = "minimizing"

    def __init__(self, step: float, steps: int = 30, lie: bool = False) -> None:
        self.step, self.steps, self.lie = step, steps, lie

    @property
    def strength_budget(self) -> int:
        return self.steps

    def run(self, oracle, x, y, *, eps, norm, target, sample_id) -> AttackResult:
        n = x.shape[0]
        idx = torch.arange(n)
        _, grad = oracle.loss_grad(x, y if target is None else target, target is not None, idx=idx)
        direction = unit_direction(grad, norm)
        x_adv, first = x.clone(), torch.full((n,), -1, dtype=torch.long)
        done = torch.zeros(n, dtype=torch.bool)
        for k in range(1, self.steps + 1):
            cand = clip(x + direction * self.step * k, oracle.bounds)
            hit = goal_met(oracle.logits(cand, idx=idx).argmax(1), y, target) & ~done
            x_adv[hit] = cand[hit]
            first[hit & (lp_norm(cand - x, norm) <= eps)] = k
            done |= hit
        success = torch.ones_like(done) if self.lie else done
        return AttackResult(x_adv=x_adv, success=success, first_success=first,
                            info={"radius_steps": torch.where(done, first, -1)})


@pytest.mark.parametrize("norm", ["linf", "l2"])
def test_minimizing_attack_min_eps_is_the_verified_norm(norm, tiny_model, data) -> None:
    x, y = data
    eps = 0.05 if norm == "linf" else 0.5
    step = 0.013 if norm == "linf" else 0.13           # off-grid: examples overshoot the budget
    threat = ThreatModel(norm=norm, goal="untargeted", eps=eps)
    attack = SteppingMinimizer(step)
    out = evaluate_batch(attack, tiny_model, x, y, None, threat, SearchSettings())
    frame = as_frame(out, y, None, threat, attack="stepper", strength=attack.steps)
    assert_invariants(frame)
    assert_curve_meets_table(frame)
    assert (frame["min_eps_source"] == "norm").all() and frame["min_eps_lo"].isna().all()
    assert (out["search_grad_evals"] == 0).all() and (out["grad_evals"] == 1).all()
    assert (out["queries"] == attack.steps).all()
    assert "radius_steps" in out

    res = attack(WhiteBoxOracle(tiny_model, len(y)), x, y, eps=torch.full((len(y),), eps), norm=norm)
    adv = tiny_model(res.x_adv).argmax(1) != y
    norms = lp_norm(res.x_adv.double() - x.double(), norm)
    clean_adv = out["clean_pred"] != y
    within = adv & (norms <= eps) & ~clean_adv
    assert within.any()
    assert torch.equal(out["min_eps"][within], norms[within]), "min_eps is the found example's norm"
    beyond = adv & (norms > eps) & ~clean_adv
    rescued = beyond & out["success_at_budget"]
    assert rescued.any(), "some examples beyond the budget project to adversarial ones"
    assert (out["min_eps"][rescued] <= eps).all() and (out["adv_norm"][rescued] <= eps * (1 + 1e-6)).all()
    kept = beyond & ~out["success_at_budget"]
    assert torch.equal(out["min_eps"][kept], norms[kept])
    assert (out["dist_linf" if norm == "linf" else "dist_l2"] <= eps * (1 + 1e-5) + 1e-6).all(), \
        "the example behind adv_pred lies within the budget"
    assert torch.isinf(out["min_eps"][~adv & ~clean_adv]).all()


def test_a_minimizing_attacks_claim_is_checked_by_the_model(tiny_model, data) -> None:
    x, y = data
    threat = ThreatModel(norm="linf", goal="untargeted", eps=0.05)
    out = evaluate_batch(SteppingMinimizer(0.013, steps=2, lie=True), tiny_model, x, y, None, threat, SearchSettings())
    unbroken = (out["clean_pred"] == y) & (out["radius_steps"] < 0)
    assert unbroken.any() and torch.isinf(out["min_eps"][unbroken]).all()
    assert_invariants(as_frame(out, y, None, threat, strength=2))


class LabelOnly(Attack):
    """Returns x after asking for its label once: a budgeted decision-based stand-in."""

    knowledge = ("decision",)
    strength_budget = 1

    def run(self, oracle, x, y, *, eps, norm, target, sample_id) -> AttackResult:
        won = goal_met(oracle.labels(x, idx=torch.arange(len(y))), y, target)
        return AttackResult(x_adv=x.clone(), success=won, first_success=torch.where(won, 0, -1))


def test_the_oracle_follows_the_threat_knowledge_and_counts_search_probes(tiny_model, data) -> None:
    x, y = data
    decision = ThreatModel(norm="linf", goal="untargeted", eps=0.1, knowledge="decision")
    out = evaluate_batch(LabelOnly(), tiny_model, x, y, None, decision, SearchSettings(max_factor=4.0))
    clean_adv = out["clean_pred"] != y
    # robust samples: the budget run, then probes at 2x and 4x the budget; broken ones: the budget run only
    assert torch.equal(out["queries"], torch.where(clean_adv, 1, 3))
    assert (out["grad_evals"] == 0).all()
    assert torch.isinf(out["min_eps"][~clean_adv]).all() and (out["min_eps_lo"][~clean_adv] == 0.4).all()
    with pytest.raises(AdvbenchError, match="needs decision access, got a white oracle"):
        evaluate_batch(LabelOnly(), tiny_model, x, y, None, ThreatModel(norm="linf", goal="untargeted", eps=0.1),
                       SearchSettings())
    with pytest.raises(AdvbenchError, match="access, got a score oracle"):
        evaluate_batch(BIM(), tiny_model, x, y, None, ThreatModel(norm="linf", goal="untargeted", eps=0.1,
                                                                  knowledge="score"), SearchSettings())


def test_cost_is_the_attacks_own_and_judging_is_free(tiny_model, data) -> None:
    x, y = data
    threat = ThreatModel(norm="linf", goal="untargeted", eps=0.1)
    out = evaluate_batch(BIM(steps=7), tiny_model, x, y, None, threat, SearchSettings(enabled=False))
    alone = WhiteBoxOracle(tiny_model, len(y))
    BIM(steps=7)(alone, x, y, eps=torch.full((len(y),), 0.1), norm="linf")
    assert torch.equal(out["grad_evals"], alone.grad_evals) and torch.equal(out["queries"], alone.queries)
    searched = evaluate_batch(BIM(steps=7), tiny_model, x, y, None, threat, SearchSettings())
    assert torch.equal(searched["grad_evals"] - searched["search_grad_evals"], alone.grad_evals)
    assert searched["search_grad_evals"].sum() > 0


CURVE_COST = {"fgsm": (FGSM(), 1.0, 1.0), "bim": (BIM(), 2.3, 0.6), "mim": (MIM(), 2.3, 0.6),
              "pgd": (PGD(seed=0), 3.05, 0.65)}
"""Whole-curve cost pinned on the tiny model (ℓ∞, ε = 0.1, 96 samples, default search): gradient
evaluations of the budget run and the search over strength_budget × samples, and the most it may
be of plain bisection's (measured: FGSM 1.00, BIM 2.26, MIM 2.23, PGD 2.99; bisection 1.00 with
2.4x the forward passes, 4.14, 4.25, 4.98)."""


@pytest.mark.parametrize("name", sorted(CURVE_COST))
def test_a_whole_curve_costs_what_is_pinned(name, tiny_model, data) -> None:
    x, y = data
    attack, pinned, share = CURVE_COST[name]
    threat = ThreatModel(norm="linf", goal="untargeted", eps=0.1)
    full = attack.steps * len(y)
    margin = evaluate_batch(attack, tiny_model, x, y, None, threat, SearchSettings())
    bisect = evaluate_batch(attack, tiny_model, x, y, None, threat, SearchSettings(method="bisect"))
    ratio = float(margin["grad_evals"].sum()) / full
    assert ratio <= pinned, f"{name}: curve cost {ratio:.3f}x one full run, pinned at {pinned}"
    assert margin["search_queries"].sum() < bisect["search_queries"].sum()
    assert ratio <= share * float(bisect["grad_evals"].sum()) / full
    assert torch.equal(margin["queries"] - margin["search_queries"], bisect["queries"] - bisect["search_queries"])
    clean_start = (margin["clean_pred"] == y) & (margin["search_grad_evals"] + margin["grad_reuses"] > 0)
    if attack.random_init:
        assert (margin["grad_reuses"] == 0).all(), "a random start never evaluates the gradient at x"
    else:
        assert (margin["grad_reuses"][clean_start] >= 1).all(), "every probe from x reuses the budget run's first gradient"
    if name == "fgsm":
        assert (margin["search_grad_evals"] == 0).all(), "FGSM's probes need forward passes only"


@pytest.mark.parametrize(("attack", "norm", "eps", "goal"), [
    (FGSM(), "l2", 0.5, "untargeted"), (BIM(steps=10), "linf", 0.1, "untargeted"),
    (MIM(steps=10), "l2", 0.5, "targeted"),
])
def test_min_eps_is_within_the_resolution_of_plain_bisection(attack, norm, eps, goal, tiny_model, data) -> None:
    x, y = data
    target = targets_for(y, goal)
    threat = ThreatModel(norm=norm, goal=goal, eps=eps)
    margin = evaluate_batch(attack, tiny_model, x, y, target, threat, SearchSettings())
    bisect = evaluate_batch(attack, tiny_model, x, y, target, threat, SearchSettings(method="bisect"))
    a, b = margin["min_eps"], bisect["min_eps"]
    assert torch.equal(torch.isinf(a), torch.isinf(b)) and torch.equal(margin["success_at_budget"], bisect["success_at_budget"])
    both = torch.isfinite(a)
    assert both.sum() > 20 and not torch.equal(a, b), "the two searches probe different ε"
    # Apart only where the attack itself is not monotone in ε: one search failed above the other's success.
    apart = both & ((a - b).abs() > 0.05 * eps * (1 + 1e-9))
    crossed = (margin["min_eps_lo"] >= b) | (bisect["min_eps_lo"] >= a)
    assert (crossed[apart]).all() and apart.sum() <= 0.02 * len(y)
    assert_invariants(as_frame(margin, y, target, threat))


def test_an_unknown_search_method_is_one_line() -> None:
    with pytest.raises(AdvbenchError, match="search.method is 'golden'; valid: margin, bisect"):
        SearchSettings(method="golden")
    with pytest.raises(AdvbenchError, match="unknown search.method 'golden'; valid: margin, bisect"):
        compose_config("config", ["search.method=golden"])
    assert compose_config("config", ["search.method=bisect"]).search.method == "bisect"


class Reporting(BIM):
    """BIM with an extra per-sample column, or one that collides with the engine's."""

    def __init__(self, column: str) -> None:
        super().__init__(steps=2)
        self._column = column

    def run(self, *args, **kwargs) -> AttackResult:
        res = super().run(*args, **kwargs)
        res.info[self._column] = res.first_success * 10
        return res


def test_info_columns_join_the_records_and_may_not_collide(tiny_model, data) -> None:
    x, y = data
    threat = ThreatModel(norm="linf", goal="untargeted", eps=0.1)
    out = evaluate_batch(Reporting("extra"), tiny_model, x, y, None, threat, SearchSettings(enabled=False))
    assert torch.equal(out["extra"], out["first_success_strength"] * 10)
    with pytest.raises(AdvbenchError, match="info columns min_eps"):
        evaluate_batch(Reporting("min_eps"), tiny_model, x, y, None, threat, SearchSettings(enabled=False))


def test_an_unknown_attack_kind_is_one_line(tiny_model, data) -> None:
    class Odd(BIM):
        kind = "sideways"

    x, y = data
    with pytest.raises(AdvbenchError, match="kind 'sideways'; valid: budgeted, minimizing"):
        evaluate_batch(Odd(), tiny_model, x, y, None, ThreatModel(norm="linf", goal="untargeted", eps=0.1), SearchSettings())


def sweep(preset: str, overrides: list[str], out: Path) -> pd.DataFrame:
    """Every cell of a preset's sweep (the benchmark's own list), run in process; their records."""
    params = OmegaConf.load(conf_dir() / "experiment" / "benchmark.yaml").hydra.sweeper.params
    groups = {k: str(v).split(",") for k, v in params.items()}
    if preset == "smoke":
        groups["defense"] = ["natural"]
    for combo in itertools.product(*groups.values()):
        choice = [f"{k}={v}" for k, v in zip(groups, combo)]
        run_main(compose_config("config", [f"experiment={preset}", *choice, *overrides, f"out_dir={out}"]))
    return read_records([out / "records"])


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["smoke", "benchmark"])
def test_every_cell_of_the_presets_meets_table3_at_the_budget(preset, tmp_path, trained_digits_cache, monkeypatch) -> None:
    """Smoke preset over the benchmark's attacks and threats, and the default benchmark on 40
    samples with briefly trained models: every cell keeps the invariants, and its curve at the
    budget is its Table-3 entry."""
    if preset == "smoke":
        monkeypatch.setenv("ADVBENCH_CACHE", str(trained_digits_cache))
        overrides = ["defense.recipe.epochs=4"]
    else:
        monkeypatch.setenv("ADVBENCH_CACHE", str(tmp_path / "cache"))
        overrides = ["dataset.n_samples=40", "defense.recipe.epochs=2"]
    frame = sweep(preset, overrides, tmp_path / "out")
    cells = frame.groupby(CELL).ngroups
    assert cells == (16 if preset == "smoke" else 32)
    assert_invariants(frame)
    assert_curve_meets_table(frame)
    assert frame["success_at_budget"].any() and (~frame["success_at_budget"]).any()
