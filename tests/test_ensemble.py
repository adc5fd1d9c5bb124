"""The worst-case ensemble: at least as strong as each member on every sample, later members only
on samples still robust, `broken_by` and accumulated strengths, config-level use."""

from __future__ import annotations

import pytest
import torch
from contract import assert_budgeted_contract
from omegaconf import OmegaConf

from advbench.cli.config import compose_config
from advbench.cli.option_targets import construct, member_attack
from advbench.core.errors import AdvbenchError
from advbench.core.steps import lp_norm
from advbench.robustness.attacks.oracles import WhiteBoxOracle
from advbench.robustness.attacks.worst_case import Ensemble
from advbench.robustness.data.target_classes import target_classes
from advbench.robustness.evaluation.measure import evaluate_batch
from advbench.robustness.specs import SearchSettings
from advbench.robustness.threat import ThreatModel

pytestmark = pytest.mark.usefixtures("one_thread")

MEMBERS = ["fgsm", "apgd_ce", "apgd_dlr"]
CHEAP = {"apgd_ce": {"n_iter": 15}, "apgd_dlr": {"n_iter": 15}}


@pytest.fixture(scope="module")
def batch(digits_tensors):
    _, _, x, y = digits_tensors
    return x[:150], y[:150]


@pytest.mark.parametrize("norm,eps,goal", [("linf", 0.07, "untargeted"), ("l2", 0.5, "untargeted"),
                                           ("linf", 0.2, "targeted")])
def test_at_least_as_strong_as_each_member_on_every_sample(norm, eps, goal, tiny_model, batch) -> None:
    x, y = batch
    n = len(y)
    target = target_classes(torch.arange(n), y, 10, seed=0) if goal == "targeted" else None
    budget = torch.full((n,), eps)
    ens = Ensemble(build_member=member_attack, members=MEMBERS, member_params=CHEAP, seed=2)
    oracle = WhiteBoxOracle(tiny_model, n)
    res = ens(oracle, x, y, eps=budget, norm=norm, target=target)
    broken_by = res.info["broken_by"]
    pred = tiny_model(res.x_adv).argmax(1)
    assert torch.equal(res.success, (pred == target) if target is not None else (pred != y))
    assert torch.equal(res.success, broken_by >= 0)

    alone = [member_attack(m, 2, CHEAP.get(m))(WhiteBoxOracle(tiny_model, n), x, y, eps=budget, norm=norm, target=target)
             for m in MEMBERS]
    for name, r in zip(MEMBERS, alone):
        assert bool((res.success >= r.success).all()), f"the ensemble misses samples {name} breaks alone"
    # Each sample is broken by the first member that breaks it alone, at the accumulated strength.
    any_alone = torch.stack([r.success for r in alone])
    first_member = torch.where(any_alone.any(0), any_alone.float().argmax(0), -1)
    assert torch.equal(broken_by, first_member)
    offsets = torch.tensor([0, 1, 1 + 15])            # FGSM is 1 step, then APGD-CE's 15
    for i, r in enumerate(alone):
        mine = broken_by == i
        assert torch.equal(res.first_success[mine], offsets[i] + r.first_success[mine])
    assert ens.steps == 31 and (res.first_success <= 31).all()
    # Later members only see the samples still robust: their gradient count is bounded by it.
    assert (oracle.grad_evals[broken_by == 0] <= 1).all()
    assert (oracle.grad_evals <= 31).all()


@pytest.mark.parametrize("norm,eps", [("linf", 0.07), ("l2", 0.5)])
def test_minimum_norm_member_counts_only_inside_the_budget(norm, eps, tiny_model, batch) -> None:
    """DeepFool returns its smallest example whatever the budget; the ensemble takes it only
    where it lies inside eps, and leaves the other samples to the next member."""
    x, y = batch
    n = len(y)
    budget = torch.full((n,), eps)
    ens = Ensemble(build_member=member_attack, members=["deepfool", "apgd_ce"], member_params={"apgd_ce": {"n_iter": 10}})
    res = ens(WhiteBoxOracle(tiny_model, n), x, y, eps=budget, norm=norm)
    alone = member_attack("deepfool", 0)(WhiteBoxOracle(tiny_model, n), x, y, eps=budget, norm=norm)
    inside = lp_norm(alone.x_adv - x, norm) <= eps
    assert (alone.success & ~inside).any(), "some DeepFool examples should lie beyond the budget"
    assert torch.equal(res.info["broken_by"] == 0, alone.success & inside)
    assert (lp_norm(res.x_adv - x, norm) <= eps * (1 + 1e-5)).all()
    assert bool((res.success >= (alone.success & inside)).all())


def test_min_eps_is_no_larger_than_any_members(tiny_model, batch) -> None:
    """The search probes the ensemble: a probe any member wins, the ensemble wins too."""
    x, y = batch
    threat = ThreatModel(norm="linf", goal="untargeted", eps=0.08)
    search = SearchSettings(resolution=0.05)
    ens = evaluate_batch(Ensemble(build_member=member_attack, members=["fgsm", "apgd_ce"], member_params={"apgd_ce": {"n_iter": 10}}),
                         tiny_model, x, y, None, threat, search)
    for member in (member_attack("fgsm", 0), member_attack("apgd_ce", 0, {"n_iter": 10})):
        alone = evaluate_batch(member, tiny_model, x, y, None, threat, search)
        assert bool((ens["success_at_budget"] >= alone["success_at_budget"]).all())
        # Bisection paths differ between the two, so allow one search resolution.
        tol = search.resolution * threat.eps
        assert bool((ens["min_eps"] <= alone["min_eps"] + tol).all()), type(member).__name__
    assert float(ens["min_eps"].median()) <= float(alone["min_eps"].median())


@pytest.mark.parametrize("norm", ["linf", "l2"])
@pytest.mark.parametrize("targeted", [False, True])
def test_apgd_ensemble_keeps_the_catalogue_contract_on_a_short_schedule(norm, targeted, tiny_model, batch) -> None:
    """test_attacks.py runs the `apgd_ensemble` preset (up to 1000 iterations) only with the slow
    tests; the same contract with 8-iteration members, plus batch independence."""
    x, y = batch
    n = len(y)
    target = target_classes(torch.arange(n), y, 10, seed=0) if targeted else None
    eps = torch.linspace(0.2, 1.0, n) * {"linf": 0.1, "l2": 0.8}[norm] * (3 if targeted else 1)
    auto = member_attack("apgd_ensemble", 0, {"member_params": {"apgd_ce": {"n_iter": 8}, "apgd_t": {"n_iter": 8}}})
    assert auto.steps == 8 + 9 * 8
    oracle = WhiteBoxOracle(tiny_model, n)
    res = auto(oracle, x, y, eps=eps, norm=norm, target=target)
    assert_budgeted_contract(auto, res, oracle, tiny_model, x, y, eps, norm, target)
    ids = torch.arange(n)
    halves = [auto(oracle.subset(i), x[i], y[i], eps=eps[i], norm=norm, target=None if target is None else target[i],
                   sample_id=i) for i in (ids[:70], ids[70:])]
    assert torch.allclose(res.x_adv, torch.cat([h.x_adv for h in halves]), atol=1e-5)
    assert torch.equal(res.info["broken_by"], torch.cat([h.info["broken_by"] for h in halves]))


def test_configured_by_member_option_names_with_the_run_seed() -> None:
    cfg = compose_config("config", ["attack=ensemble", "attack.members=[pgd,apgd_dlr]", "seed=7",
                                    "attack.params.member_params={apgd_dlr: {n_iter: 20}}"])
    ens = construct(OmegaConf.to_container(cfg.attack.params, resolve=True))
    assert ens.members == ["pgd", "apgd_dlr"]
    assert ens.params()["resolved"]["pgd"]["seed"] == 7
    assert ens.params()["resolved"]["apgd_dlr"] == {**member_attack("apgd_dlr", 7).params(), "n_iter": 20}
    auto = construct(OmegaConf.to_container(compose_config("config", ["attack=apgd_ensemble"]).attack.params, resolve=True))
    assert auto.members == ["apgd_ce", "apgd_t"] and auto.steps == 100 + 900


@pytest.mark.parametrize("overrides,match", [
    (["attack.members=[apgd_ce,nope]"], "unknown ensemble member 'nope'"),
    (["attack.members=[]"], "at least one member"),
    (["attack.members=[bim,bim]"], "repeat"),
    (["attack.params.member_params={fgsm: {steps: 3}}"], "not among the members"),
    (["attack.params.member_params={apgd_ce: {n_iter: 0}}"], "apgd_ce"),
])
def test_bad_member_lists_are_one_line_errors(overrides, match) -> None:
    with pytest.raises(AdvbenchError, match=match) as info:
        compose_config("config", ["attack=ensemble", *overrides])
    assert "\n" not in str(info.value)
