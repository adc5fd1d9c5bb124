"""Accuracy vs queries (score- and decision-based attacks), query checkpoints, grouping by defense category."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from matplotlib.colors import to_hex
from omegaconf import OmegaConf

from advbench.cli.config import compose_config
from advbench.core.catalog import conf_dir
from advbench.core.errors import AdvbenchError
from advbench.robustness.attacks.decision import HopSkipJump
from advbench.robustness.attacks.estimates import NES
from advbench.robustness.evaluation.measure import evaluate_batch
from advbench.robustness.report.curves import checkpoint_curve, query_curve
from advbench.robustness.report.plot import (
    defense_categories,
    render_all,
    strength_figure,
)
from advbench.robustness.report.table3 import format_table3, summary_table
from advbench.robustness.specs import SearchSettings
from advbench.robustness.threat import ThreatModel

INF = math.inf
pytestmark = pytest.mark.usefixtures("one_thread")


def records(knowledge: str = "score", *, clean_correct, first, budget: int = 1000, goal: str = "untargeted",
            defense: str = "natural", attack: str = "square", eps: float = 0.8, **columns) -> pd.DataFrame:
    """One cell's records with the columns the curves read; `columns` adds e.g. norm_at_<q>."""
    n = len(first)
    first = np.asarray(first)
    return pd.DataFrame({
        "dataset": "digits", "defense": defense, "attack": attack, "norm": "l2", "goal": goal,
        "knowledge": knowledge, "sample_id": np.arange(n), "label": 1, "clean_correct": np.asarray(clean_correct),
        "first_success_strength": first, "strength_budget": budget, "eps_budget": eps,
        "min_eps": np.where(first >= 0, eps / 2, INF), "success_at_budget": first >= 0,
        "adv_pred": np.where(np.asarray(clean_correct) & (first < 0), 1, 2), **columns,
    })


def test_query_curve_matches_hand_computed_values():
    # sample 0 is clean-misclassified (first 0); 1 breaks at its first query; 5 never breaks
    df = records(clean_correct=[False, True, True, True, True, True, True], first=[0, 1, 37, 37, 500, -1, 1000])
    curve = query_curve(df)
    assert curve["queries"].tolist() == [1, 37, 500, 1000]
    # accuracy over all 7: the 6 clean-correct ones minus those broken by q
    assert curve["accuracy"].tolist() == pytest.approx([5 / 7, 3 / 7, 2 / 7, 1 / 7])
    assert curve["asr"].tolist() == pytest.approx([1 / 6, 3 / 6, 4 / 6, 5 / 6])
    assert set(curve["strength_budget"]) == {1000}
    tidy = summary_table(df)
    assert curve["accuracy"].iloc[-1] == pytest.approx(tidy["accuracy"].iloc[0]), "ends at Table 3"
    targeted = query_curve(records(clean_correct=[False, True, True], first=[0, 3, -1], goal="targeted"))
    assert targeted["asr"].tolist() == pytest.approx([1 / 3, 2 / 3, 2 / 3]) and targeted["accuracy"].isna().all()


def test_query_curve_refuses_iteration_strengths():
    with pytest.raises(AdvbenchError, match="knowledge white"):
        query_curve(records("white", clean_correct=[True], first=[3]))


def test_checkpoint_curve_counts_norms_within_the_budget():
    decision = records("decision", clean_correct=[True, True, True, False], first=[5, 60, -1, 0], attack="hsj",
                       norm_at_10=[0.5, 2.0, INF, 0.0], norm_at_100=[0.5, 0.8, 1.5, 0.0])
    score = records(clean_correct=[True, True], first=[4, -1]).assign(norm_at_10=np.nan, norm_at_100=np.nan)
    points = checkpoint_curve(pd.concat([decision, score], ignore_index=True))
    assert set(points["attack"]) == {"hsj"}, "cells without checkpoints are left out"
    assert points["queries"].tolist() == [10, 100]
    assert points["accuracy"].tolist() == pytest.approx([2 / 4, 1 / 4])  # 0.8 <= budget 0.8 counts as broken
    assert points["asr"].tolist() == pytest.approx([1 / 3, 2 / 3])
    assert checkpoint_curve(score).empty


@st.composite
def query_records(draw) -> pd.DataFrame:
    n = draw(st.integers(1, 25))
    budget = draw(st.integers(1, 5000))
    return records(
        draw(st.sampled_from(["score", "decision"])),
        clean_correct=draw(st.lists(st.booleans(), min_size=n, max_size=n)),
        first=draw(st.lists(st.integers(-1, budget), min_size=n, max_size=n)),
        budget=budget,
    )


@settings(max_examples=25, deadline=None)
@given(df=query_records())
def test_query_curve_is_monotone_and_equals_the_definition(df):
    curve = query_curve(df)
    q = curve["queries"].to_numpy()
    assert q[0] == 1 and q[-1] == max(int(df["strength_budget"].iloc[0]), 1) and np.all(np.diff(q) > 0)
    accuracy = curve["accuracy"].to_numpy()
    assert np.all(np.diff(accuracy) <= 0)
    first, correct = df["first_success_strength"].to_numpy(), df["clean_correct"].to_numpy()
    broken = (first[None, :] >= 0) & (first[None, :] <= q[:, None])
    np.testing.assert_allclose(accuracy, (correct & ~broken).mean(axis=1))


def batch_records(measured: dict, attack: str, knowledge: str, y: torch.Tensor, threat: ThreatModel,
                  budget: int) -> pd.DataFrame:
    """Engine measurements of one batch as record rows (the columns the curves read)."""
    frame = pd.DataFrame({k: v.numpy() for k, v in measured.items() if isinstance(v, torch.Tensor)})
    return frame.assign(dataset="digits", defense="natural", attack=attack, norm=threat.norm, goal=threat.goal,
                        knowledge=knowledge, sample_id=np.arange(len(y)), label=y.numpy(),
                        clean_correct=frame["clean_pred"].to_numpy() == y.numpy(), eps_budget=threat.eps,
                        strength_budget=budget)


def test_score_attack_run_once_gives_the_accuracy_of_every_shorter_run(tiny_model, digits_tensors):
    """NES's steps do not depend on its budget, so a run with fewer queries breaks exactly the
    samples the long run dated at or before that many queries."""
    _, _, x, y = digits_tensors
    x, y = x[:32], y[:32]
    threat = ThreatModel(norm="linf", goal="untargeted", eps=0.3, knowledge="score")
    cost = 2 * 8 + 1
    off = SearchSettings(enabled=False)

    def run(steps: int) -> pd.DataFrame:
        attack = NES(n_queries=1 + steps * cost, samples=8, sigma=0.001, seed=0)
        measured = evaluate_batch(attack, tiny_model, x, y, None, threat, off)
        return batch_records(measured, "nes", "score", y, threat, attack.steps)

    curve = query_curve(run(6)).set_index("queries")["accuracy"]
    assert curve.is_monotonic_decreasing and curve.iloc[-1] < curve.iloc[0]
    assert curve.index.size > 3, "samples break at several query counts"
    for steps in (3, 5):
        short = run(steps)
        queries = 1 + steps * cost
        at = curve[curve.index <= queries].iloc[-1]
        assert at == pytest.approx((short["adv_pred"] == short["label"]).mean()), f"{queries} queries"


def test_decision_attack_checkpoints_lie_on_its_query_curve_in_threat_units(tiny_model, digits_tensors):
    """HopSkipJump under normalised ℓ2: the checkpoints are recorded in threat units (as min_eps),
    and the accuracy they give at each checkpoint is the exact query curve's."""
    _, _, x, y = digits_tensors
    x, y = x[:16], y[:16]
    threat = ThreatModel(norm="l2", goal="untargeted", eps=0.1, knowledge="decision", normalized_l2=True)
    attack = HopSkipJump(max_queries=300, checkpoints=[50, 100, 200], seed=0)
    measured = evaluate_batch(attack, tiny_model, x, y, None, threat, SearchSettings())
    df = batch_records(measured, "hsj", "decision", y, threat, attack.steps)
    found = np.isfinite(df["min_eps"]) & (df["min_eps"] > 0)
    assert found.any()
    np.testing.assert_allclose(df.loc[found, "norm_at_300"], df.loc[found, "min_eps"], rtol=1e-5)
    curve = query_curve(df).set_index("queries")["accuracy"]
    points = checkpoint_curve(df).set_index("queries")["accuracy"]
    assert points.index.tolist() == [50, 100, 200, 300]
    for q, accuracy in points.items():
        assert curve[curve.index <= q].iloc[-1] == pytest.approx(accuracy), f"{q} queries"


CELLS = [("square", "score"), ("hsj", "decision")]


def mixed_records(defenses=("natural", "pgd_at", "trades", "jpeg"), cells=CELLS) -> pd.DataFrame:
    """Score and decision cells against defenses of three categories."""
    rng = np.random.default_rng(0)
    frames = []
    for defense, (attack, knowledge) in itertools.product(defenses, cells):
        first = np.where(rng.random(30) < 0.7, rng.integers(1, 1001, 30), -1)
        extra = {"norm_at_100": np.where((first >= 0) & (first <= 100), 0.5, 1.0),
                 "norm_at_1000": np.where(first >= 0, 0.5, 1.0)} if knowledge == "decision" else {}
        frames.append(records(knowledge, clean_correct=rng.random(30) < 0.95, first=first, defense=defense,
                              attack=attack, **extra))
    return pd.concat(frames, ignore_index=True)


def test_query_figures_use_a_log_axis_and_mark_the_checkpoints():
    df = mixed_records()
    hsj = df[df["attack"] == "hsj"]
    fig = strength_figure(query_curve(hsj), points=checkpoint_curve(hsj))
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and ax.get_xlim() == pytest.approx((1, 1000))
    assert ax.get_xlabel() == "attack strength (queries, log scale)"
    dots = [line for line in ax.get_lines() if line.get_linestyle() == "None"]
    assert len(dots) == 4 and all(line.get_xdata().tolist() == [100, 1000] for line in dots)
    assert "query checkpoint" in [t.get_text() for t in fig.legends[0].get_texts()]


def test_group_by_category_colours_lines_and_heads_the_tables(tmp_path):
    df = mixed_records()
    categories = defense_categories(df)  # no column: looked up from conf/defense/*.yaml
    assert categories == {"jpeg": "input transformation", "natural": "natural training",
                          "pgd_at": "robust training", "trades": "robust training"}
    written = render_all(df, tmp_path, formats=("png",), group_by="category")
    assert sorted(p.name for p in written if p.name.startswith("strength")) == [
        "strength_digits_l2_untargeted_decision.png", "strength_digits_l2_untargeted_score.png"]
    hsj = df[df["attack"] == "hsj"]
    fig = strength_figure(query_curve(hsj), categories=categories)
    lines = {to_hex(line.get_color()) + line.get_linestyle() for line in fig.axes[0].get_lines()}
    colors = {}
    for line, defense in zip(fig.axes[0].get_lines(), sorted(categories)):
        colors[defense] = (to_hex(line.get_color()), line.get_linestyle())
    assert len(lines) == 4, "every defense still has its own line style"
    assert len({c for c, _ in colors.values()}) == 4, "every defense its own colour"
    legend = [(t.get_text(), t.get_fontweight()) for t in fig.legends[0].get_texts() if t.get_text()]
    assert [text for text, _ in legend] == ["input transformation", "jpeg", "natural training", "natural",
                                            "robust training", "pgd_at", "trades"]
    assert legend[0][1] == "bold" and legend[1][1] != "bold"
    md = (tmp_path / "table3_l2_untargeted.md").read_text(encoding="utf-8").splitlines()
    assert md[2] == ("| dataset | knowledge | attack | jpeg (input transformation) | natural (natural training) "
                     "| pgd_at (robust training) | trades (robust training) |")
    csv = pd.read_csv(tmp_path / "table3_l2_untargeted.csv")
    assert csv.set_index(["defense", "attack"]).loc[("trades", "hsj"), "defense_category"] == "robust training"
    default = strength_figure(query_curve(hsj))
    assert len({to_hex(line.get_color()) for line in default.axes[0].get_lines()}) == 4, "default: one colour each"
    with pytest.raises(AdvbenchError, match="unknown grouping 'attack'"):
        render_all(df, tmp_path, group_by="attack")


def test_records_category_column_wins_over_the_yaml(tmp_path):
    df = mixed_records().assign(defense_category="certified")
    assert set(defense_categories(df).values()) == {"certified"}
    tables = format_table3(summary_table(df), by_category=True)
    assert all(c.endswith("(certified)") for c in tables[("l2", "untargeted")].columns)


def test_plot_command_groups_by_category(tmp_path):
    from click.testing import CliRunner

    from advbench.cli.main import main

    part = tmp_path / "records" / "part.parquet"
    part.parent.mkdir()
    mixed_records(("natural", "pgd_at"), CELLS[1:]).assign(adv_norm=0.4, min_eps_source="norm").to_parquet(part)
    result = CliRunner().invoke(main, ["plot", str(part.parent), "--out", str(tmp_path / "out"), "--group-by", "category"])
    assert result.exit_code == 0, result.output
    assert "pgd_at (robust training)" in result.output
    bad = CliRunner().invoke(main, ["plot", str(part.parent), "--group-by", "colour"])
    assert bad.exit_code != 0 and "colour" in bad.output


def test_blackbox_preset_sweeps_score_and_decision_attacks_at_small_budgets():
    sweep = OmegaConf.load(conf_dir() / "experiment" / "blackbox.yaml").hydra.sweeper.params
    from hydra.utils import instantiate

    cells = set()
    for row in str(sweep["+experiment/blackbox_row"]).split(","):
        cfg = compose_config("config", ["experiment=blackbox", f"+experiment/blackbox_row={row}"])
        attack = instantiate(cfg.attack.params)
        assert cfg.attack.name == row and attack.steps <= 2000, "a budget small enough for minutes on a CPU"
        assert cfg.dataset.name == "digits" and cfg.dataset.n_samples <= 200
        for norm in str(sweep["threat.norm"]).split(","):
            if attack.unsupported(norm, cfg.threat.knowledge, cfg.threat.goal) is None:
                cells.add((cfg.threat.knowledge, row, norm))
    assert {("score", a, n) for a in ("square", "nes", "spsa", "nattack") for n in ("linf", "l2")} <= cells
    assert {("score", "zoo", "l2"), ("decision", "hsj", "linf"), ("decision", "hsj", "l2"), ("decision", "boundary", "l2"),
            ("decision", "evolutionary", "l2")} <= cells
    assert {k for k, _, _ in cells} == {"score", "decision"}
    assert set(str(sweep["defense"]).split(",")) >= {"natural", "pgd_at"}
