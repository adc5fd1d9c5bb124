"""AutoAttack's versions: the original's member lists and settings, Square on the white-box
oracle's scores with its queries counted, the rand version's EOT, and its one-line errors."""

from __future__ import annotations

import json
import warnings

import pandas as pd
import pytest
import torch
from contract import assert_budgeted_contract
from omegaconf import OmegaConf
from torch import nn

import advbench
from advbench.cli.config import compose_config
from advbench.cli.option_targets import construct, member_attack
from advbench.core.catalog import option_data
from advbench.core.errors import AdvbenchError, AdvbenchWarning
from advbench.robustness.attacks.apgd import APGD
from advbench.robustness.attacks.autoattack import VERSIONS, AutoAttack
from advbench.robustness.attacks.oracles import ScoreOracle, WhiteBoxOracle
from advbench.robustness.attacks.score import AutoAttackSquare
from advbench.robustness.audit.audit import audit
from advbench.robustness.audit.card import card
from advbench.robustness.report.shards import identify

pytestmark = pytest.mark.usefixtures("one_thread")

# The original's attack names -> the options that run them here.
OURS = {"apgd-ce": "apgd_ce", "apgd-dlr": "apgd_dlr", "apgd-t": "apgd_t", "fab": "fab", "fab-t": "fab_t",
        "square": "square_autoattack"}


def built(cfg):
    """The attack of a composed config, as the run builds it."""
    return construct(OmegaConf.to_container(cfg.attack.params, resolve=True))


@pytest.fixture(scope="module")
def batch(digits_tensors):
    _, _, x, y = digits_tensors
    return x[:60], y[:60]


def _needs_members(version: str) -> None:
    missing = [m for m in VERSIONS[version] if option_data("attack", m) is None]
    if missing:
        pytest.skip(f"attack options {', '.join(missing)} are not in this tree")


@pytest.mark.parametrize("norm", ["Linf", "L2"])
@pytest.mark.parametrize("version", ["standard", "plus", "rand"])
def test_versions_run_the_original_members_with_its_settings(version: str, norm: str, tiny_model) -> None:
    """The member list, restarts, target classes, Square's budget and EOT passes of the
    original's `AutoAttack(build_member=member_attack, version=...)` (pyautoattack 0.2.0, its `_set_version`)."""
    original = pytest.importorskip("pyautoattack").AutoAttack(tiny_model, version=version, norm=norm, eps=0.1)
    _needs_members(version)
    ours = AutoAttack(build_member=member_attack, version=version, seed=0)
    assert ours.members == [OURS[name] for name in original.attacks_to_run]
    resolved = ours.params()["resolved"]
    fab_restarts = {"fab": original.fab.n_restarts, "fab_t": 1}  # the original runs FAB-T with one start
    for name, settings in resolved.items():
        if name.startswith("apgd"):
            theirs = original.apgd_targeted if name == "apgd_t" else original.apgd
            assert (settings["n_iter"], settings["n_restarts"]) == (theirs.n_iter, theirs.n_restarts), name
            assert settings["rho"] == pytest.approx(theirs.thr_decr)
        if name == "apgd_t":
            assert settings["n_target_classes"] == original.apgd_targeted.n_target_classes
        if name.startswith("fab"):
            assert (settings["n_iter"], settings["n_restarts"]) == (original.fab.n_iter, fab_restarts[name])
        if name == "fab_t":
            assert settings["n_target_classes"] == original.fab.n_target_classes
        if name == "square_autoattack":  # its iterations after the start's query
            assert (settings["n_queries"] - 1, settings["p_init"]) == (original.square.n_queries, original.square.p_init)
            assert not original.square.rescale_schedule and not AutoAttackSquare.rescaled_schedule
    passes = original.apgd.eot_iter
    oracle = ours._member_oracle(ours._attacks[0], WhiteBoxOracle(tiny_model, 1))
    assert (oracle.eot_passes or 1) == passes


def _settings_the_original_runs(monkeypatch, model: nn.Module, members: list[str], x, y) -> dict[str, dict]:
    """Each member's settings as the original's custom version holds them when it runs the member
    (its `perturb` is replaced by a recorder that returns the clean input, so every member runs)."""
    aa = pytest.importorskip("pyautoattack")
    from pyautoattack.autopgd_base import APGDAttack, APGDAttack_targeted
    from pyautoattack.fab_pt import FABAttack_PT
    from pyautoattack.square import SquareAttack

    ran: dict[str, dict] = {}

    def recorder(name_of, read):
        def perturb(self, x, y=None, *args, **kwargs):
            ran[name_of(self)] = read(self)
            return x.clone()
        return perturb

    apgd = ("n_iter", "n_restarts", "eot_iter", "thr_decr", "n_target_classes")
    monkeypatch.setattr(APGDAttack, "perturb", recorder(lambda a: OURS["apgd-" + a.loss],
                                                        lambda a: {k: getattr(a, k, None) for k in apgd}))
    monkeypatch.setattr(APGDAttack_targeted, "perturb", recorder(lambda a: "apgd_t",
                                                                 lambda a: {k: getattr(a, k) for k in apgd}))
    monkeypatch.setattr(FABAttack_PT, "perturb", recorder(lambda a: "fab_t" if a.targeted else "fab", lambda a: {
        k: getattr(a, k) for k in ("n_iter", "n_restarts", "n_target_classes", "alpha_max", "eta", "beta")}))
    monkeypatch.setattr(SquareAttack, "perturb", recorder(lambda a: "square_autoattack", lambda a: {
        "n_queries": a.n_queries, "p_init": a.p_init, "n_restarts": a.n_restarts, "rescaled": a.rescale_schedule}))
    theirs = aa.AutoAttack(model, attacks=members, version="custom", norm="Linf", eps=0.1)
    theirs.verbose = False
    theirs.run_standard_evaluation(x, y, batch_size=len(y))
    return ran


@pytest.mark.parametrize("members", [["apgd-ce", "apgd-dlr", "fab", "square", "apgd-t", "fab-t"],
                                     ["fab-t", "fab", "apgd-t", "apgd-dlr"]])
def test_custom_runs_the_original_members_with_its_constructor_settings(members, monkeypatch, tiny_model,
                                                                        batch) -> None:
    """version=custom gives the original's members the settings its custom version runs them with:
    the constructor's (APGD-CE, APGD-DLR and FAB 5 restarts), FAB-T one start, and FAB after FAB-T
    the one start FAB-T left on the shared object; the records' attack_params name them."""
    x, y = batch
    theirs = _settings_the_original_runs(monkeypatch, tiny_model, members, x[:8], y[:8])
    ours = AutoAttack(build_member=member_attack, version="custom", members=[OURS[m] for m in members], seed=0)
    resolved = ours.params()["resolved"]
    assert list(theirs) == ours.members
    for name, settings in theirs.items():
        mine = resolved[name]
        if name != "square_autoattack":
            assert (mine["n_iter"], mine["n_restarts"]) == (settings["n_iter"], settings["n_restarts"]), name
        if name.startswith("apgd"):
            assert settings["eot_iter"] == 1 and mine["rho"] == pytest.approx(settings["thr_decr"])
        if name in ("apgd_t", "fab_t"):
            assert mine["n_target_classes"] == settings["n_target_classes"], name
        if name.startswith("fab"):
            assert mine["final_search"] == 0, "the original's FAB stops at its last iterate"
            assert (mine["alpha_max"], mine["eta"], mine["beta"]) == pytest.approx(
                (settings["alpha_max"], settings["eta"], settings["beta"]))
        if name == "square_autoattack":
            assert (mine["n_queries"] - 1, mine["p_init"]) == (settings["n_queries"], settings["p_init"])
            assert settings["n_restarts"] == 1 and not settings["rescaled"] and not AutoAttackSquare.rescaled_schedule
    assert resolved["apgd_dlr"]["n_restarts"] == 5, "the constructor's restarts, not the option's one start"


def test_records_name_the_settings_custom_ran_and_ensemble_keeps_the_options_own(tiny_model, batch) -> None:
    """A custom run's records hold the original's 5 restarts for APGD-CE; attack=ensemble, the
    lighter way, runs the same member with its option's one start."""
    x, y = batch
    short = {"apgd_ce": {"n_iter": 2}}
    custom = AutoAttack(build_member=member_attack, version="custom", members=["apgd_ce"], member_params=short)
    frame = advbench.evaluate(tiny_model, (x[:6], y[:6]), attack=custom, eps=0.1, overrides=["search.enabled=false"])
    params = json.loads(frame["attack_params"].iloc[0])
    assert (params["version"], params["resolved"]["apgd_ce"]["n_restarts"]) == ("custom", 5)
    assert params["resolved"]["apgd_ce"]["n_iter"] == 2, "member_params still override the original's settings"
    light = built(compose_config("config", ["attack=ensemble", "attack.members=[apgd_ce]"]))
    assert light.params()["resolved"]["apgd_ce"]["n_restarts"] == 1


def test_square_runs_on_the_white_box_oracle_scores_with_its_queries_counted(tiny_model, batch) -> None:
    """A custom version of Square then APGD-CE: under white knowledge Square meets each sample as
    it would under score knowledge and pays the same queries, APGD-CE the samples it left."""
    x, y = batch
    n = len(y)
    eps = torch.full((n,), 0.12)
    short = {"square_autoattack": {"n_queries": 300}, "apgd_ce": {"n_iter": 5, "n_restarts": 1}}
    auto = AutoAttack(build_member=member_attack, version="custom", members=["square_autoattack", "apgd_ce"], member_params=short, seed=3)
    assert auto.knowledge == ("white",)
    oracle = WhiteBoxOracle(tiny_model, n)
    res = auto(oracle, x, y, eps=eps, norm="linf")
    assert_budgeted_contract(auto, res, oracle, tiny_model, x, y, eps, "linf", None)

    scores = ScoreOracle(tiny_model, n)
    first = AutoAttackSquare(n_queries=300, seed=3)(scores, x, y, eps=eps, norm="linf")
    left = (~first.success).nonzero().squeeze(1)
    white = WhiteBoxOracle(tiny_model, len(left))
    second = APGD(n_iter=5, seed=3)(white, x[left], y[left], eps=eps[left], norm="linf", sample_id=left)
    assert bool(first.success.any()) and bool(second.success.any())
    broken_by = res.info["broken_by"]
    assert torch.equal(broken_by[first.success], torch.zeros_like(broken_by[first.success]))
    assert torch.equal(broken_by[left], torch.where(second.success, 1, -1))
    expected = scores.queries.clone()
    expected[left] += white.queries
    assert torch.equal(oracle.queries, expected)
    assert torch.equal(oracle.grad_evals[left], white.grad_evals)
    assert torch.equal(res.first_success[left][second.success], 300 + second.first_success[second.success])


def test_the_rand_version_averages_every_gradient_over_twenty_passes(tiny_model, batch) -> None:
    x, y = batch
    n = len(y)
    short = {"apgd_ce": {"n_iter": 3}, "apgd_dlr": {"n_iter": 3}}
    auto = AutoAttack(build_member=member_attack, version="rand", member_params=short, seed=0)
    oracle = WhiteBoxOracle(tiny_model, n)
    res = auto(oracle, x, y, eps=torch.full((n,), 0.02), norm="linf")
    robust = ~res.success & (tiny_model(x).argmax(1) == y)
    assert bool(robust.any())
    assert torch.equal(oracle.grad_evals[robust], torch.full_like(oracle.grad_evals[robust], 20 * (3 + 3)))
    assert auto.params()["version"] == "rand"


class Noisy(nn.Module):
    """The tiny model behind Gaussian input noise, fresh on every pass: a randomized model."""

    randomized = True

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x + 0.3 * torch.randn_like(x))


def test_rand_records_its_twenty_passes_and_which_judge_made_the_number(tiny_model, batch) -> None:
    """The default judges rand by the engine's vote (judge_draws 20), judge=original by its own rule
    (one pass: judge_draws 1); attack_params and the model card say which, and the 20 EOT passes."""
    x, y = batch
    short = {"apgd_ce": {"n_iter": 2}, "apgd_dlr": {"n_iter": 2}}
    frames = {judge: advbench.evaluate(advbench.Model(Noisy(tiny_model).eval(), randomized=True), (x[:6], y[:6]), eps=0.1,
                                       overrides=["search.enabled=false"],
                                       attack=AutoAttack(build_member=member_attack, version="rand", member_params=short, judge=judge))
              for judge in ("vote", "original")}
    for judge, frame in frames.items():
        params = json.loads(frame["attack_params"].iloc[0])
        assert (params["judge"], params["eot_passes"]) == (judge, 20)
        entry, = card(audit(frame), [])["models"][0]["threats"][0]["attacks"]
        assert (entry["judge"], entry["judge_draws"]) == (judge, {"vote": 20, "original": 1}[judge])
        robust = frame["clean_correct"].astype(bool) & ~frame["success_at_budget"].astype(bool)
        assert (robust == (frame["adv_pred"] == frame["label"])).all(), "the summary's accuracy reads the same verdicts"
        assert (robust == (frame["adv_fraction"] < 0.5)).all()
    assert set(frames["vote"]["judge_draws"]) == {20}
    default = built(compose_config("config", ["attack=autoattack", "attack.version=rand"]))
    assert default.params()["judge"] == "vote" and not default.judges_itself


def test_original_judge_keeps_the_last_iterate_a_single_pass_called_adversarial(tiny_model, batch) -> None:
    """judge=original: a broken sample's example is the last iterate one pass met the goal at, and
    one more pass there agreed; the extra passes are counted queries within the declared cost."""
    x, y = batch
    n, noisy = len(y), Noisy(tiny_model).eval()
    auto = AutoAttack(build_member=member_attack, version="rand",
                      member_params={"apgd_ce": {"n_iter": 4}, "apgd_dlr": {"n_iter": 4}}, judge="original")
    oracle = WhiteBoxOracle(noisy, n, draws=20)
    torch.manual_seed(0)
    res = auto(oracle, x, y, eps=torch.full((n,), 0.15), norm="linf")
    assert bool(res.success.any()) and not bool(res.success.all())
    with torch.no_grad():
        fooled = torch.stack([noisy(res.x_adv).argmax(1) != y for _ in range(50)]).float().mean(0)
    assert float(fooled[res.success].mean()) > float(fooled[~res.success].mean())
    declared = auto.declared_cost("white", "untargeted", 10)
    assert bool((oracle.queries <= declared.queries).all()) and bool((oracle.grad_evals <= declared.grad_evals).all())
    assert bool((oracle.queries[~res.success] > 2 * 4).all()), "a pass at every iterate of both members"


@pytest.mark.parametrize("overrides,match", [
    (["attack.version=custom"], "version=custom needs them"),
    (["attack.version=rand", "attack.members=[apgd_ce]"], "version=rand runs its own"),
    (["attack.version=extra"], "unknown version 'extra'"),
    (["attack.version=custom", "attack.members=[apgd_ce,square_autoattack,nope]"], "unknown ensemble member 'nope'"),
    (["attack.version=rand", "attack.params.member_params={fab_t: {n_iter: 3}}"], "not among the members"),
    (["attack.judge=original"], "attack.judge=original is the rand version's rule"),
    (["attack.version=rand", "attack.judge=count"], "judge"),
])
def test_bad_versions_are_one_line_errors(overrides: list[str], match: str) -> None:
    with pytest.raises(AdvbenchError, match=match) as info:
        built(compose_config("config", ["attack=autoattack", *overrides]))
    assert "\n" not in str(info.value)


class Rounded(nn.Module):
    """The tiny model behind a rounding of its input: zero input gradients, the same decisions nearby."""

    bounds = (0.0, 1.0)

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(torch.round(x * 8) / 8)


def _warnings_of(model: nn.Module, data: tuple[torch.Tensor, torch.Tensor]) -> tuple[list[str], pd.DataFrame]:
    attack = AutoAttack(build_member=member_attack, version="custom", members=["apgd_ce", "square_autoattack"],
                        member_params={"apgd_ce": {"n_iter": 3}, "square_autoattack": {"n_queries": 200}})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        frame = advbench.evaluate(model, data, attack=attack, eps=0.15, overrides=["search.enabled=false"])
    return [str(w.message) for w in caught if issubclass(w.category, AdvbenchWarning)], frame


def test_square_beating_the_gradients_warns_on_masked_gradients_only(tiny_model, batch) -> None:
    """AutoAttack's check that Square broke what the white-box members could not: it fires
    behind a rounding (no input gradient) and stays silent on the plain model."""
    x, y = batch
    said, frame = _warnings_of(Rounded(tiny_model), (x[:30], y[:30]))
    masked = [w for w in said if "square_autoattack broke" in w]
    assert len(masked) == 1 and "gradients may be masked" in masked[0]
    assert set(frame["broken_by"]) >= {1}, "Square broke samples behind the rounding"
    said, frame = _warnings_of(tiny_model, (x[:30], y[:30]))
    assert not [w for w in said if "broke" in w]
    assert json.loads(frame["attack_params"].iloc[0])["version"] == "custom"
    assert set(identify(frame)["attack"]) == {"autoattack-custom"}, "readers name the version"


@pytest.mark.parametrize("version,members,classes,match", [
    ("custom", ["apgd_t"], 5, "n_target_classes=9 exceeds the 4 other classes"),
    ("rand", None, 2, "DLR loss needs >= 3 classes, the model has 2"),
])
def test_too_few_classes_for_the_target_classes_or_dlr_is_one_line_error(version, members, classes, match, tiny_model,
                                                                         batch) -> None:
    """AutoAttack's `check_n_classes` warns and then fails inside the attack with a traceback; here
    the member that cannot run stops the run with one line that says why."""
    x, y = batch
    few = nn.Sequential(tiny_model, _FirstLogits(classes))
    n = len(y)
    oracle = WhiteBoxOracle(few, n)
    with pytest.raises(AdvbenchError, match=match) as info:
        attack = AutoAttack(build_member=member_attack, version=version, members=members, seed=0)
        attack(oracle, x, y.clamp(max=classes - 1), eps=torch.full((n,), 0.1), norm="linf")
    assert "\n" not in str(info.value)


class _FirstLogits(nn.Module):
    def __init__(self, k: int) -> None:
        super().__init__()
        self.k = k

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return z[:, :self.k]
