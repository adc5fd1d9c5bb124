"""`advbench plot` on `iqa run` records: the MSU score table, the metric ranking, gain curves.

Figures (one panel per metric, each titled, one line per attack, 95 % t-interval shaded):
`gain_vs_eps.png` (mean absolute scaled gain), `robustness_vs_eps.png` (the MSU robustness
score; higher is more robust), `gain_vs_iterations.png` (the gain of each iterate at the
largest budget, from one run's score traces) and, for score-based attacks, `gain_vs_queries.png`
(the gain of the best image after each query). Tables: `msu_scores.{md,csv}` (every score per
metric, attack and ε) and `ranking.{md,csv}` (metrics by their worst robustness score over the attacks
every metric was run with, at the largest budget every metric was attacked at, most robust first, the
mean beside it). Records of a partial sweep are drawn as they are, with a warning naming the missing
(metric, attack) cells: a ranking over attacks only some metrics met would compare unlike things.
Records with judges add the transfer matrix (`advbench.quality.iqa.metric_transfer`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator
from rich.console import Console
from rich.table import Table

from advbench.core.terminal import print_table
from advbench.quality.iqa.metric_transfer import render_transfer
from advbench.quality.iqa.msu_scores import gain_by_iteration, msu_scores

ATTACK_ORDER = ("fgsm", "ifgsm", "mifgsm", "amifgsm", "korhonen", "madc", "uap", "cumulative_uap", "square")


def _attack_styles(attacks: list[str]) -> dict[str, tuple]:
    palette = colormaps["tab10"]
    return {a: palette(i % 10) for i, a in enumerate(_ordered(attacks))}


def _panels(data: pd.DataFrame, x: str, y: str, xlabel: str, ylabel: str, title: str, *,
            x_scale: float = 1.0, zero_line: bool = True, whole_x: bool = False, log_x: bool = False) -> Figure:
    """One panel per metric, one line per attack with its `<y>_ci` band; the legend holds every panel's
    attacks. A panel whose values span more than 5 goes to a symlog y axis, and its label says so;
    `whole_x`: integer ticks (iterations); `log_x`: a log x axis (queries)."""
    metrics = sorted(data["metric"].unique())
    styles = _attack_styles(list(data["attack"].unique()))
    fig = Figure(figsize=(4.2 * len(metrics) + 1.8, 3.6), layout="constrained")
    axes = fig.subplots(1, len(metrics), squeeze=False)[0]
    legend: dict[str, object] = {}
    for ax, metric in zip(axes, metrics):
        panel = data[data["metric"] == metric]
        for attack, color in styles.items():
            line = panel[panel["attack"] == attack].sort_values(x)
            if line.empty:
                continue
            xs, ys, ci = line[x].to_numpy() * x_scale, line[y].to_numpy(), np.nan_to_num(line[f"{y}_ci"].to_numpy())
            (legend[attack],) = ax.plot(xs, ys, marker="o" if len(xs) <= 60 else None, ms=3.5, lw=1.6,
                                        color=color, label=attack)
            ax.fill_between(xs, ys - ci, ys + ci, color=color, alpha=0.15, lw=0)
        if zero_line:
            ax.axhline(0, color="0.6", lw=0.8, ls=":")
        symlog = bool(np.ptp(panel[y].to_numpy()) > 5)  # one attack far off (FGSM on NIQE): keep the others readable
        if symlog:
            ax.set_yscale("symlog", linthresh=1)
        if whole_x:
            _whole_ticks(ax, panel[x].to_numpy() * x_scale)
        if log_x:
            ax.set_xscale("log")
        ax.set_title(metric)
        ax.set_xlabel(xlabel + (" (log scale)" if log_x else ""))
        ax.set_ylabel(ylabel + ("\n(symlog: linear within ±1)" if symlog else ""))
        ax.grid(alpha=0.3)
    ordered = [a for a in styles if a in legend]
    fig.legend([legend[a] for a in ordered], ordered, loc="outside right upper", frameon=False, title="attack")
    fig.suptitle(title)
    return fig


def _whole_ticks(ax: object, xs: np.ndarray) -> None:
    """Integer ticks only; a panel of one iteration (FGSM) gets room around it, where a locator would
    otherwise fill the tiny span with fractions."""
    if len(xs) and np.ptp(xs) < 2:
        ax.set_xlim(xs.min() - 1, xs.max() + 1)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def missing_cells(frame: pd.DataFrame) -> list[tuple[str, str]]:
    """(metric, attack) pairs of the records' metrics and attacks that hold no record: a partial sweep."""
    present = set(zip(frame["metric"], frame["attack"]))
    return [(m, a) for m in sorted(frame["metric"].unique()) for a in _ordered(frame["attack"].unique())
            if (m, a) not in present]


def _ordered(attacks: object) -> list[str]:
    return sorted(attacks, key=lambda a: (ATTACK_ORDER.index(a) if a in ATTACK_ORDER else 99, a))


def largest_shared_eps(scores: pd.DataFrame) -> float:
    """The largest budget at which every metric was attacked (where the ranking compares them)."""
    shared = set.intersection(*(set(part["eps"]) for _, part in scores.groupby("metric")))
    return max(shared) if shared else float(scores["eps"].max())


def ranking(scores: pd.DataFrame) -> pd.DataFrame:
    """Metrics at the largest shared budget, ranked by their worst robustness score over the attacks every
    metric was run with (a metric is as robust as its strongest attack leaves it), most robust first; the
    mean beside it. Empty when no attack was run on every metric."""
    at = scores[np.isclose(scores["eps"], largest_shared_eps(scores))]
    table = at.pivot(index="metric", columns="attack", values="robustness").dropna(axis=1)
    cis = at.pivot(index="metric", columns="attack", values="robustness_ci")
    attacks = _ordered(table.columns)
    if not attacks:
        return pd.DataFrame()
    shown = pd.DataFrame({a: [f"{v:.2f} ± {c:.2f}" if np.isfinite(v) else "" for v, c in zip(table[a], cis[a])]
                          for a in attacks}, index=table.index)
    shown.insert(0, "mean", table[attacks].mean(axis=1).round(3))
    shown.insert(0, "worst", table[attacks].min(axis=1).round(3))
    return shown.sort_values(["worst", "mean"], ascending=False).reset_index()


def _markdown(frame: pd.DataFrame, caption: str) -> str:
    cols = list(frame.columns)
    lines = [caption, "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(f"{v:.4g}" if isinstance(v, float) else str(v) for v in row) + " |"
              for row in frame.itertuples(index=False)]
    return "\n".join(lines) + "\n"


def render_iqa(frame: pd.DataFrame, out_dir: Path) -> list[Path]:
    """Write the tables and figures of the module docstring; print the ranking, or why there is none."""
    out_dir.mkdir(parents=True, exist_ok=True)
    missing = missing_cells(frame)
    if missing:
        _warn(f"{len(missing)} (metric, attack) cells have no records: "
              + ", ".join(f"{m}/{a}" for m, a in missing) + "; the ranking compares only the attacks every metric "
              "was run with (rerun the sweep to fill them in)")
    scores = msu_scores(frame)
    eps = largest_shared_eps(scores)
    top = ranking(scores)
    written = _tables(out_dir, scores, top, eps)
    for stem, fig in _figures(frame, scores, eps).items():
        fig.savefig(out_dir / f"{stem}.png", dpi=150)
        written.append(out_dir / f"{stem}.png")
    written += render_transfer(frame, out_dir)
    if top.empty:
        _warn("no ranking: no attack was run on every metric")
    else:
        _show(top, _caption(scores, top, eps))
    return written


def _caption(scores: pd.DataFrame, top: pd.DataFrame, eps: float) -> str:
    attacks = [c for c in top.columns if c not in ("metric", "worst", "mean")]
    return (f"Robustness score (MSU; higher is more robust) at ε = {eps * 255:.3g}/255 over {', '.join(attacks)}, "
            f"mean ± 95 % t-interval over {int(scores['n'].min())}–{int(scores['n'].max())} images")


def _tables(out_dir: Path, scores: pd.DataFrame, top: pd.DataFrame, eps: float) -> list[Path]:
    tables = [("msu_scores", scores, "MSU robustness scores per metric, attack and ε")]
    if not top.empty:
        tables.append(("ranking", top, _caption(scores, top, eps)))
    written = []
    for stem, table, text in tables:
        table.to_csv(out_dir / f"{stem}.csv", index=False)
        (out_dir / f"{stem}.md").write_text(_markdown(table, text), encoding="utf-8")
        written += [out_dir / f"{stem}.md", out_dir / f"{stem}.csv"]
    return written


def _figures(frame: pd.DataFrame, scores: pd.DataFrame, eps: float) -> dict[str, Figure]:
    """The figures of the module docstring; the trace of a score-based attack (`queries` recorded) is
    drawn against queries, every other against iterations."""
    figures = {
        "gain_vs_eps": _panels(scores, "eps", "abs_gain", "ε (×1/255)", "absolute gain (scaled score)",
                               "Gain vs budget", x_scale=255),
        "robustness_vs_eps": _panels(scores, "eps", "robustness", "ε (×1/255)", "robustness score",
                                     "MSU robustness score vs budget (higher: more robust)", x_scale=255,
                                     zero_line=False),
    }
    queried = frame["queries"].notna().to_numpy() if "queries" in frame else np.zeros(len(frame), dtype=bool)
    for stem, rows, unit, options in (("gain_vs_iterations", ~queried, "iteration", {"whole_x": True}),
                                      ("gain_vs_queries", queried, "query", {"log_x": True})):
        if rows.any():
            curve = gain_by_iteration(frame[rows]).pipe(lambda g: g[np.isclose(g["eps"], eps)])
            figures[stem] = _panels(curve, "iteration", "abs_gain", unit, "absolute gain (scaled score)",
                                    f"Gain vs {unit} at ε = {eps * 255:.3g}/255", **options)
    return figures


def _warn(message: str) -> None:
    Console(stderr=True).print(f"[yellow]warning:[/yellow] {message}", soft_wrap=True, highlight=False)


def _show(top: pd.DataFrame, caption: str) -> None:
    table = Table(title=caption)
    for col in top.columns:
        table.add_column(str(col), justify="left" if col == "metric" else "right")
    for row in top.itertuples(index=False):
        table.add_row(*(f"{v:.3f}" if isinstance(v, float) else str(v) for v in row))
    print_table(table, Console())
