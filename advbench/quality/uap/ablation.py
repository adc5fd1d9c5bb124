"""The ablation figure of `advbench uap ablation`: the spread of per-image gains across the runs of a sweep."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from advbench.core.errors import AdvbenchError

ABLATION_FACTORS = {"seed": "training seed", "n_train": "training images", "epochs": "epochs", "data": "training data"}
ABLATION_COLUMNS = 2
"""Panels per row of the ablation figure, as in the robustness figures."""


def ablation_figure(records: pd.DataFrame, amplitude: float | None = None) -> Any:
    """One panel per ablation factor that varies: the spread of per-image gains.

    `records` are the `*.parquet` files `advbench uap train` writes (columns metric, seed,
    n_train, epochs, amplitude, gain; optionally data). Sweeps vary one factor at a time, so
    each panel keeps the runs whose other factors sit at their most common value (the
    reference run) and shows one box of per-image gains per level of its factor (quartiles,
    median, whiskers from the smallest to the largest gain, as the legend says), with the
    runs' means as dots, at `amplitude` (default: the largest).
    """
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    needed = {"metric", "seed", "n_train", "epochs", "amplitude", "gain"}
    if needed - set(records.columns):
        raise AdvbenchError(f"ablation records need columns {sorted(needed)}, missing {sorted(needed - set(records.columns))}")
    # `uap eval` writes its Table-1 records into the same folder; they carry no training keys.
    records = records.dropna(subset=["seed", "n_train", "epochs"])
    if records.empty:
        raise AdvbenchError("no `advbench uap train` records among the files given")
    # Seeds and counts are whole numbers; the NaNs of Table-1 rows had made them floats.
    records = records.astype({"seed": "int64", "n_train": "int64", "epochs": "int64"})
    amp = float(records["amplitude"].max()) if amplitude is None else float(amplitude)
    df = records[np.isclose(records["amplitude"], amp)]
    if df.empty:
        raise AdvbenchError(f"no ablation records at amplitude {amp}; have {sorted(records['amplitude'].unique())}")
    factors = [f for f in ABLATION_FACTORS if f in df and df[f].nunique() > 1] or ["seed"]
    run_keys = [c for c in ("metric", "data", "seed", "n_train", "epochs") if c in df]
    runs = df.groupby(run_keys)["gain"].mean().reset_index()
    baseline = {f: runs[f].mode().iloc[0] for f in factors}
    ncols = min(len(factors), ABLATION_COLUMNS)
    nrows = -(-len(factors) // ncols)
    fig = Figure(figsize=(4.2 * ncols, 3.4 * nrows + 0.9), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for ax in axes[len(factors):]:
        fig.delaxes(ax)
    for ax, factor in zip(axes, factors):
        others = [f for f in factors if f != factor]
        rows = df[(df[others] == pd.Series(baseline)[others]).all(axis=1)] if others else df
        panel_runs = runs[(runs[others] == pd.Series(baseline)[others]).all(axis=1)] if others else runs
        levels = sorted(rows[factor].unique())
        ax.boxplot([rows.loc[rows[factor] == v, "gain"].to_numpy() for v in levels], whis=(0, 100),
                   medianprops={"color": "C1"})
        pos = panel_runs[factor].map({v: i + 1 for i, v in enumerate(levels)})
        ax.scatter(pos, panel_runs["gain"], color="C3", s=14, zorder=3)
        ax.set_xticks(range(1, len(levels) + 1), [str(v) for v in levels])
        ax.set_xlabel(ABLATION_FACTORS[factor])
        ax.set_ylabel("metric gain per image")
        ax.axhline(0, color="0.6", lw=0.8)
    legend = [Patch(facecolor="none", edgecolor="black", label="images: quartiles (box), median (line), min–max (whiskers)"),
              Line2D([], [], color="C3", marker="o", linestyle="none", markersize=4, label="mean of one training run")]
    fig.legend(handles=legend, loc="outside lower center", ncols=1, frameon=False, fontsize="small")
    fig.suptitle(f"UAP ablation, {', '.join(sorted(df['metric'].unique()))}, amplitude {amp:g}")
    return fig


def plot_ablation(records: pd.DataFrame, out: str | Path, amplitude: float | None = None) -> Path:
    """Save :func:`ablation_figure` of `records` at `out` (PNG, 150 dpi)."""
    fig = ablation_figure(records, amplitude)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=150)
    return out
