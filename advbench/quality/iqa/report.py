"""`advbench plot` on `iqa run` records: the MSU score table, the metric ranking, gain curves.

Figures (one panel per metric, one line per attack, 95 % t-interval shaded):
`gain_vs_eps.png` (mean absolute scaled gain), `robustness_vs_eps.png` (the MSU robustness
score; higher is more robust) and `gain_vs_iterations.png` (the gain of each iterate at the
largest budget, from one run's score traces). Tables: `msu_scores.{md,csv}` (every score per
metric, attack and ε) and `ranking.{md,csv}` (metrics by their worst robustness score over the attacks
at the largest budget every metric was attacked at, most robust first, the mean beside it).
Records with judges add the transfer matrix (`advbench.quality.iqa.transfer`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.figure import Figure
from rich.console import Console
from rich.table import Table

from advbench.core.terminal import print_table
from advbench.quality.iqa.scores import gain_by_iteration, msu_scores
from advbench.quality.iqa.transfer import render_transfer

ATTACK_ORDER = ("fgsm", "ifgsm", "mifgsm", "amifgsm", "korhonen", "madc", "uap", "cumulative_uap")


def _attack_styles(attacks: list[str]) -> dict[str, tuple]:
    palette = colormaps["tab10"]
    ordered = sorted(attacks, key=lambda a: (ATTACK_ORDER.index(a) if a in ATTACK_ORDER else 99, a))
    return {a: palette(i % 10) for i, a in enumerate(ordered)}


def _panels(data: pd.DataFrame, x: str, y: str, xlabel: str, ylabel: str, title: str, *,
            x_scale: float = 1.0, zero_line: bool = True) -> Figure:
    """One panel per metric, one line per attack with its `<y>_ci` band."""
    metrics = sorted(data["metric"].unique())
    styles = _attack_styles(list(data["attack"].unique()))
    fig = Figure(figsize=(4.2 * len(metrics) + 1.8, 3.6), layout="constrained")
    axes = fig.subplots(1, len(metrics), squeeze=False)[0]
    for ax, metric in zip(axes, metrics):
        panel = data[data["metric"] == metric]
        for attack, color in styles.items():
            line = panel[panel["attack"] == attack].sort_values(x)
            if line.empty:
                continue
            xs, ys, ci = line[x].to_numpy() * x_scale, line[y].to_numpy(), np.nan_to_num(line[f"{y}_ci"].to_numpy())
            ax.plot(xs, ys, marker="o", ms=3.5, lw=1.6, color=color, label=attack)
            ax.fill_between(xs, ys - ci, ys + ci, color=color, alpha=0.15, lw=0)
        if zero_line:
            ax.axhline(0, color="0.6", lw=0.8, ls=":")
        if np.ptp(panel[y].to_numpy()) > 5:  # one attack far off (FGSM on NIQE): keep the others readable
            ax.set_yscale("symlog", linthresh=1)
        ax.set_title(metric)
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(ylabel)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside right upper", frameon=False, title="attack")
    fig.suptitle(title)
    return fig


def largest_shared_eps(scores: pd.DataFrame) -> float:
    """The largest budget at which every metric was attacked (where the ranking compares them)."""
    shared = set.intersection(*(set(part["eps"]) for _, part in scores.groupby("metric")))
    return max(shared) if shared else float(scores["eps"].max())


def ranking(scores: pd.DataFrame) -> pd.DataFrame:
    """Metrics at the largest shared budget, ranked by their worst robustness score over the attacks
    (a metric is as robust as its strongest attack leaves it), most robust first; the mean beside it."""
    at = scores[np.isclose(scores["eps"], largest_shared_eps(scores))]
    table = at.pivot(index="metric", columns="attack", values="robustness")
    cis = at.pivot(index="metric", columns="attack", values="robustness_ci")
    attacks = sorted(table.columns, key=lambda a: (ATTACK_ORDER.index(a) if a in ATTACK_ORDER else 99, a))
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
    """Write the tables and figures of the module docstring; print the ranking."""
    out_dir.mkdir(parents=True, exist_ok=True)
    scores = msu_scores(frame)
    eps = largest_shared_eps(scores)
    top = ranking(scores)
    caption = (f"Robustness score (MSU; higher is more robust) at ε = {eps * 255:.3g}/255, mean ± 95 % t-interval "
               f"over {int(scores['n'].min())}–{int(scores['n'].max())} images")
    written = []
    for stem, table, text in (("msu_scores", scores, "MSU robustness scores per metric, attack and ε"),
                              ("ranking", top, caption)):
        table.to_csv(out_dir / f"{stem}.csv", index=False)
        (out_dir / f"{stem}.md").write_text(_markdown(table, text), encoding="utf-8")
        written += [out_dir / f"{stem}.md", out_dir / f"{stem}.csv"]
    figures = {
        "gain_vs_eps": _panels(scores, "eps", "abs_gain", "ε (×1/255)", "absolute gain (scaled score)",
                               "Gain vs budget", x_scale=255),
        "robustness_vs_eps": _panels(scores, "eps", "robustness", "ε (×1/255)", "robustness score",
                                     "MSU robustness score vs budget (higher: more robust)", x_scale=255,
                                     zero_line=False),
        "gain_vs_iterations": _panels(gain_by_iteration(frame).pipe(lambda g: g[np.isclose(g["eps"], eps)]),
                                      "iteration", "abs_gain", "iteration", "absolute gain (scaled score)",
                                      f"Gain vs iterations at ε = {eps * 255:.3g}/255"),
    }
    for stem, fig in figures.items():
        fig.savefig(out_dir / f"{stem}.png", dpi=150)
        written.append(out_dir / f"{stem}.png")
    written += render_transfer(frame, out_dir)
    _show(top, caption)
    return written


def _show(top: pd.DataFrame, caption: str) -> None:
    table = Table(title=caption)
    for col in top.columns:
        table.add_column(str(col), justify="left" if col == "metric" else "right")
    for row in top.itertuples(index=False):
        table.add_row(*(f"{v:.3f}" if isinstance(v, float) else str(v) for v in row))
    print_table(table, Console())
