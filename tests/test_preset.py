"""experiment=full_eval: its cells, its cost stated before it runs (equal to the declared budgets, and
bounding what the oracles count), end to end from the command line and the Python API, and its
one-line refusals."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import torch
from click.testing import CliRunner

import advbench
from advbench.cli.main import main
from advbench.cli.option_targets import member_attack
from advbench.core.errors import AdvbenchError
from advbench.robustness.attacks.apgd import APGD
from advbench.robustness.attacks.autoattack import AutoAttack
from advbench.robustness.attacks.fab import FAB
from advbench.robustness.attacks.minimum_norm import DeepFool
from advbench.robustness.attacks.oracles import WhiteBoxOracle
from advbench.robustness.data.target_classes import target_classes
from advbench.robustness.models import build_model

BUDGETS = {"apgd_iterations": 3, "apgd_target_classes": 2, "fmn_steps": 5, "transfer_steps": 2,
           "square_queries": 30, "hsj_queries": 40}
PROBES, SAMPLES = 1, 6
TINY = [*(f"full_eval.{k}={v}" for k, v in BUDGETS.items()), f"search.max_probes={PROBES}",
        f"dataset.n_samples={SAMPLES}", "threads=1", "substitute.defense.recipe.epochs=2"]
CELLS = {(k, n, g) for k in ("white", "transfer", "score", "decision") for n in ("linf", "l2")
         for g in ("untargeted", "targeted")}

# A digits classifier that fits itself at construction (a second of full-batch Adam on sklearn's
# digits), so the attacks meet correctly classified samples and spend their budgets.
NET_SOURCE = '''
import torch
from sklearn.datasets import load_digits
from torch import nn


def fitted():
    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(digits.target)
    net = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    opt = torch.optim.Adam(net.parameters(), lr=0.01)
    for _ in range(150):
        opt.zero_grad()
        nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
    return net
'''


def _declared(goal: str) -> dict[str, tuple[int, int]]:
    """Per-sample (gradient evaluations, queries) of each attack, from the budgets given above:
    APGD-CE, then APGD-T per runner-up class (towards the one target under a targeted goal); a
    budgeted attack runs once plus once per probe."""
    runs = 1 + PROBES
    apgd = BUDGETS["apgd_iterations"] * (1 + (1 if goal == "targeted" else BUDGETS["apgd_target_classes"]))
    return {"apgd_ensemble": (apgd * runs, 0), "fmn": (BUDGETS["fmn_steps"], 0),
            "mim": (BUDGETS["transfer_steps"] * runs, 0), "square": (0, BUDGETS["square_queries"] * runs),
            "hsj": (0, BUDGETS["hsj_queries"])}


def _per_sample() -> list[int]:
    """Gradient evaluations and queries per sample over the 20 cells: each attack under 2 norms and both goals."""
    return [2 * sum(c[i] for goal in ("untargeted", "targeted") for c in _declared(goal).values()) for i in (0, 1)]


def test_the_stated_cost_is_the_declared_budgets_summed() -> None:
    cost = advbench.preset_cost("full_eval", TINY)
    assert len(cost) == 20 and set(zip(cost["knowledge"], cost["norm"], cost["goal"])) == CELLS
    for row in cost.itertuples():
        assert (row.grad_evals_per_sample, row.queries_per_sample) == _declared(row.goal)[row.attack]
        assert (row.samples, row.grad_evals, row.queries) == (SAMPLES, row.grad_evals_per_sample * SAMPLES,
                                                              row.queries_per_sample * SAMPLES)
    per_sample = _per_sample()
    assert [int(cost["grad_evals_per_sample"].sum()), int(cost["queries_per_sample"].sum())] == per_sample
    assert [int(cost["grad_evals"].sum()), int(cost["queries"].sum())] == [n * SAMPLES for n in per_sample]


@pytest.mark.parametrize("attack, goal", [(FAB(n_iter=4), "untargeted"), (FAB(n_iter=4), "targeted"),
                                          (DeepFool(steps=4, candidates=4), "untargeted"),
                                          (APGD(n_iter=4, loss="dlr", n_target_classes=3), "targeted"),
                                          (AutoAttack(build_member=member_attack, version="custom", members=["apgd_ce", "fab"],
                                                      member_params={"apgd_ce": {"n_iter": 2},
                                                                     "fab": {"n_iter": 3}}), "untargeted")])
def test_declared_costs_bound_what_the_oracle_counts(attack, goal: str, tiny_model, digits_tensors) -> None:
    """Attacks that spend one gradient per candidate class declare it (their budget alone would not
    bound the count), and APGD-T towards one target declares one run, not one per runner-up class."""
    _, _, x, y = digits_tensors
    x, y = x[:16], y[:16]
    target = target_classes(torch.arange(16), y, 10, seed=0) if goal == "targeted" else None
    oracle = WhiteBoxOracle(tiny_model, 16)
    attack(oracle, x, y, eps=torch.full((16,), 0.02), norm="l2", target=target)
    declared = attack.declared_cost("white", goal, 10)
    assert (oracle.grad_evals <= declared.grad_evals).all()
    if goal == "untargeted":  # a sample left robust spends beyond the iteration count
        assert int(oracle.grad_evals.max()) > attack.strength_budget
    else:
        assert declared.grad_evals <= attack.strength_budget


def _records(folder: Path) -> pd.DataFrame:
    return pd.concat([pd.read_parquet(p) for p in sorted(folder.glob("*.parquet"))], ignore_index=True)


def _within_the_stated_cost(records: pd.DataFrame, cost: pd.DataFrame) -> None:
    """Every cell is there, and no sample spent more than its cell's stated cost in the declared unit."""
    keys = ["attack", "knowledge", "norm", "goal"]
    stated = cost.set_index(keys)
    assert set(zip(records["knowledge"], records["norm"], records["goal"])) == CELLS
    assert set(records[keys].itertuples(index=False, name=None)) == set(stated.index)
    for (_, knowledge, norm, goal), cell in records.groupby(keys):
        row = stated.loc[tuple(cell[keys].iloc[0])]
        assert len(cell) == SAMPLES
        if knowledge in ("white", "transfer"):
            assert cell["grad_evals"].max() <= row["grad_evals_per_sample"]
        else:
            assert cell["queries"].max() <= row["queries_per_sample"] and (cell["grad_evals"] == 0).all()
    spent = records.groupby("knowledge")[["grad_evals", "queries"]].max()
    assert spent.loc["white", "grad_evals"] > 0 and spent.loc["score", "queries"] > 0


@pytest.mark.slow
def test_full_eval_from_the_command_line_states_its_cost_first(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ADVBENCH_CACHE", str(tmp_path / "cache"))
    (tmp_path / "net.py").write_text(NET_SOURCE)
    result = CliRunner().invoke(main, ["run", "-m", "experiment=full_eval", "model=python", "model.target=net.py:fitted",
                                       *TINY, f"out_dir={tmp_path / 'out'}"])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "Declared cost" in out and out.index("Declared cost") < out.index("adversarial accuracy")
    per_sample = _per_sample()
    assert f"20 cells: at most {per_sample[0]:,} gradient evaluations and {per_sample[1]:,} queries per sample" \
        in " ".join(out.split())
    _within_the_stated_cost(_records(tmp_path / "out" / "records"), advbench.preset_cost("full_eval", TINY))


@pytest.mark.slow
def test_evaluate_preset_runs_every_cell_on_a_model_object(tiny_model, digits_tensors, tmp_path: Path,
                                                            monkeypatch) -> None:
    """On tensors held in memory: the cost counts the samples handed in, not the preset's n_samples."""
    monkeypatch.setenv("ADVBENCH_CACHE", str(tmp_path / "cache"))
    _, _, x, y = digits_tensors
    given = [o for o in TINY if not o.startswith("dataset.")]
    data, budgets = (x[:SAMPLES], y[:SAMPLES]), {"linf": 0.2, "l2": 0.8}
    with pytest.raises(AdvbenchError, match=r"data held in memory has no budgets of its own: give budgets="):
        advbench.evaluate_preset(tiny_model, data, overrides=given)
    with pytest.raises(AdvbenchError, match=r"substitute 'digits_seed1' needs its weights: .*substitute.checkpoint=PATH"):
        advbench.evaluate_preset(tiny_model, data, overrides=given, budgets=budgets)
    torch.manual_seed(1)  # a substitute of the digits shape, as a state dict file
    substitute = tmp_path / "substitute.pt"
    torch.save(build_model("small_cnn", 10, 1).net.state_dict(), substitute)
    records = advbench.evaluate_preset(advbench.Model(tiny_model, label="tiny"), data, budgets=budgets,
                                       overrides=[*given, f"substitute.checkpoint={substitute}"])
    assert set(records["model_label"]) == {"tiny"} and set(records["dataset"]) == {"tensors"}
    assert set(zip(records["norm"], records["eps_budget"])) == {("linf", 0.2), ("l2", 0.8)}
    cost = records.attrs["cost"]
    pd.testing.assert_frame_equal(cost, advbench.preset_cost("full_eval", [*TINY, f"substitute.checkpoint={substitute}"]))
    _within_the_stated_cost(records, cost)


def test_bad_preset_requests_are_one_line_errors(tiny_model, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # the command line checks its default out_dir is writable
    with pytest.raises(AdvbenchError, match=r"unknown preset 'nope'; valid: .*full_eval"):
        advbench.preset_cost("nope")
    with pytest.raises(AdvbenchError, match="experiment 'smoke' sweeps nothing"):
        advbench.preset_cost("smoke")
    for override in ("attack=pgd", "threat.norm=l2", "+experiment/full_eval_row=white_fmn"):
        with pytest.raises(AdvbenchError, match="the preset chooses the attack and threat of each cell"):
            advbench.evaluate_preset(tiny_model, overrides=[override])
    with pytest.raises(AdvbenchError, match="full_eval.square_queries must be"):
        advbench.preset_cost("full_eval", ["full_eval.square_queries=0"])
    result = CliRunner().invoke(main, ["run", "-m", "experiment=full_eval", "attack=pgd"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.output.strip().splitlines() == ["Error: 'attack=pgd': the preset chooses the attack and threat of each "
                                                  "cell; change their settings with the preset's keys (full_eval.*, "
                                                  "threat.eps=..., search.*) instead"]


def test_a_substitute_without_weights_is_refused_before_any_cell(fake_cifar_root: Path, tmp_path: Path,
                                                                  monkeypatch) -> None:
    """On other data the digits substitute has no weights: the run says what to give and runs nothing."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ADVBENCH_CACHE", str(tmp_path / "cache"))
    (tmp_path / "cifar_net.py").write_text("from torch import nn\n\n\ndef linear():\n"
                                           "    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 10))\n")
    result = CliRunner().invoke(main, ["run", "-m", "experiment=full_eval", "dataset=cifar10",
                                       f"dataset.root={fake_cifar_root}", "model=python",
                                       "model.target=cifar_net.py:linear", f"out_dir={tmp_path / 'out'}"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "transfer cells craft on substitute 'digits_seed1'" in lines[0]
    assert "substitute=<option> substitute.checkpoint=PATH" in lines[0]
    assert not list((tmp_path / "out").rglob("*.parquet"))


def test_any_sweep_states_its_cost_with_state_cost_true(trained_digits_cache: Path, tmp_path: Path) -> None:
    """Beyond the preset: a sweep of the user's own, its attacks' budgets (FGSM 1 step, BIM 20) times 2 runs."""
    result = CliRunner().invoke(main, ["run", "-m", "attack=fgsm,bim", "state_cost=true", "dataset.n_samples=5",
                                       "search.max_probes=1", f"cache_dir={trained_digits_cache}",
                                       "defense.recipe.epochs=4", f"out_dir={tmp_path / 'out'}"])
    assert result.exit_code == 0, result.output
    out = " ".join(result.output.split())
    assert "2 cells: at most 42 gradient evaluations and 0 queries per sample; 210 gradient evaluations and 0 queries " \
        "in total" in out
    assert out.index("Declared cost") < out.index("adversarial accuracy")
