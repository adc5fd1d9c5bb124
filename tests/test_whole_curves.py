"""Curves, tables and the report's grids under the whole norms (ℓ0 pixels, patch sides), on records built
by hand: a sample's minimum is a whole number, so accuracy at k is the share of samples with min_eps > k,
the curves step at whole k only and nothing is drawn or gridded between two whole numbers."""

from __future__ import annotations

import pandas as pd
import pytest
from audit_records import INF, cell, records

from advbench.core.norms import norm
from advbench.robustness.audit.audit import audit
from advbench.robustness.audit.best_known import curve_grid
from advbench.robustness.audit.groups import groups
from advbench.robustness.audit.signs import FAILURE, WEAK
from advbench.robustness.report.curves import budget_axis, budget_curve, eps_grid
from advbench.robustness.report.plot import budget_figure
from advbench.robustness.report.table3 import format_table3, summary_table

# samples 100..104; 104 is misclassified without attack (its min_eps is 0)
CLEAN = [True, True, True, True, False]


def sparse(norm_name: str, attack: str, min_eps: list[float], budget: float = 2.0, **kw) -> pd.DataFrame:
    """One cell under `norm_name` whose answer after attack is the label (0) exactly where it survived."""
    frame = cell(attack, min_eps, budget=budget, clean=CLEAN, **kw)
    return frame.assign(norm=norm_name, adv_pred=frame["success_at_budget"].astype(int))


def test_an_l0_budget_curve_is_the_share_above_each_whole_k() -> None:
    frame = sparse("l0", "fmn", [1, 2, 2, INF, 0], source="norm")
    curve = budget_curve(frame)
    # top = max(2 x budget 2, 99th percentile of the finite min_eps 0, 1, 2, 2) = 4: the grid is 0..4, whole
    assert curve["eps"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    # accuracy at k = #(clean & min_eps > k) / 5: k=0 four, k=1 three (the 1 is broken), k>=2 one (the ∞)
    assert curve["accuracy"].tolist() == pytest.approx([4 / 5, 3 / 5, 1 / 5, 1 / 5, 1 / 5], rel=1e-12)


def test_a_patch_grid_runs_over_whole_sides_to_the_largest_minimum() -> None:
    frame = sparse("patch", "sparse_rs", [1, 3, 7, 7, 0], knowledge="score", strength=500)
    grid = eps_grid(frame)[("digits", "patch")]
    assert grid.tolist() == [float(k) for k in range(8)]  # the 99th percentile of 0, 1, 3, 7, 7 is 7 (its 98th too)
    curve = budget_curve(frame, grid)
    assert curve["accuracy"].tolist() == pytest.approx([4 / 5, 3 / 5, 3 / 5, 2 / 5, 2 / 5, 2 / 5, 2 / 5, 0.0], rel=1e-12)


def test_a_continuous_norm_keeps_its_even_grid() -> None:
    frame = cell("pgd", [0.05, 0.1, 0.15, INF, 0.0], clean=CLEAN)
    grid = eps_grid(frame, 11)[("digits", "linf")]
    assert grid.size == 11 and grid[1] == pytest.approx(0.04, rel=1e-12)  # 0 .. 2 x 0.2 in ten steps


@pytest.mark.parametrize("norm_name", ["l0", "patch"])
def test_a_whole_norm_figure_steps_at_whole_k_under_its_own_axis(norm_name: str) -> None:
    curves = budget_curve(records(sparse(norm_name, "a", [1, 2, 3, INF, 0]), sparse(norm_name, "b", [2, 2, 3, 4, 0])))
    figure = budget_figure(curves)
    ax = figure.axes[0]
    assert ax.get_xlabel() == norm(norm_name).axis == budget_axis(norm_name)
    assert ax.lines[0].get_drawstyle() == "steps-post"  # the curve, drawn before the budget's line
    assert all(float(t).is_integer() for t in ax.get_xticks())


def test_a_continuous_norm_figure_draws_lines_under_its_budget_axis() -> None:
    curves = budget_curve(cell("pgd", [0.05, 0.1, 0.15, INF, 0.0], clean=CLEAN))
    ax = budget_figure(curves).axes[0]
    assert ax.get_xlabel() == "ℓ∞ budget ε"
    assert ax.lines[0].get_drawstyle() == "default"


def test_the_table_writes_a_whole_median_as_the_count_it_is() -> None:
    frame = records(sparse("l0", "fmn", [1, 2, 2, INF, 0]), sparse("l0", "pgd_l0", [1, 1, 2, 3, 0]))
    table = format_table3(summary_table(frame))[("l0", "untargeted")]
    # medians over all five samples: 0, 1, 2, 2, ∞ -> 2 and 0, 1, 1, 2, 3 -> 1; accuracy at 2: one and one of five
    assert table.loc[("digits", "white", "fmn"), "natural"] == "2 / 20.0%"
    assert table.loc[("digits", "white", "pgd_l0"), "natural"] == "1 / 20.0%"


def test_the_report_grids_a_whole_norm_at_whole_numbers() -> None:
    group, = groups(records(sparse("l0", "fmn", [1, 2, 5, INF, 0], source="norm"), sparse("l0", "pgd_l0", [1, 3, 2, 3, 0])))
    grid = curve_grid(group)
    assert grid.tolist() == [float(k) for k in range(6)]  # 0 .. max(2 x 2, the largest break 5)
    assert curve_grid(groups(cell("pgd", [0.05, 0.1]))[0], n=5).tolist() == pytest.approx([0, 0.05, 0.1, 0.2, 0.3, 0.4])


@pytest.mark.parametrize(("norm_name", "level"), [("l0", WEAK), ("l1", FAILURE)])
def test_search_beating_gradients_is_masking_but_under_l0(norm_name: str, level: str) -> None:
    """Sparse-RS breaks 101 and 102 at k = 2 where FMN needs 3: under ℓ0 random search leads on any model
    (the white-box attack is weak, the worst case holds the breaks); under ℓ1 the same is a sign of masking."""
    frame = records(sparse(norm_name, "fmn", [1, 3, 3, 3, 0], source="norm"),
                    sparse(norm_name, "sparse_rs", [1, 2, 2, 3, 0], knowledge="score", strength=500))
    model, = audit(frame)
    beaten = [s for s in model.signs if s.code == "black_box_beats_white_box"]
    assert [(s.level, s.count) for s in beaten] == [(level, 2)]


def test_a_one_panel_figure_is_as_wide_as_its_title() -> None:
    figure = budget_figure(budget_curve(sparse("patch", "sparse_rs", [1, 2, 3, INF, 0], knowledge="score")))
    figure.canvas.draw()
    title, = figure.texts  # 'digits · patch side · untargeted · score-based', wider than one panel
    box = title.get_window_extent()
    assert box.x0 >= 0 and box.x1 <= figure.bbox.width
