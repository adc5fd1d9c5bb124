"""The contract every attack in the catalogue must keep, on a real (tiny) trained model.

Parametrised over the catalogue (`conf/attack/*.yaml`, then the user's `ADVBENCH_CONF` folders), so
a new attack is held to the same contract by default: budget (`strength_budget`) and bounds
respected, success only where the model agrees, targeted success means the target, per-sample
budgets independent of each other.
"""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from advbench.cli.option_targets import construct
from advbench.core.catalog import group_options, option_data, option_file
from advbench.core.errors import AdvbenchError
from advbench.core.norms import norm as norm_of
from advbench.core.steps import lp_norm
from advbench.robustness.attacks.gradient import BIM, FGSM
from advbench.robustness.attacks.oracles import Oracle, WhiteBoxOracle, build_oracle
from advbench.robustness.attacks.worst_case import Ensemble
from advbench.robustness.data.target_classes import target_classes
from advbench.robustness.evaluation.measure import evaluate_batch
from advbench.robustness.specs import SearchSettings
from advbench.robustness.threat import ThreatModel

ATTACKS = group_options("attack")
BUDGETS = {"linf": 0.1, "l2": 0.8, "l1": 1.5, "l0": 4.0, "patch": 3.0}
# Minimum-norm attacks run their whole schedule on every sample whatever eps: fewer samples
# keep the catalogue fast. C&W's seed schedule is ~1000 Adam steps a sample: slow here, and
# its contract is also tested fast with a short schedule in test_minimum_norm.py; so are EAD's (up to 9000
# FISTA steps a sample) in test_ead.py. APGD-T and the
# APGD ensembles (apgd_ensemble, autoattack) take 1000 iterations and more on every robust sample (~40 s a test here);
# test_apgd.py and test_ensemble.py hold them to the contract fast with short schedules.
MINIMIZING_N = 50
# Boundary and Evolutionary take one query a step (~4 s for the 1000 here); test_decision.py and
# test_evolutionary.py hold them to the contract fast.
SLOW = {"cw", "cw_clip", "ead", "apgd_t", "apgd_ensemble", "autoattack", "boundary", "evolutionary"}
CATALOGUE = [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in ATTACKS]
# Query budgets of score-based attacks (20,000 a sample in the catalogue) cut to keep the contract fast
# (NES/SPSA: 20 steps on 20 direction pairs; Square 2,000, where its ℓ1 search broke 10 % of the digits at 1,000).
SHORT = {"square": {"n_queries": 2000}, "square_autoattack": {"n_queries": 1000},
         "nes": {"n_queries": 821, "samples": 20}, "spsa": {"n_queries": 821, "samples": 20},
         "hsj": {"max_queries": 1000}, "boundary": {"max_queries": 1000}, "evolutionary": {"max_queries": 700}}
# ZOO: 10 steps on 16 coordinates at a larger Adam step. NATTACK: 10 steps of 10 draws in pixel space, since
# its arctanh pre-image barely moves digits' saturated pixels in 10 steps; tests/test_zoo_nattack.py holds the
# default tanh box to the contract.
SHORT |= {"zoo": {"n_queries": 331, "coordinates": 16, "lr": 0.1},
          "nattack": {"n_queries": 111, "samples": 10, "box": "clip"}}
# ALMA: 50 of its 1000 steps. Its RMSProp steps amplify rounding (so do the authors'): the ulp by which a
# batch's size changes the model's kernels grows to 6e-8 in 30 steps, 5e-6 in 60 and 4e-3 in 100 (50 digits
# vs their halves), which the no-interaction check below cannot tell from a leak; tests/test_alma.py runs
# the full schedule.
SHORT |= {"alma": {"steps": 50}}
# Sparse-RS: 300 of its 20,000 queries (digits break within a few dozen at these budgets).
SHORT |= {"sparse_rs": {"n_queries": 300}}
# AutoAttack: its FAB-T and Square members, which run on what the APGD members leave (every threat's, ℓ1's
# included), at 20 iterations and 1,000 queries; test_crosscheck_autoattack*.py run the versions' own settings.
SHORT |= {"autoattack": {"member_params": {"fab_t": {"n_iter": 20}, "square_autoattack": {"n_queries": 1000}}}}


def make_attack(name: str):
    cfg = OmegaConf.load(option_file("attack", name))
    OmegaConf.update(cfg, "params.seed", 0, force_add=True) if "seed" in cfg.params else None
    for key, value in SHORT.get(name, {}).items():
        OmegaConf.update(cfg, f"params.{key}", value)
    return construct(OmegaConf.to_container(cfg.params, resolve=True))


def oracle_for(attack, model, n: int, knowledge: str | None = None, substitute=None) -> Oracle:
    """The oracle of `knowledge`, by default the attack's first level (white-box for gradient attacks)."""
    return build_oracle(knowledge or attack.knowledge[0], model, n, substitute)


@pytest.fixture(scope="module")
def batch(digits_tensors):
    _, _, x, y = digits_tensors
    return x[:200], y[:200]


@pytest.mark.parametrize("name", CATALOGUE)
@pytest.mark.parametrize("norm", ["linf", "l2", "l1", "l0", "patch"])
@pytest.mark.parametrize("targeted", [False, True])
def test_attack_contract(name: str, norm: str, targeted: bool, tiny_model, batch) -> None:
    attack = make_attack(name).for_norm(norm)  # as the engine builds it for the threat
    goal = "targeted" if targeted else "untargeted"
    if norm not in attack.norms or goal not in attack.goals:
        pytest.skip(f"{name} does not attack {norm} {goal}")
    check_contract(attack, attack.knowledge[0], norm, targeted, tiny_model, batch)


# The ℓ1 threats beyond white-box (conf/threat): test_attack_contract holds an attack to the contract under
# its first knowledge level; here every attack that takes one of these threats is held to it under the
# threat's own oracle (transfer: crafted on the substitute, judged on the target), and the others refuse it.
BEYOND_N = 64
L1_BEYOND_WHITE = sorted(n for n in group_options("threat")
                         if (t := option_data("threat", n))["norm"] == "l1" and t["knowledge"] != "white")


@pytest.mark.parametrize("name", ATTACKS)
@pytest.mark.parametrize("threat", L1_BEYOND_WHITE)
def test_attack_contract_under_the_l1_threats_beyond_white_box(name: str, threat: str, tiny_model, substitute,
                                                               batch) -> None:
    spec = option_data("threat", threat)
    attack = make_attack(name).for_norm(spec["norm"])
    why = attack.unsupported(spec["norm"], spec["knowledge"], spec["goal"])
    if why is not None:
        assert "\n" not in why, "a refusal is one line"
        pytest.skip(why)
    if spec["knowledge"] == attack.knowledge[0]:
        pytest.skip(f"test_attack_contract holds {name} to the contract under {spec['knowledge']} knowledge")
    if isinstance(attack, Ensemble):
        pytest.skip(f"{name}: its members are held to the contract under this threat one by one")
    if name in SLOW:  # their full schedules on every sample a transfer leaves robust: minutes here
        pytest.skip(f"{name} is slow at its catalogue settings; test_ead.py and test_apgd.py run EAD and APGD-T under "
                    "transfer with short schedules")
    few = tuple(t[:BEYOND_N] for t in batch)  # a transfer leaves most samples robust: every one runs every step
    oracle = check_contract(attack, spec["knowledge"], spec["norm"], spec["goal"] == "targeted", tiny_model, few,
                            substitute)
    assert (oracle.queries > 0).all(), "every sample is judged by counted queries of the target"


def test_no_attack_takes_an_l1_decision_threat() -> None:
    """No decision-based attack here aims at ℓ1 (docs/threat-models.md), so every one refuses it in one line."""
    for name in ATTACKS:
        for goal in ("untargeted", "targeted"):
            why = make_attack(name).for_norm("l1").unsupported("l1", "decision", goal)
            assert why is not None and "\n" not in why, name


def check_contract(attack, knowledge: str, norm: str, targeted: bool, tiny_model, batch, substitute=None) -> Oracle:
    """The contract of `attack` under `knowledge` at per-sample budgets up to the norm's; the oracle it ran with."""
    minimizing = attack.kind == "minimizing"
    x, y = (t[:MINIMIZING_N] for t in batch) if minimizing else batch
    oracle = oracle_for(attack, tiny_model, len(y), knowledge, substitute)
    target = target_classes(torch.arange(len(y)), y, 10, seed=0) if targeted else None
    eps = torch.linspace(0.2, 1.0, len(y)) * BUDGETS[norm] * (3 if targeted else 1)
    res = attack(oracle, x, y, eps=eps, norm=norm, target=target)

    assert res.x_adv.shape == x.shape
    assert res.x_adv.min() >= 0 and res.x_adv.max() <= 1
    dist = lp_norm(res.x_adv - x, norm)
    pred = tiny_model(res.x_adv).argmax(1)
    agrees = (pred == target) if targeted else (pred != y)
    assert torch.equal(res.success, agrees), "success must be what the model says on the returned example"
    if minimizing:  # eps only dates first_success; a failure returns x, never a perturbation
        assert torch.equal(res.x_adv[~res.success], x[~res.success])
        assert torch.equal(res.first_success >= 0, res.success & (dist <= eps))
        if oracle.knowledge == "decision":  # strength is queries, counted by the oracle
            assert (oracle.queries <= attack.strength_budget).all()
    else:
        assert (dist <= eps * (1 + 1e-5) + 1e-6).all()
        assert torch.equal(res.success, res.first_success >= 0)
        assert (res.first_success <= attack.strength_budget).all() and (oracle.grad_evals <= attack.strength_budget).all()
        if oracle.knowledge == "score":  # strength is queries: the oracle's count stays within the budget
            assert (oracle.queries <= attack.strength_budget).all()
    assert res.success.float().mean() > 0.1, "the attack should break a natural model on some samples"
    if targeted:
        assert (pred[res.success] == target[res.success]).all()
    return oracle


@pytest.mark.parametrize("name", CATALOGUE)
def test_zero_budget_changes_nothing(name: str, tiny_model, batch) -> None:
    if make_attack(name).kind == "minimizing":
        pytest.skip("eps does not bound a minimum-norm attack")
    x, y = batch
    attack = make_attack(name)
    norm = "linf" if "linf" in attack.norms else attack.norms[0]
    res = attack(oracle_for(attack, tiny_model, len(y)), x, y, eps=torch.zeros(len(y)), norm=norm)
    assert torch.equal(res.x_adv, x)
    assert torch.equal(res.success, tiny_model(x).argmax(1) != y)


@pytest.mark.parametrize("name", CATALOGUE)
def test_samples_do_not_interact(name: str, tiny_model, batch) -> None:
    """Attacking a batch equals attacking its halves: no cross-sample state leaks, and random
    draws follow the sample id, not the batch position."""
    attack = make_attack(name)
    norm = "linf" if "linf" in attack.norms else attack.norms[0]
    x, y = (t[:MINIMIZING_N] for t in batch) if attack.kind == "minimizing" else batch
    h = len(y) // 2
    oracle = oracle_for(attack, tiny_model, len(y))
    eps = torch.full((len(y),), BUDGETS[norm] if norm_of(norm).whole else 0.08)  # ℓ0: 0.08 would keep 0 pixels
    whole = make_attack(name)(oracle, x, y, eps=eps, norm=norm)
    ids = torch.arange(len(y))
    a = make_attack(name)(oracle.subset(ids[:h]), x[:h], y[:h], eps=eps[:h], norm=norm, sample_id=ids[:h])
    b = make_attack(name)(oracle.subset(ids[h:]), x[h:], y[h:], eps=eps[h:], norm=norm, sample_id=ids[h:])
    assert torch.allclose(whole.x_adv, torch.cat([a.x_adv, b.x_adv]), atol=1e-5)
    assert torch.equal(whole.first_success, torch.cat([a.first_success, b.first_success]))


# Attacks whose search through the engine takes over ~10 s on a busy CPU run with the slow tests.
ENGINE_SLOW = {"cw", "cw_clip", "ead", "apgd_t", "apgd_ensemble", "autoattack", "ensemble", "boundary", "evolutionary"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in ENGINE_SLOW else n for n in ATTACKS])
def test_engine_records_of_every_attack_keep_the_invariants(name: str, tiny_model, batch) -> None:
    """Through the engine: success at the budget ⇔ min_eps ≤ budget, brackets of probed ε, and
    for a minimum-norm attack min_eps is the norm of the example it returns (inf if none)."""
    attack = make_attack(name)
    norm = "linf" if "linf" in attack.norms else attack.norms[0]
    eps = BUDGETS[norm]
    x, y = (t[:32] for t in batch)
    threat = ThreatModel(norm=norm, goal="untargeted", eps=eps, knowledge=attack.knowledge[0])
    out = evaluate_batch(attack, tiny_model, x, y, None, threat, SearchSettings(resolution=0.1, max_probes=5))
    hi, lo = out["min_eps"], out["min_eps_lo"]
    assert torch.equal(out["success_at_budget"], hi <= eps)
    both = torch.isfinite(hi) & torch.isfinite(lo)
    assert (lo[both] < hi[both]).all()
    if attack.kind != "minimizing":
        assert out["min_eps_source"] == "search"
        return
    assert out["min_eps_source"] == "norm" and torch.isnan(lo).all()
    res = make_attack(name)(oracle_for(attack, tiny_model, len(y)), x, y, eps=torch.full((len(y),), eps), norm=norm)
    norms = lp_norm(res.x_adv.double() - x.double(), norm)
    fresh = tiny_model(x).argmax(1) == y
    adv = tiny_model(res.x_adv).argmax(1) != y
    within = fresh & adv & (norms <= eps)
    assert within.any() and torch.equal(hi[within], norms[within]), "min_eps is the returned example's norm"
    assert torch.isinf(hi[fresh & ~adv & ~out["success_at_budget"]]).all()


def test_negative_eps_is_rejected(tiny_model, batch) -> None:
    x, y = batch
    with pytest.raises(AdvbenchError, match="eps"):
        BIM()(WhiteBoxOracle(tiny_model, len(y)), x, y, eps=torch.full((len(y),), -0.1), norm="linf")


def test_unknown_norm_is_rejected(tiny_model, batch) -> None:
    x, y = batch
    with pytest.raises(AdvbenchError, match="norms"):
        BIM()(WhiteBoxOracle(tiny_model, len(y)), x, y, eps=torch.full((len(y),), 0.1), norm="l1")


def test_more_iterations_never_hurt_first_success(tiny_model, batch) -> None:
    """The strength curve comes from one run: first_success at 20 steps agrees with a 10-step run."""
    x, y = batch
    oracle = WhiteBoxOracle(tiny_model, len(y))
    eps = torch.full((len(y),), 0.1)
    long = BIM(steps=20)(oracle, x, y, eps=eps, norm="linf")
    short = BIM(steps=10)(oracle, x, y, eps=eps, norm="linf")
    broke_early = (long.first_success >= 0) & (long.first_success <= 10)
    assert torch.equal(broke_early, short.success)


@pytest.mark.parametrize("norm", ["linf", "l2"])
def test_bim_min_eps_below_fgsm_on_nearly_all_samples(norm: str, tiny_model, digits_tensors) -> None:
    _, _, x, y = digits_tensors
    threat = ThreatModel(norm=norm, goal="untargeted", eps=BUDGETS[norm])
    search = SearchSettings(resolution=0.02)
    fgsm = evaluate_batch(FGSM(), tiny_model, x, y, None, threat, search)
    bim = evaluate_batch(BIM(), tiny_model, x, y, None, threat, search)
    both = torch.isfinite(fgsm["min_eps"]) & torch.isfinite(bim["min_eps"])
    tol = 0.02 * BUDGETS[norm]
    share = float((bim["min_eps"][both] <= fgsm["min_eps"][both] + tol).float().mean())
    assert share >= 0.95, f"BIM min-eps <= FGSM's on only {share:.1%} of samples"
    assert float(torch.isinf(bim["min_eps"]).float().mean()) <= float(torch.isinf(fgsm["min_eps"]).float().mean())


@pytest.mark.parametrize("goal", ["untargeted", "targeted"])
def test_min_eps_brackets_are_consistent(goal: str, tiny_model, digits_tensors) -> None:
    _, _, x, y = digits_tensors
    x, y = x[:150], y[:150]
    target = target_classes(torch.arange(len(y)), y, 10, seed=0) if goal == "targeted" else None
    threat = ThreatModel(norm="linf", goal=goal, eps=0.1)
    out = evaluate_batch(BIM(), tiny_model, x, y, target, threat, SearchSettings())
    both = torch.isfinite(out["min_eps"]) & torch.isfinite(out["min_eps_lo"])
    assert (out["min_eps_lo"][both] < out["min_eps"][both]).all()
    succ = out["success_at_budget"]
    assert torch.equal(succ, out["min_eps"] <= 0.1), "success at the budget iff min_eps <= budget"
    width = (out["min_eps"] - out["min_eps_lo"])[both & (out["min_eps_lo"] > 0)]
    assert (width <= 0.05 * 0.1 + 1e-12).all(), "bisection must reach the configured resolution"
    adv_ok = (out["adv_pred"] == target) if target is not None else (out["adv_pred"] != y)
    assert torch.equal(adv_ok, succ)


def test_normalized_l2_budget_is_in_per_pixel_units(tiny_model, batch) -> None:
    """ImageNet's ℓ2 budget is ‖δ‖₂/√d: the engine scales it to the raw norm and back."""
    x, y = batch
    d = x[0].numel()
    threat = ThreatModel(norm="l2", goal="untargeted", eps=0.1, normalized_l2=True)
    assert threat.scale(x) == pytest.approx(d ** 0.5)
    out = evaluate_batch(BIM(), tiny_model, x, y, None, threat, SearchSettings())
    assert (out["dist_l2_norm"] <= 0.1 * (1 + 1e-5)).all()
    assert torch.allclose(out["dist_l2_norm"] * d ** 0.5, out["dist_l2"], rtol=1e-5)
    found = torch.isfinite(out["min_eps"])
    assert (out["min_eps"][found] <= 4 * 0.1 + 1e-6).all()
    assert (out["min_eps"][out["success_at_budget"]] <= 0.1 + 1e-6).all()
