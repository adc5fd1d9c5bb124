"""Figures and tables from curve frames (matplotlib, no pyplot state).

Figures are built with ``matplotlib.figure.Figure`` directly, which renders through Agg
without touching the global pyplot backend or figure registry, so plotting from a library
call or a test never leaks figures or needs a display.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.layout_engine import ConstrainedLayoutEngine
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, MaxNLocator, PercentFormatter
from rich.console import Console
from rich.table import Table

from advbench.core.errors import AdvbenchError
from advbench.core.norms import label as norm_label
from advbench.core.terminal import print_table
from advbench.robustness.report.curves import (
    STRENGTH_UNITS,
    budget_axis,
    budget_curve,
    checkpoint_curve,
    eps_grid,
    query_curve,
    query_unit,
    strength_curve,
    whole_norm,
)
from advbench.robustness.report.shards import ROW, same_name_cells
from advbench.robustness.report.table3 import RATE, defense_categories, format_table3, summary_table, with_categories

FIGURE_KEY = ["dataset", "norm", "goal", "knowledge"]
"""One figure per threat model and data set; panels are attacks, lines are model rows (a defense, or a
labelled model with its defense: `shards.ROW`)."""

KNOWLEDGE_LABELS = {"white": "white-box", "transfer": "transfer-based", "score": "score-based", "decision": "decision-based"}
GROUP_BY = ("defense", "category")
"""What the legend is grouped by: nothing (one entry per defense), or defense category (the
defenses under a bold heading per category, whose members also differ in line style)."""
LINESTYLES = ("-", "--", "-.", ":")
MAX_COLUMNS = 2
"""Panels per row at most, so a figure stays legible at README width (four attacks: a 2 × 2
grid, about 1110 px wide at 150 dpi); rows are then filled evenly."""
PANEL_SIZE = (3.4, 2.9)
FEW_STEPS = 5
"""Strength axes up to this many iterations/queries mark every step (FGSM is one step)."""
MAX_LEGEND_COLUMNS = 6
BAND_ALPHA = 0.2


def defense_styles(defenses: Iterable[str], categories: dict[str, str] | None = None) -> dict[str, dict[str, str | tuple | int]]:
    """Colour and line style per defense, fixed by sorted name so every figure agrees:
    every defense gets its own colour (a zoo of 14 must not read as a few lines); past twenty
    colours repeat with a new line style. With `categories` (defense -> category) colours go in
    (category, name) order and the defenses of one category take the line styles in turn, so
    members of a category differ in style as well as colour.
    """
    names = sorted(set(defenses))
    if categories is not None:
        missing = [d for d in names if d not in categories]
        if missing:
            raise AdvbenchError(f"no category for defense(s) {', '.join(missing)}")
        names.sort(key=lambda d: (categories[d], d))
    shades = colormaps["tab20"].colors  # beyond ten: dark shades first, so neighbours never share a hue
    palette = colormaps["tab10"].colors if len(names) <= 10 else [*shades[0::2], *shades[1::2]]
    styles: dict[str, dict[str, str | tuple | int]] = {}
    for i, name in enumerate(names):
        rank = i // len(palette) + (0 if categories is None else [categories[d] for d in names[:i]].count(categories[name]))
        styles[name] = {"color": palette[i % len(palette)], "linestyle": LINESTYLES[rank % len(LINESTYLES)]}
    return styles


def _single_key(curves: pd.DataFrame) -> tuple[str, ...]:
    """Figures take one (dataset, norm, goal, knowledge) group; say which came otherwise."""
    keys = curves[FIGURE_KEY].drop_duplicates()
    if len(keys) != 1:
        raise AdvbenchError(f"a figure takes curves of one {'/'.join(FIGURE_KEY)}, got {len(keys)} combinations")
    return tuple(keys.iloc[0])


Entry = tuple[Any, str, bool]
"""A legend entry: handle, label, and whether it is a category heading (bold)."""


def _legend_groups(present: list[str], styles: dict, categories: dict[str, str] | None,
                   extra: list[tuple[Any, str]]) -> list[list[Entry]]:
    """Legend entries in the groups a column never splits: each category's heading with its
    defenses (each defense alone when not grouped), then `extra` (budget line, band, checkpoints)."""
    def entry(d: str) -> Entry:
        return Line2D([], [], linewidth=2, **styles[d]), d, False
    if categories is None:
        groups = [[entry(d)] for d in present]
    else:
        groups = [[(Line2D([], [], linestyle="none"), group, True), *(entry(d) for d in present if categories[d] == group)]
                  for group in sorted({categories[d] for d in present})]
    if extra:
        groups.append([(handle, label, False) for handle, label in extra])
    return groups


def _columns(groups: list[list[Entry]], ncols: int) -> list[Entry]:
    """The entries laid out column by column in at most `ncols` columns of equal height, as few
    rows as keep every group whole; blank entries pad the columns (matplotlib fills columns in turn)."""
    blank: Entry = (Line2D([], [], linestyle="none"), "", False)
    for rows in range(max(map(len, groups)), sum(map(len, groups)) + 1):
        columns: list[list[Entry]] = [[]]
        for group in groups:
            if columns[-1] and len(columns[-1]) + len(group) > rows:
                columns.append([])
            columns[-1].extend(group)
        if len(columns) <= ncols:
            break
    return [e for column in columns for e in column + [blank] * (rows - len(column))]


def _legend(fig: Figure, groups: list[list[Entry]], title: str, panels: tuple[float, float]) -> None:
    """The legend below the panels (it takes no width from them and meets no suptitle), in the
    columns giving the smallest figure where it is no taller than the panels; the figure widens
    to hold it and grows by its height."""
    options = []
    for ncols in range(1, min(MAX_LEGEND_COLUMNS, len(groups)) + 1):
        entries = _columns(groups, ncols) if any(len(g) > 1 for g in groups) else [e for g in groups for e in g]
        legend = _make_legend(fig, entries, ncols, title)
        box = legend.get_window_extent(fig.canvas.get_renderer())
        legend.remove()
        width, height = max(panels[0], box.width / fig.dpi + 0.3), panels[1] + box.height / fig.dpi + 0.1
        options.append((height - panels[1] > panels[1], width * height, ncols, (width, height), entries))
    _, _, ncols, size, entries = min(options, key=lambda o: o[:3])
    fig.set_size_inches(size)
    _make_legend(fig, entries, ncols, title)


def _make_legend(fig: Figure, entries: list[Entry], ncols: int, title: str) -> Any:
    """The figure's legend of `entries` below the panels, category headings in bold."""
    handles, labels, bold = (list(column) for column in zip(*entries))
    legend = fig.legend(handles, labels, loc="outside lower center", ncols=ncols, frameon=False, title=title, fontsize=9,
                        columnspacing=1.2, handlelength=1.8)
    for text, heading in zip(legend.get_texts(), bold):
        text.set_fontweight("bold" if heading else "normal")
    return legend


def _figure(curves: pd.DataFrame, x: str, xlabel: str, styles: dict, show_budget: bool,
            points: pd.DataFrame | None = None, categories: dict[str, str] | None = None) -> Figure:
    """Grid of panels, one per attack, one line per model row, shared 0-100% y axis, legend below;
    x = "queries" is drawn on a log axis from 1 to the budget; `points` (same x and metric)
    are drawn as open markers on the lines of their defense (the decision attacks' checkpoints).
    """
    dataset, norm, goal, knowledge = _single_key(curves)
    metric, ylabel = RATE[goal]  # what Table 3 reports for the goal too
    attacks = sorted(curves["attack"].unique())
    rows = -(-len(attacks) // MAX_COLUMNS)
    ncols = -(-len(attacks) // rows)
    fig = Figure(layout=ConstrainedLayoutEngine(w_pad=0.06, wspace=0.06))  # sized by `_legend`
    FigureCanvasAgg(fig)  # Agg measures the legend
    axes = fig.subplots(rows, ncols, sharey=True, squeeze=False).ravel()
    for ax in axes[len(attacks):]:
        fig.delaxes(ax)
    log_x, whole = x == "queries", show_budget and whole_norm(norm)  # a whole norm's budget curve steps at k
    banded = marked = False
    for ax, attack in zip(axes, attacks):
        panel = curves[curves["attack"] == attack]
        top = panel[x].max()
        few = not show_budget and not log_x and top <= FEW_STEPS
        banded |= _lines(ax, panel, x, metric, styles, few=few, steps=whole or not show_budget)
        if points is not None and not points.empty:
            for defense, dots in points[points["attack"] == attack].groupby(ROW, sort=True):
                ax.plot(dots[x], dots[metric], linestyle="none", marker="o", markersize=5, markerfacecolor="white",
                        markeredgewidth=1.3, color=styles[defense]["color"])
                marked = True
        _axes(ax, panel, attack, xlabel, top, log_x=log_x, show_budget=show_budget, few=few)
        if whole:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    for ax in axes[: len(attacks) : ncols]:
        ax.set_ylabel(ylabel)
    marks = {"budget": (show_budget, Line2D([], [], color="0.35", linestyle=":", linewidth=1.2)),
             "min-ε search bracket": (banded, Patch(color="0.35", alpha=BAND_ALPHA, linewidth=0)),
             "query checkpoint": (marked, Line2D([], [], linestyle="none", marker="o", markerfacecolor="white", color="0.35"))}
    extra = [(handle, label) for label, (shown, handle) in marks.items() if shown]
    # 'digits · ℓ∞ · untargeted · white-box'
    title = fig.suptitle(" · ".join([dataset, norm_label(norm), goal, KNOWLEDGE_LABELS.get(knowledge, knowledge)]),
                         fontsize=13)
    groups = _legend_groups(sorted(curves[ROW].unique()), styles, categories, extra)
    titled = title.get_window_extent(fig.canvas.get_renderer()).width / fig.dpi + 0.4  # one panel is narrower
    _legend(fig, groups, "defense" if categories is None else "category / defense",
            (max(PANEL_SIZE[0] * ncols + 0.6, titled), PANEL_SIZE[1] * rows + 0.5))
    return fig


def _lines(ax: Any, panel: pd.DataFrame, x: str, metric: str, styles: dict, *, few: bool, steps: bool) -> bool:
    """One line per model row, over the band to its curve from `min_eps_lo` where the frame has
    one that is not flat (see `curves.budget_curve`); whether a band was drawn."""
    banded = False
    for defense, line in panel.groupby(ROW, sort=True):
        style = {"marker": "o" if few else None, **styles[defense]}
        edge = line.get(f"{metric}_from_lo")
        if edge is not None and not np.allclose(edge, line[metric], equal_nan=True):
            ax.fill_between(line[x], edge, line[metric], color=style["color"], alpha=BAND_ALPHA, linewidth=0)
            banded = True
        ax.plot(line[x], line[metric], drawstyle="steps-post" if steps else "default", linewidth=1.6, markersize=4,
                **style)
    return banded


def _axes(ax: Any, panel: pd.DataFrame, attack: str, xlabel: str, top: float, *, log_x: bool, show_budget: bool,
          few: bool) -> None:
    """The panel's title, 0-100 % y axis, light grid and open frame; x: queries on a log axis,
    budgets with their dotted line, a few steps as ticks, or whole iterations."""
    ax.set_title(attack, fontsize=11)
    ax.set_ylim(-0.02, 1.02)
    ax.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
    ax.grid(True, color="0.88", linewidth=0.8)
    ax.set_axisbelow(True)
    ax.spines[["top", "right"]].set_visible(False)
    ax.set_xlabel(xlabel)
    if log_x:  # queries span orders of magnitude: 1 .. budget on a log axis
        ax.set_xscale("log")
        ax.set_xlim(1, max(top, 10))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:,.0f}" if value >= 1 else ""))  # 1, 100, 20,000
    elif show_budget:
        for budget in panel["eps_budget"].unique():
            ax.axvline(budget, color="0.35", linestyle=":", linewidth=1.2)
        ax.set_xlim(0, top or 1)
    elif few:  # a handful of whole steps: every step a tick, the end points inside the frame
        ax.set_xticks(range(int(top) + 1))
        ax.set_xlim(-0.3, top + 0.3)
    else:  # iterations are whole numbers
        ax.xaxis.set_major_locator(MaxNLocator(nbins=6, integer=True))
        ax.set_xlim(0, top or 1)


def budget_figure(curves: pd.DataFrame, styles: dict | None = None, categories: dict[str, str] | None = None) -> Figure:
    """Accuracy (untargeted) / ASR (targeted) vs. ε for one (dataset, norm, goal, knowledge)."""
    norm = _single_key(curves)[FIGURE_KEY.index("norm")]
    styles = styles or defense_styles(curves[ROW], categories)
    return _figure(curves, "eps", budget_axis(norm), styles, show_budget=True,
                   categories=categories)


def strength_figure(curves: pd.DataFrame, styles: dict | None = None, points: pd.DataFrame | None = None,
                    categories: dict[str, str] | None = None) -> Figure:
    """Accuracy / ASR vs. iterations (a strength curve) or queries (a query curve, log axis,
    with the checkpoint `points` if given) at the fixed budget, same layout as budget."""
    knowledge = _single_key(curves)[FIGURE_KEY.index("knowledge")]
    styles = styles or defense_styles(curves[ROW], categories)
    x = "queries" if "queries" in curves.columns else "strength"
    unit = "queries, log scale" if x == "queries" else STRENGTH_UNITS.get(knowledge, "steps")
    return _figure(curves, x, f"attack strength ({unit})", styles, show_budget=False, points=points,
                   categories=categories)


def slug(parts: Iterable[str]) -> str:
    """File-name-safe join of option names."""
    return "_".join(re.sub(r"[^A-Za-z0-9.-]+", "-", str(p)) for p in parts)


def _save_all(curves: pd.DataFrame, kind: str, build, out_dir: Path, formats: Sequence[str], styles: dict | None,
              categories: dict[str, str] | None = None) -> list[Path]:
    """One file per figure key and format, named '<kind>_<dataset>_<norm>_<goal>_<knowledge>'.

    `build(group, styles, key)` draws the figure of one key's curves.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    styles = styles or defense_styles(curves[ROW], categories)
    paths = []
    for key, group in curves.groupby(FIGURE_KEY, sort=True):
        fig = build(group, styles, key)
        for fmt in formats:
            path = out_dir / f"{slug([kind, *key])}.{fmt}"
            fig.savefig(path, dpi=150)
            paths.append(path)
    return paths


def plot_budget_curves(curves: pd.DataFrame, out_dir: Path | str, formats: Sequence[str] = ("png", "svg"), styles: dict | None = None,
                       categories: dict[str, str] | None = None) -> list[Path]:
    """Write every budget-curve figure of a :func:`advbench.robustness.report.curves.budget_curve` frame."""
    return _save_all(curves, "budget", lambda group, styles, key: budget_figure(group, styles, categories),
                     Path(out_dir), formats, styles, categories)


def plot_strength_curves(curves: pd.DataFrame, out_dir: Path | str, formats: Sequence[str] = ("png", "svg"), styles: dict | None = None,
                         points: pd.DataFrame | None = None, categories: dict[str, str] | None = None) -> list[Path]:
    """Write every figure of a :func:`advbench.robustness.report.curves.strength_curve` or
    :func:`advbench.robustness.report.curves.query_curve` frame (with its :func:`advbench.robustness.report.curves.checkpoint_curve`
    points)."""
    def build(group: pd.DataFrame, styles: dict, key: tuple) -> Figure:
        mine = None if points is None or points.empty else points[(points[FIGURE_KEY] == key).all(axis=1)]
        return strength_figure(group, styles, mine, categories)

    return _save_all(curves, "strength", build, Path(out_dir), formats, styles, categories)


def _caption(tidy: pd.DataFrame, norm: str, goal: str) -> str:
    """Says what the two numbers are and at which budget, as the seed's caption does."""
    budgets = ", ".join(f"{b:.4g}" for b in np.sort(tidy["eps_budget"].unique()))
    label = norm_label(norm)
    return f"Table 3 · {label} · {goal}: median minimal {label} perturbation / {RATE[goal][1]} at ε = {budgets}"


def markdown_table(table: pd.DataFrame) -> str:
    """Pipe table with the row index spelled out as leading columns."""
    flat = table.reset_index()
    lines = ["| " + " | ".join(map(str, flat.columns)) + " |", "|" + "---|" * len(flat.columns)]
    lines += ["| " + " | ".join(map(str, row)) + " |" for row in flat.itertuples(index=False)]
    return "\n".join(lines) + "\n"


def write_tables(tidy: pd.DataFrame, out_dir: Path | str, by_category: bool = False) -> list[Path]:
    """Per (norm, goal): 'table3_<norm>_<goal>.md' (seed layout) and '.csv' (the numbers)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for (norm, goal), table in format_table3(tidy, by_category).items():
        rows = tidy[(tidy["norm"] == norm) & (tidy["goal"] == goal)]
        stem = out_dir / f"table3_{slug([norm, goal])}"
        md, csv = stem.with_suffix(".md"), stem.with_suffix(".csv")
        md.write_text(f"{_caption(rows, norm, goal)}\n\n{markdown_table(table)}", encoding="utf-8")
        rows.to_csv(csv, index=False)
        paths += [md, csv]
    return paths


def print_tables(tidy: pd.DataFrame, console: Console | None = None, by_category: bool = False) -> None:
    """Show every Table 3 with rich, whole at any width (see :func:`advbench.core.terminal.print_table`)."""
    console = console or Console()
    for (norm, goal), table in format_table3(tidy, by_category).items():
        rows = tidy[(tidy["norm"] == norm) & (tidy["goal"] == goal)]
        flat = table.reset_index()
        out = Table(title=_caption(rows, norm, goal), show_lines=False)
        for i, column in enumerate(flat.columns):
            out.add_column(str(column), justify="left" if i < table.index.nlevels else "right")
        for row in flat.itertuples(index=False):
            out.add_row(*map(str, row))
        print_table(out, console)


def render_all(df: pd.DataFrame, out_dir: Path | str, formats: Sequence[str] = ("png", "svg"), grid_points: int = 101,
               group_by: str = "defense") -> list[Path]:
    """Budget and strength figures plus Table 3 files from one record frame.

    Strength figures of score- and decision-based cells are query curves (log axis, with the
    decision attacks' checkpoints). `group_by="category"` lists the legend by defense category
    and heads the tables' defense columns with it; the CSV tables carry it either way. Cells of
    several runs that share a name are drawn apart, with one warning line per name on stderr.
    """
    if group_by not in GROUP_BY:
        raise AdvbenchError(f"unknown grouping '{group_by}'; valid: {', '.join(GROUP_BY)}")
    df = with_categories(df)
    categories = defense_categories(df) if group_by == "category" else None
    budget = budget_curve(df, eps_grid(df, grid_points))
    if categories is not None:  # by row: the rows of a defense (two models, two runs) share its category
        categories = {row: categories[defense] for row, defense in zip(budget[ROW], budget["defense"])}
    for line in same_name_cells(df):
        print(f"warning: {line}", file=sys.stderr)
    styles = defense_styles(budget[ROW], categories)
    queries = query_unit(df)
    written = plot_budget_curves(budget, out_dir, formats, styles, categories)
    if (~queries).any():
        written += plot_strength_curves(strength_curve(df[~queries]), out_dir, formats, styles, categories=categories)
    if queries.any():
        written += plot_strength_curves(query_curve(df[queries]), out_dir, formats, styles,
                                        checkpoint_curve(df[queries]), categories)
    return [*written, *write_tables(summary_table(df), out_dir, by_category=categories is not None)]
