"""Figures and tables: file names and formats, panel layout, consistent styles, table text."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from matplotlib.colors import to_hex
from rich.console import Console

from advbench.core.errors import AdvbenchError
from advbench.robustness.report.curves import budget_curve, strength_curve
from advbench.robustness.report.plot import (
    budget_figure,
    defense_styles,
    plot_budget_curves,
    plot_strength_curves,
    print_tables,
    render_all,
    strength_figure,
    write_tables,
)
from advbench.robustness.report.table3 import summary_table

DEFENSES = ["none", "pgd-at", "jpeg"]
ATTACKS = ["fgsm", "bim", "mim", "pgd", "deepfool"]


def records(defenses=DEFENSES, attacks=ATTACKS, goals=("untargeted", "targeted"), knowledge="white", n=40, seed=0) -> pd.DataFrame:
    """Random but well-formed records for every (defense, attack, goal) cell."""
    rng = np.random.default_rng(seed)
    frames = []
    for defense in defenses:
        for attack in attacks:
            for goal in goals:
                correct = rng.random(n) < 0.9
                min_eps = np.where(rng.random(n) < 0.1, np.inf, rng.exponential(0.03, n))
                success = min_eps <= 8 / 255
                frames.append(pd.DataFrame({
                    "dataset": "digits", "defense": defense, "attack": attack, "norm": "linf", "goal": goal,
                    "knowledge": knowledge, "sample_id": np.arange(n), "label": 1,
                    "adv_pred": np.where(correct & ~success, 1, 2), "clean_correct": correct,
                    "success_at_budget": success, "min_eps": min_eps, "eps_budget": 8 / 255,
                    "strength_budget": 10, "first_success_strength": np.where(success, rng.integers(0, 11, n), -1),
                }))
    return pd.concat(frames, ignore_index=True)


def line_colors(fig) -> dict[str, set[str]]:
    """Colour of every data line, by the legend label of the same colour."""
    legend = fig.legends[0]
    by_color = {to_hex(h.get_color()): t.get_text() for h, t in zip(legend.legend_handles, legend.get_texts())}
    seen: dict[str, set[str]] = {}
    for ax in fig.axes:
        for line in ax.get_lines():
            if line.get_linestyle() != ":":
                seen.setdefault(by_color[to_hex(line.get_color())], set()).add(to_hex(line.get_color()))
    return seen


def test_budget_figure_has_one_panel_per_attack_and_one_line_per_defense():
    curves = budget_curve(records(goals=("untargeted",)))
    fig = budget_figure(curves)
    assert len(fig.axes) == len(ATTACKS)
    assert sorted(ax.get_title() for ax in fig.axes) == sorted(ATTACKS)
    assert fig.get_suptitle() == "digits · ℓ∞ · untargeted · white-box"
    for ax in fig.axes:
        solid = [line for line in ax.get_lines() if line.get_linestyle() != ":"]
        budget_lines = [line for line in ax.get_lines() if line.get_linestyle() == ":"]
        assert len(solid) == len(DEFENSES)
        assert [line.get_xdata()[0] for line in budget_lines] == pytest.approx([8 / 255])
        assert ax.get_ylim() == pytest.approx((-0.02, 1.02))
        assert ax.get_xlabel() == "ℓ∞ budget ε"
    assert fig.axes[0].get_ylabel() == "accuracy"
    assert len(fig.legends) == 1
    assert [t.get_text() for t in fig.legends[0].get_texts()] == sorted(DEFENSES) + ["budget"]


def test_targeted_figures_show_attack_success_rate():
    df = records(goals=("targeted",), attacks=["pgd"])
    fig = budget_figure(budget_curve(df))
    assert fig.axes[0].get_ylabel() == "attack success rate"
    plotted = fig.axes[0].get_lines()[0].get_ydata()
    assert np.all(np.isfinite(plotted)) and np.all(np.diff(plotted) >= 0)


def test_strength_figure_uses_steps_and_names_the_unit():
    fig = strength_figure(strength_curve(records(goals=("untargeted",), attacks=["nes", "spsa"], knowledge="score")))
    assert len(fig.axes) == 2
    assert fig.axes[0].get_xlabel() == "attack strength (queries)"
    assert fig.axes[0].get_lines()[0].get_drawstyle() == "steps-post"
    assert fig.axes[0].get_xlim() == pytest.approx((0, 10))


def test_figure_rejects_curves_of_several_threat_models():
    with pytest.raises(AdvbenchError, match="got 2 combinations"):
        budget_figure(budget_curve(records(attacks=["pgd"])))


def test_defense_colours_agree_across_figures():
    styles = defense_styles(DEFENSES)
    full = budget_figure(budget_curve(records(goals=("untargeted",))), styles)
    partial = budget_figure(budget_curve(records(defenses=["pgd-at"], goals=("untargeted",))), styles)
    assert line_colors(partial)["pgd-at"] == line_colors(full)["pgd-at"]
    assert len({to_hex(s["color"]) for s in styles.values()}) == len(DEFENSES)
    many = defense_styles(f"d{i:02d}" for i in range(25))
    assert len({(to_hex(s["color"]), s["linestyle"]) for s in many.values()}) == 25


def test_plot_functions_write_nonempty_png_and_svg_with_expected_names(tmp_path):
    df = records(attacks=["fgsm", "pgd"])
    written = plot_budget_curves(budget_curve(df), tmp_path) + plot_strength_curves(strength_curve(df), tmp_path)
    names = sorted(p.name for p in written)
    assert names == sorted(
        f"{kind}_digits_linf_{goal}_white.{fmt}"
        for kind in ("budget", "strength") for goal in ("untargeted", "targeted") for fmt in ("png", "svg")
    )
    for path in written:
        head = path.read_bytes()[:200]
        assert head.startswith(b"\x89PNG") if path.suffix == ".png" else b"<svg" in path.read_bytes()[:2000]


def test_write_tables_markdown_and_csv(tmp_path):
    tidy = summary_table(records(attacks=["pgd"]))
    written = write_tables(tidy, tmp_path)
    assert sorted(p.name for p in written) == sorted(
        f"table3_linf_{goal}.{ext}" for goal in ("untargeted", "targeted") for ext in ("md", "csv")
    )
    row = tidy[(tidy["goal"] == "untargeted") & (tidy["defense"] == "jpeg")].iloc[0]
    expected = f"{row['median_min_eps']:.3f} / {100 * row['accuracy']:.1f}%"
    md = (tmp_path / "table3_linf_untargeted.md").read_text(encoding="utf-8").splitlines()
    assert md[0].startswith("Table 3 · ℓ∞ · untargeted")
    assert md[2] == "| dataset | knowledge | attack | jpeg | none | pgd-at |"
    assert expected in md[4]
    csv = pd.read_csv(tmp_path / "table3_linf_untargeted.csv")
    assert len(csv) == len(DEFENSES)
    assert csv.set_index("defense").loc["jpeg", "accuracy"] == pytest.approx(row["accuracy"])


def test_print_tables_shows_every_cell():
    tidy = summary_table(records(attacks=["pgd"], goals=("untargeted",)))
    console = Console(record=True, width=200)
    print_tables(tidy, console)
    text = console.export_text()
    for _, row in tidy.iterrows():
        assert f"{row['median_min_eps']:.3f} / {100 * row['accuracy']:.1f}%" in text


def test_render_all_writes_figures_and_tables(tmp_path):
    written = render_all(records(attacks=["pgd"], goals=("untargeted",)), tmp_path, formats=("png",))
    assert sorted(p.name for p in written) == [
        "budget_digits_linf_untargeted_white.png",
        "strength_digits_linf_untargeted_white.png",
        "table3_linf_untargeted.csv",
        "table3_linf_untargeted.md",
    ]
    assert all(p.stat().st_size > 0 for p in written)


def one_and_many_step_records() -> pd.DataFrame:
    """FGSM takes one step (strength budget 1), BIM ten: both in one strength figure."""
    df = records(attacks=["fgsm", "bim"], goals=("untargeted",))
    fgsm = df["attack"] == "fgsm"
    df.loc[fgsm, "strength_budget"] = 1
    df.loc[fgsm, "first_success_strength"] = np.where(df.loc[fgsm, "success_at_budget"], 1, -1)
    return df


def visible_ticks(ax) -> np.ndarray:
    lo, hi = ax.get_xlim()
    ticks = np.asarray(ax.get_xticks())
    return ticks[(ticks >= lo) & (ticks <= hi)]


def test_strength_axes_tick_whole_steps_and_mark_a_one_step_attack():
    fig = strength_figure(strength_curve(one_and_many_step_records()))
    fig.canvas.draw()
    panels = {ax.get_title(): ax for ax in fig.axes}
    fgsm, bim = panels["fgsm"], panels["bim"]
    assert visible_ticks(fgsm).tolist() == [0, 1]
    assert [t.get_text() for t in fgsm.get_xticklabels()] == ["0", "1"]
    assert fgsm.get_xlim()[0] < 0 < 1 < fgsm.get_xlim()[1], "both steps drawn inside the frame"
    assert all(line.get_marker() == "o" for line in fgsm.get_lines()), "a one-step curve is drawn as points"
    ticks = visible_ticks(bim)
    assert len(ticks) >= 3 and np.array_equal(ticks, np.round(ticks))
    assert all(float(t.get_text()).is_integer() for t in bim.get_xticklabels() if t.get_text())


def test_four_attacks_are_a_two_by_two_grid_readable_at_readme_width():
    fig = budget_figure(budget_curve(records(attacks=["fgsm", "bim", "mim", "pgd"], goals=("untargeted",))))
    rows = {round(ax.get_position().y0, 3) for ax in fig.axes}
    columns = {round(ax.get_position().x0, 3) for ax in fig.axes}
    assert len(rows) == 2 and len(columns) == 2
    width, height = fig.get_size_inches() * 150
    assert width <= 1300 and width / height < 1.5
    assert [ax.get_ylabel() for ax in fig.axes] == ["accuracy", "", "accuracy", ""]


@pytest.mark.parametrize("terminal", [False, True], ids=["pipe", "terminal"])
def test_rich_table_is_not_cut_at_80_columns(terminal: bool):
    from io import StringIO

    many = [f"defense-{i}" for i in range(9)]
    tidy = summary_table(records(defenses=many, attacks=["pgd"], goals=("untargeted",)))
    out = StringIO()
    print_tables(tidy, Console(file=out, width=80, force_terminal=terminal, color_system=None))
    text = out.getvalue()
    assert "…" not in text
    if terminal:  # wrapped to the window: no line longer than the terminal
        assert max(map(len, text.splitlines())) <= 80
    else:  # printed whole, every cell on one line
        assert max(map(len, text.splitlines())) > 80
        for _, row in tidy.iterrows():
            assert f"{row['median_min_eps']:.3f} / {100 * row['accuracy']:.1f}%" in text
