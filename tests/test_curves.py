"""Curves and Table 3 against hand-computed values and the seed's definitions."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from advbench.core.errors import AdvbenchError
from advbench.robustness.report.curves import budget_curve, eps_grid, strength_curve
from advbench.robustness.report.table3 import format_table3, summary_table

INF = math.inf


def cell(goal: str = "untargeted", *, clean_correct, min_eps, first=None, defense="none", attack="pgd",
         eps_budget=0.02, strength_budget=3, label=None, adv_pred=None, success=None) -> pd.DataFrame:
    """One cell's records; fields the test does not care about get consistent defaults."""
    n = len(clean_correct)
    min_eps = np.asarray(min_eps, dtype=float)
    success = np.asarray(min_eps <= eps_budget if success is None else success, dtype=bool)
    label = np.zeros(n, dtype=int) if label is None else np.asarray(label)
    if adv_pred is None:
        kept = np.asarray(clean_correct) & ~success
        adv_pred = np.where(kept, label, label + 1)
    return pd.DataFrame({
        "dataset": "digits", "defense": defense, "attack": attack, "norm": "linf", "goal": goal,
        "knowledge": "white", "sample_id": np.arange(n), "label": label, "adv_pred": adv_pred,
        "clean_correct": np.asarray(clean_correct, dtype=bool), "success_at_budget": success,
        "min_eps": min_eps, "eps_budget": eps_budget, "strength_budget": strength_budget,
        "first_success_strength": np.full(n, -1) if first is None else np.asarray(first),
    })


def test_untargeted_budget_curve_matches_hand_computed_values():
    # samples:          0     1     2    3 (clean wrong)  4
    df = cell(clean_correct=[True, True, True, False, True], min_eps=[0.01, 0.03, INF, 0.0, 0.05])
    curve = budget_curve(df, np.array([0.0, 0.02, 0.03, 0.04, 0.06]))
    # accuracy = #(clean_correct & min_eps > eps) / 5; min_eps == eps counts as broken
    assert curve["accuracy"].tolist() == pytest.approx([4 / 5, 3 / 5, 2 / 5, 2 / 5, 1 / 5])
    # ASR over the 4 clean-correct samples: broken at 0.01, 0.03, 0.05
    assert curve["asr"].tolist() == pytest.approx([0 / 4, 1 / 4, 2 / 4, 2 / 4, 3 / 4])
    assert curve["eps"].tolist() == [0.0, 0.02, 0.03, 0.04, 0.06]
    assert set(curve["n_samples"]) == {5}


def test_targeted_budget_curve_counts_over_all_samples_and_has_no_accuracy():
    # a clean-misclassified sample still needs to reach its target (sample 0 already did)
    df = cell("targeted", clean_correct=[False, True, True, True], min_eps=[0.0, 0.02, INF, np.nan])
    curve = budget_curve(df, np.array([0.0, 0.02, 0.1]))
    assert curve["asr"].tolist() == pytest.approx([1 / 4, 2 / 4, 2 / 4])
    assert curve["accuracy"].isna().all()


def test_untargeted_asr_is_nan_when_no_sample_is_clean_correct():
    curve = budget_curve(cell(clean_correct=[False, False], min_eps=[0.0, 0.0]), np.array([0.0, 1.0]))
    assert curve["accuracy"].tolist() == [0.0, 0.0]
    assert curve["asr"].isna().all()


def test_budget_curve_separates_cells_and_sorts_the_grid():
    df = pd.concat([
        cell(clean_correct=[True, True], min_eps=[0.01, INF], defense="none"),
        cell(clean_correct=[True, True], min_eps=[0.05, 0.05], defense="jpeg"),
    ])
    curve = budget_curve(df, np.array([0.03, 0.0]))
    by_defense = {d: g["accuracy"].tolist() for d, g in curve.groupby("defense")}
    assert by_defense == {"none": [1.0, 0.5], "jpeg": [1.0, 1.0]}


def test_eps_grid_spans_twice_the_budget_or_the_tail_and_contains_the_budget():
    small = cell(clean_correct=[True] * 3, min_eps=[0.001, 0.002, INF], eps_budget=0.03)
    grid = eps_grid(small, n=11)[("digits", "linf")]
    assert grid[0] == 0.0 and grid[-1] == pytest.approx(0.06)
    assert 0.03 in grid and np.all(np.diff(grid) > 0)
    wide = cell(clean_correct=[True] * 100, min_eps=np.linspace(0, 1.0, 100), eps_budget=0.03)
    assert eps_grid(wide, n=11)[("digits", "linf")][-1] == pytest.approx(np.percentile(np.linspace(0, 1, 100), 99))


def test_budget_curve_default_grid_is_per_dataset_and_norm():
    a = cell(clean_correct=[True, True], min_eps=[0.01, INF], eps_budget=0.02)
    b = cell(clean_correct=[True, True], min_eps=[0.5, INF], eps_budget=1.0).assign(norm="l2")
    curve = budget_curve(pd.concat([a, b]))
    assert curve.groupby("norm")["eps"].max().to_dict() == pytest.approx({"linf": 0.04, "l2": 2.0})


def test_grid_mapping_without_the_cell_is_an_error():
    df = cell(clean_correct=[True], min_eps=[0.01])
    with pytest.raises(AdvbenchError, match="digits/linf"):
        budget_curve(df, {("digits", "l2"): np.array([0.0, 1.0])})


def test_strength_curve_matches_hand_computed_values():
    # first success: 0 = already adversarial, -1 = never
    kwargs = dict(clean_correct=[False, True, True, True, True], min_eps=[0.0] * 5, first=[0, 2, -1, 1, 3], strength_budget=3)
    untargeted = strength_curve(cell(**kwargs))
    assert untargeted["strength"].tolist() == [0, 1, 2, 3]
    # accuracy = #(clean_correct & not broken by k) / 5: samples 3, 1, 4 fall at k = 1, 2, 3
    assert untargeted["accuracy"].tolist() == pytest.approx([4 / 5, 3 / 5, 2 / 5, 1 / 5])
    assert untargeted["asr"].tolist() == pytest.approx([0 / 4, 1 / 4, 2 / 4, 3 / 4])
    assert set(untargeted["strength_budget"]) == {3}
    targeted = strength_curve(cell("targeted", **kwargs))
    assert targeted["asr"].tolist() == pytest.approx([1 / 5, 2 / 5, 3 / 5, 4 / 5])
    assert targeted["accuracy"].isna().all()


def test_summary_table_median_accuracy_and_asr_at_budget():
    # untargeted: the clean-misclassified sample counts as min_eps 0 -> [0, .01, .03, .05, inf]
    untargeted = cell(clean_correct=[True, True, True, False, True], min_eps=[0.01, 0.03, INF, 0.7, 0.05])
    # targeted: NaN counts as not found -> [0.01, inf, inf, inf]
    targeted = cell("targeted", clean_correct=[True, False, True, True], min_eps=[INF, INF, 0.01, np.nan],
                    label=[1, 2, 3, 4], adv_pred=[1, 0, 7, 4])
    tidy = summary_table(pd.concat([untargeted, targeted])).set_index("goal")
    assert tidy.loc["untargeted", "median_min_eps"] == pytest.approx(0.03)
    # at budget 0.02 only sample 0 of the clean-correct ones is broken: 3 of 5 stay correct
    assert tidy.loc["untargeted", "accuracy"] == pytest.approx(3 / 5)
    assert tidy.loc["untargeted", "asr"] == pytest.approx(1 / 4)
    assert math.isinf(tidy.loc["targeted", "median_min_eps"])
    assert tidy.loc["targeted", "accuracy"] == pytest.approx(2 / 4)  # adv_pred == label for samples 0, 3
    assert tidy.loc["targeted", "asr"] == pytest.approx(1 / 4)  # only sample 2 reached its target
    assert tidy["n_samples"].tolist() == [4, 5]


def test_table_accuracy_equals_budget_curve_at_the_budget():
    rng = np.random.default_rng(3)
    df = cell(clean_correct=rng.random(200) < 0.8, min_eps=rng.exponential(0.02, 200), eps_budget=0.02)
    at_budget = budget_curve(df, np.array([0.02]))
    tidy = summary_table(df)
    assert tidy["accuracy"].iloc[0] == pytest.approx(at_budget["accuracy"].iloc[0])
    assert tidy["asr"].iloc[0] == pytest.approx(at_budget["asr"].iloc[0])


def test_format_table3_lays_out_attacks_by_defenses_per_threat_model():
    df = pd.concat([
        cell(clean_correct=[True, True, True, True], min_eps=[0.01, 0.05, 0.06, INF], defense="none", attack="pgd"),
        cell(clean_correct=[True, True], min_eps=[INF, INF], defense="jpeg", attack="pgd"),
        cell(clean_correct=[True, True], min_eps=[0.0, 0.0], defense="none", attack="fgsm").assign(knowledge="transfer"),
        cell("targeted", clean_correct=[True], min_eps=[0.01], defense="none"),
    ])
    tables = format_table3(summary_table(df))
    assert set(tables) == {("linf", "untargeted"), ("linf", "targeted")}
    table = tables[("linf", "untargeted")]
    assert table.index.names == ["dataset", "knowledge", "attack"]
    assert list(table.index.get_level_values("knowledge")) == ["white", "transfer"]  # seed order, not alphabetical
    assert table.loc[("digits", "white", "pgd"), "none"] == "0.055 / 75.0%"
    assert table.loc[("digits", "white", "pgd"), "jpeg"] == "∞ / 100.0%"
    assert table.loc[("digits", "transfer", "fgsm"), "jpeg"] == "—"


@pytest.mark.parametrize("function", [budget_curve, strength_curve, summary_table, eps_grid])
def test_missing_columns_are_named(function):
    df = cell(clean_correct=[True], min_eps=[0.01]).drop(columns=["clean_correct", "knowledge"])
    with pytest.raises(AdvbenchError, match="clean_correct, knowledge"):
        function(df)


def test_repeated_samples_mixed_budgets_and_unknown_goals_are_errors():
    one = cell(clean_correct=[True, True], min_eps=[0.01, 0.02])
    with pytest.raises(AdvbenchError, match="one record per cell and sample"):
        budget_curve(pd.concat([one, one]))
    mixed = pd.concat([one, one.assign(sample_id=[5, 6], eps_budget=0.5)])
    with pytest.raises(AdvbenchError, match=r"one eps_budget per cell, got \[0.02, 0.5\]"):
        summary_table(mixed)
    with pytest.raises(AdvbenchError, match="records have sideways"):
        strength_curve(one.assign(goal="sideways"))
    with pytest.raises(AdvbenchError, match="empty"):
        budget_curve(one.iloc[:0])


def brute_force(df: pd.DataFrame, eps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The seed's definitions written out directly, one ε at a time."""
    correct = df["clean_correct"].to_numpy()
    m = df["min_eps"].fillna(np.inf).to_numpy()
    broken = m[None, :] <= eps[:, None]
    if df["goal"].iloc[0] == "targeted":
        return np.full(eps.size, np.nan), broken.mean(axis=1)
    accuracy = (correct & ~broken).mean(axis=1)
    asr = (correct & broken).sum(axis=1) / correct.sum() if correct.any() else np.full(eps.size, np.nan)
    return accuracy, asr


eps_values = st.one_of(st.floats(0, 1), st.just(INF), st.just(np.nan))


@st.composite
def record_frames(draw) -> pd.DataFrame:
    n = draw(st.integers(1, 30))
    budget = draw(st.integers(0, 12))
    return cell(
        draw(st.sampled_from(["untargeted", "targeted"])),
        clean_correct=draw(st.lists(st.booleans(), min_size=n, max_size=n)),
        min_eps=draw(st.lists(eps_values, min_size=n, max_size=n)),
        first=draw(st.lists(st.integers(-1, budget), min_size=n, max_size=n)),
        strength_budget=budget,
    )


@settings(max_examples=60, deadline=None)
@given(df=record_frames(), grid=st.lists(st.floats(0, 1.2), min_size=1, max_size=20))
def test_budget_curve_is_monotone_and_equals_the_definition(df, grid):
    curve = budget_curve(df, np.array(grid))
    eps = curve["eps"].to_numpy()
    accuracy, asr = curve["accuracy"].to_numpy(), curve["asr"].to_numpy()
    assert np.all(np.diff(eps) > 0)
    assert np.all(np.diff(accuracy[~np.isnan(accuracy)]) <= 0)
    assert np.all(np.diff(asr[~np.isnan(asr)]) >= 0)
    expected_accuracy, expected_asr = brute_force(df, eps)
    np.testing.assert_allclose(accuracy, expected_accuracy)
    np.testing.assert_allclose(asr, expected_asr)


@settings(max_examples=60, deadline=None)
@given(df=record_frames())
def test_strength_curve_is_monotone_and_ends_at_the_budget_result(df):
    curve = strength_curve(df)
    assert curve["strength"].tolist() == list(range(int(df["strength_budget"].iloc[0]) + 1))
    accuracy, asr = curve["accuracy"].to_numpy(), curve["asr"].to_numpy()
    assert np.all(np.diff(accuracy[~np.isnan(accuracy)]) <= 0)
    assert np.all(np.diff(asr[~np.isnan(asr)]) >= 0)
    found = df["first_success_strength"].to_numpy() >= 0
    correct = df["clean_correct"].to_numpy()
    if df["goal"].iloc[0] == "untargeted":
        assert accuracy[-1] == pytest.approx((correct & ~found).mean())
    else:
        assert asr[-1] == pytest.approx(found.mean())


def test_summary_table_gives_each_cells_cost_per_sample():
    counted = cell(clean_correct=[True, True, True], min_eps=[0.01, 0.02, 0.03]).assign(grad_evals=[10, 20, 60], queries=[0, 3, 0])
    tidy = summary_table(counted)
    assert tidy["grad_evals_per_sample"].tolist() == [30.0] and tidy["queries_per_sample"].tolist() == [1.0]
    assert "grad_evals_per_sample" not in summary_table(counted.drop(columns=["grad_evals", "queries"])).columns
