"""Figures and tables from curve frames (matplotlib, no pyplot state).

Figures are built with ``matplotlib.figure.Figure`` directly, which renders through Agg
without touching the global pyplot backend or figure registry, so plotting from a library
call or a test never leaks figures or needs a display.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator, PercentFormatter
from rich.console import Console
from rich.table import Table

from advbench.curves import (
    budget_curve,
    eps_grid,
    format_table3,
    strength_curve,
    summary_table,
)
from advbench.errors import AdvbenchError
from advbench.terminal import print_table

FIGURE_KEY = ["dataset", "norm", "goal", "knowledge"]
"""One figure per threat model and data set; panels are attacks, lines are defenses."""

NORM_LABELS = {"linf": "ℓ∞", "l2": "ℓ₂"}
KNOWLEDGE_LABELS = {"white": "white-box", "transfer": "transfer-based", "score": "score-based", "decision": "decision-based"}
STRENGTH_UNITS = {"white": "iterations", "transfer": "iterations", "score": "queries", "decision": "queries"}
LINESTYLES = ("-", "--", "-.", ":")
MAX_COLUMNS = 2
"""Panels per row at most, so a figure stays legible at README width (four attacks: a 2 × 2
grid, 1260 × 945 px at 150 dpi); rows are then filled evenly."""
PANEL_SIZE = (3.4, 2.9)
FEW_STEPS = 5
"""Strength axes up to this many iterations/queries mark every step (FGSM is one step)."""


def defense_styles(defenses: Iterable[str]) -> dict[str, dict[str, str | tuple]]:
    """Colour and line style per defense, fixed by sorted name so every figure agrees.

    tab10 up to ten defenses, tab20 beyond; past twenty the colours repeat with a new
    line style so lines stay distinguishable.
    """
    names = sorted(set(defenses))
    palette = colormaps["tab10" if len(names) <= 10 else "tab20"].colors
    return {
        name: {"color": palette[i % len(palette)], "linestyle": LINESTYLES[(i // len(palette)) % len(LINESTYLES)]}
        for i, name in enumerate(names)
    }


def _title(key: Sequence[str]) -> str:
    """'digits · ℓ∞ · untargeted · white-box'."""
    dataset, norm, goal, knowledge = key
    return " · ".join([dataset, NORM_LABELS.get(norm, norm), goal, KNOWLEDGE_LABELS.get(knowledge, knowledge)])


def _single_key(curves: pd.DataFrame) -> tuple[str, ...]:
    """Figures take one (dataset, norm, goal, knowledge) group; say which came otherwise."""
    keys = curves[FIGURE_KEY].drop_duplicates()
    if len(keys) != 1:
        raise AdvbenchError(f"a figure takes curves of one {'/'.join(FIGURE_KEY)}, got {len(keys)} combinations")
    return tuple(keys.iloc[0])


def _figure(curves: pd.DataFrame, x: str, xlabel: str, styles: dict, show_budget: bool) -> Figure:
    """Grid of panels, one per attack, one line per defense, shared 0-100% y axis."""
    key = _single_key(curves)
    goal = key[FIGURE_KEY.index("goal")]
    metric, ylabel = ("accuracy", "accuracy") if goal == "untargeted" else ("asr", "attack success rate")
    attacks = sorted(curves["attack"].unique())
    nrows = -(-len(attacks) // MAX_COLUMNS)
    ncols = -(-len(attacks) // nrows)
    fig = Figure(figsize=(PANEL_SIZE[0] * ncols + 1.6, PANEL_SIZE[1] * nrows + 0.5), layout="constrained")
    fig.get_layout_engine().set(w_pad=0.06, wspace=0.06)
    axes = fig.subplots(nrows, ncols, sharey=True, squeeze=False).ravel()
    for ax in axes[len(attacks):]:
        fig.delaxes(ax)
    drawstyle = "default" if show_budget else "steps-post"
    for ax, attack in zip(axes, attacks):
        panel = curves[curves["attack"] == attack]
        top = panel[x].max()
        few = not show_budget and top <= FEW_STEPS
        for defense, line in panel.groupby("defense", sort=True):
            ax.plot(line[x], line[metric], drawstyle=drawstyle, linewidth=1.6, marker="o" if few else None,
                    markersize=4, **styles[defense])
        if show_budget:
            for budget in panel["eps_budget"].unique():
                ax.axvline(budget, color="0.35", linestyle=":", linewidth=1.2)
            ax.set_xlim(0, top or 1)
        elif few:  # a handful of whole steps: every step a tick, the end points inside the frame
            ax.set_xticks(range(int(top) + 1))
            ax.set_xlim(-0.3, top + 0.3)
        else:  # iterations and queries are whole numbers
            ax.xaxis.set_major_locator(MaxNLocator(nbins=6, integer=True))
            ax.set_xlim(0, top or 1)
        ax.set_title(attack, fontsize=11)
        ax.set_ylim(-0.02, 1.02)
        ax.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
        ax.grid(True, color="0.88", linewidth=0.8)
        ax.set_axisbelow(True)
        ax.spines[["top", "right"]].set_visible(False)
        ax.set_xlabel(xlabel)
    for ax in axes[: len(attacks) : ncols]:
        ax.set_ylabel(ylabel)
    present = sorted(curves["defense"].unique())
    handles = [Line2D([], [], linewidth=2, **styles[d]) for d in present]
    if show_budget:
        handles.append(Line2D([], [], color="0.35", linestyle=":", linewidth=1.2))
        present.append("budget")
    fig.legend(handles, present, loc="outside right upper", frameon=False, title="defense")
    fig.suptitle(_title(key), fontsize=13)
    return fig


def budget_figure(curves: pd.DataFrame, styles: dict | None = None) -> Figure:
    """Accuracy (untargeted) / ASR (targeted) vs. ε for one (dataset, norm, goal, knowledge)."""
    norm = _single_key(curves)[FIGURE_KEY.index("norm")]
    styles = styles or defense_styles(curves["defense"])
    return _figure(curves, "eps", f"{NORM_LABELS.get(norm, norm)} budget ε", styles, show_budget=True)


def strength_figure(curves: pd.DataFrame, styles: dict | None = None) -> Figure:
    """Accuracy / ASR vs. iterations or queries at the fixed budget, same layout as budget."""
    knowledge = _single_key(curves)[FIGURE_KEY.index("knowledge")]
    styles = styles or defense_styles(curves["defense"])
    return _figure(curves, "strength", f"attack strength ({STRENGTH_UNITS.get(knowledge, 'steps')})", styles, show_budget=False)


def _slug(parts: Iterable[str]) -> str:
    """File-name-safe join of option names."""
    return "_".join(re.sub(r"[^A-Za-z0-9.-]+", "-", str(p)) for p in parts)


def _save_all(curves: pd.DataFrame, kind: str, build, out_dir: Path, formats: Sequence[str], styles: dict | None) -> list[Path]:
    """One file per figure key and format, named '<kind>_<dataset>_<norm>_<goal>_<knowledge>'."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    styles = styles or defense_styles(curves["defense"])
    paths = []
    for key, group in curves.groupby(FIGURE_KEY, sort=True):
        fig = build(group, styles)
        for fmt in formats:
            path = out_dir / f"{_slug([kind, *key])}.{fmt}"
            fig.savefig(path, dpi=150)
            paths.append(path)
    return paths


def plot_budget_curves(curves: pd.DataFrame, out_dir: Path | str, formats: Sequence[str] = ("png", "svg"), styles: dict | None = None) -> list[Path]:
    """Write every budget-curve figure of a :func:`advbench.curves.budget_curve` frame."""
    return _save_all(curves, "budget", budget_figure, Path(out_dir), formats, styles)


def plot_strength_curves(curves: pd.DataFrame, out_dir: Path | str, formats: Sequence[str] = ("png", "svg"), styles: dict | None = None) -> list[Path]:
    """Write every strength-curve figure of a :func:`advbench.curves.strength_curve` frame."""
    return _save_all(curves, "strength", strength_figure, Path(out_dir), formats, styles)


def _caption(tidy: pd.DataFrame, norm: str, goal: str) -> str:
    """Says what the two numbers are and at which budget, as the seed's caption does."""
    budgets = ", ".join(f"{b:.4g}" for b in np.sort(tidy["eps_budget"].unique()))
    return f"Table 3 · {NORM_LABELS.get(norm, norm)} · {goal}: median minimal {NORM_LABELS.get(norm, norm)} perturbation / accuracy at ε = {budgets}"


def _markdown(table: pd.DataFrame) -> str:
    """Pipe table with the row index spelled out as leading columns."""
    flat = table.reset_index()
    lines = ["| " + " | ".join(map(str, flat.columns)) + " |", "|" + "---|" * len(flat.columns)]
    lines += ["| " + " | ".join(map(str, row)) + " |" for row in flat.itertuples(index=False)]
    return "\n".join(lines) + "\n"


def write_tables(tidy: pd.DataFrame, out_dir: Path | str) -> list[Path]:
    """Per (norm, goal): 'table3_<norm>_<goal>.md' (seed layout) and '.csv' (the numbers)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for (norm, goal), table in format_table3(tidy).items():
        rows = tidy[(tidy["norm"] == norm) & (tidy["goal"] == goal)]
        stem = out_dir / f"table3_{_slug([norm, goal])}"
        md, csv = stem.with_suffix(".md"), stem.with_suffix(".csv")
        md.write_text(f"{_caption(rows, norm, goal)}\n\n{_markdown(table)}", encoding="utf-8")
        rows.to_csv(csv, index=False)
        paths += [md, csv]
    return paths


def print_tables(tidy: pd.DataFrame, console: Console | None = None) -> None:
    """Show every Table 3 with rich, whole at any width (see :func:`advbench.terminal.print_table`)."""
    console = console or Console()
    for (norm, goal), table in format_table3(tidy).items():
        rows = tidy[(tidy["norm"] == norm) & (tidy["goal"] == goal)]
        flat = table.reset_index()
        out = Table(title=_caption(rows, norm, goal), show_lines=False)
        for i, column in enumerate(flat.columns):
            out.add_column(str(column), justify="left" if i < table.index.nlevels else "right")
        for row in flat.itertuples(index=False):
            out.add_row(*map(str, row))
        print_table(out, console)


def render_all(df: pd.DataFrame, out_dir: Path | str, formats: Sequence[str] = ("png", "svg"), grid_points: int = 101) -> list[Path]:
    """Budget and strength figures plus Table 3 files from one record frame."""
    budget = budget_curve(df, eps_grid(df, grid_points))
    styles = defense_styles(budget["defense"])
    strength = strength_curve(df)
    return [
        *plot_budget_curves(budget, out_dir, formats, styles),
        *plot_strength_curves(strength, out_dir, formats, styles),
        *write_tables(summary_table(df), out_dir),
    ]
