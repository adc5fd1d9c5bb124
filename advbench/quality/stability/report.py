"""RD records -> stability Table 2 and the gain-vs-loss figure (the UAP paper's Figure 6)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure
from rich.console import Console
from rich.table import Table

from advbench.core.terminal import print_table
from advbench.quality.stability import scores as stability
from advbench.quality.stability.schema import RD_MARKER_COLUMN

TABLE2_DECIMALS = {"stability": 2, "loss_lo": 4, "loss_hi": 4}
"""Fixed decimals per Table-2 column (other numbers, e.g. SRCC columns, get 3), so -3.80 and
-4.18 line up instead of reading -3.8 and -4.18."""


def is_rd_records(df: pd.DataFrame) -> bool:
    """True for stability RD records (as opposed to robustness records)."""
    return RD_MARKER_COLUMN in df.columns


def stability_from_records(
    df: pd.DataFrame, srcc: pd.DataFrame | None = None, source: str = "rd records"
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Table 2 and the mean gain-vs-loss curves of RD records (one or many metrics)."""
    higher_better = (
        df.groupby("metric")["higher_better"].first().astype(bool).to_dict()
        if "higher_better" in df.columns
        else None
    )
    curves = stability.gain_vs_loss(stability.rd_areas(df, higher_better))
    return stability.stability_table(curves, source, srcc), curves


def published_table2(
    root: str | Path, srcc: pd.DataFrame | None = None
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Table 2 from the paper's published data, once from its stored areas, once recomputed.

    The `source` column tells the two apart; the curves frame carries it too.
    """
    records, stored = stability.load_published(root)
    table_r, curves_r = stability_from_records(records, srcc, source="recomputed")
    curves_s = stability.gain_vs_loss(stored)
    table_s = stability.stability_table(curves_s, "stored areas", srcc)
    curves = pd.concat([curves_s.assign(source="stored areas"), curves_r.assign(source="recomputed")])
    return pd.concat([table_s, table_r], ignore_index=True), curves.reset_index(drop=True)


def plot_gain_vs_loss(
    curves: pd.DataFrame, out: str | Path, interval: tuple[float, float] | None = None
) -> Path:
    """One line per metric, target gain vs PSNR loss, the shared loss interval shaded."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    lo, hi = stability.shared_loss_interval(curves) if interval is None else interval
    fig = Figure(figsize=(6.4, 4.4))
    ax = fig.add_subplot()
    ax.axvspan(lo, hi, color="0.92", label="shared loss interval")
    ax.axhline(0.0, color="0.5", lw=0.8)
    for metric, pts in curves.sort_values("amplitude").groupby("metric"):
        ax.plot(pts["loss"], pts["gain"], marker="o", label=str(metric))
    ax.set_xlabel("proxy-metric (PSNR) loss")
    ax.set_ylabel("target-metric gain")
    ax.set_title("Target-metric gain vs proxy-metric loss")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(out, dpi=150)
    return out


def write_table2(table: pd.DataFrame, out_dir: str | Path, console: Console | None = None) -> list[Path]:
    """Write Table 2 as Markdown and CSV and print it; returns the two paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path, md_path = out_dir / "table2.csv", out_dir / "table2.md"
    table.to_csv(csv_path, index=False)
    header = "| " + " | ".join(table.columns) + " |"
    rule = "| " + " | ".join("---" for _ in table.columns) + " |"
    cells = [[_cell(column, value) for column, value in zip(table.columns, row)] for row in table.itertuples(index=False)]
    rows = ["| " + " | ".join(row) + " |" for row in cells]
    md_path.write_text(
        "Stability score (−100 × area under the mean gain-vs-loss curve; higher is more stable)\n\n"
        + "\n".join([header, rule, *rows])
        + "\n"
    )
    rich_table = Table(title="Table 2: stability scores")
    for column in table.columns:
        rich_table.add_column(str(column), justify="left" if column in ("metric", "source") else "right")
    for row in cells:
        rich_table.add_row(*row)
    print_table(rich_table, console)
    return [md_path, csv_path]


def _cell(column: str, value: object) -> str:
    """A Table-2 value as text: fixed decimals per column, empty for a missing value."""
    if isinstance(value, str):
        return value
    if pd.isna(value):
        return ""
    return f"{float(value):.{TABLE2_DECIMALS.get(column, 3)}f}"


def render_stability(df: pd.DataFrame, out_dir: str | Path, console: Console | None = None) -> list[Path]:
    """What `advbench plot` does with RD records: Table 2, the curves as CSV, and Figure 6."""
    out_dir = Path(out_dir)
    table, curves = stability_from_records(df)
    paths = write_table2(table, out_dir, console)
    curves_path = out_dir / "gain_vs_loss.csv"
    curves.to_csv(curves_path, index=False)
    interval = (float(table["loss_lo"].iloc[0]), float(table["loss_hi"].iloc[0]))
    figure = plot_gain_vs_loss(curves, out_dir / "gain_vs_loss.png", interval)
    return [*paths, curves_path, figure]
