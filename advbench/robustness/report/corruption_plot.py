"""Figures and tables of corruption records (`threat=corruptions`): accuracy against severity.

One figure per data set, one panel per model row: a line per corruption and, thick, their mean,
the aggregate whose mean over severities 1-5 is RobustBench's common-corruptions number.
Severity 0 is the clean accuracy. Accuracy at severity k is the mean of `correct_s<k>`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import PercentFormatter

from advbench.core.errors import AdvbenchError
from advbench.robustness.report.plot import markdown_table, slug
from advbench.robustness.report.shards import ROW, row_name

SEVERITY_COLUMNS = ("clean_correct", *(f"correct_s{s}" for s in range(1, 6)))
AGGREGATE = "mean"
"""The row of the mean over corruptions, in the figures and the tables."""


def corruption_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Accuracy clean and at each severity per (dataset, model row, corruption), then per (dataset, row) the
    mean over its corruptions (`AGGREGATE`); `mean_1_5`: the mean over severities 1-5 (RobustBench's number)."""
    rows = frame.assign(**{ROW: [row_name(m, d) for m, d in zip(frame["model_label"], frame["defense"])]})
    table = rows.groupby(["dataset", ROW, "corruption"])[list(SEVERITY_COLUMNS)].mean().astype(float)
    table.columns = ["clean", *(f"s{s}" for s in range(1, 6))]
    mean = table.groupby(level=["dataset", ROW]).mean()
    mean.index = pd.MultiIndex.from_tuples([(*i, AGGREGATE) for i in mean.index], names=table.index.names)
    # The mean last among its row's corruptions ('~' sorts after every name).
    table = pd.concat([table, mean]).sort_index(key=lambda i: i.where(i != AGGREGATE, "~") if i.name == "corruption" else i)
    table["mean_1_5"] = table[[f"s{s}" for s in range(1, 6)]].mean(axis=1)
    return table


def with_corruption_errors(table: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """`table` with Hendrycks & Dietterich's corruption error `ce` (the row's error summed over severities
    1-5 over the baseline row's, per corruption) and, on each `mean` row, `mce`: the mean of its `ce`
    over the corruptions the baseline was measured on (the paper's mCE, with `baseline` for AlexNet)."""
    errors = 1 - table[[f"s{s}" for s in range(1, 6)]].sum(axis=1) / 5
    present = table.index.get_level_values(1)
    if baseline not in set(present):
        raise AdvbenchError(f"--baseline '{baseline}' is no model row of these records; rows: {', '.join(sorted(set(present)))}")
    base = errors[present == baseline].droplevel(1)
    ce = errors / base.reindex(errors.index.droplevel(1)).to_numpy()
    out = table.assign(ce=ce.where(table.index.get_level_values(2) != AGGREGATE))
    mce = out["ce"].groupby(level=[0, 1]).mean()
    is_mean = out.index.get_level_values(2) == AGGREGATE
    out.loc[is_mean, "mce"] = mce.reindex(out.index[is_mean].droplevel(2)).to_numpy()
    return out


def corruption_figure(table: pd.DataFrame, dataset: str) -> Figure:
    """One panel per model row of `dataset`: accuracy against severity, a line per corruption, the mean thick."""
    rows = table.loc[dataset].index.get_level_values(0).unique()
    fig = Figure(figsize=(7 * len(rows), 4), layout="constrained")
    FigureCanvasAgg(fig)
    colours = colormaps["tab20"]
    for i, row in enumerate(rows):
        ax = fig.add_subplot(1, len(rows), i + 1)
        panel = table.loc[(dataset, row)]
        for j, (name, values) in enumerate(panel.drop(index=AGGREGATE).iterrows()):
            ax.plot(range(6), values[:6].to_numpy(), marker="o", lw=1, ms=3, color=colours(j % 20), label=name)
        mean = panel.loc[AGGREGATE]
        ax.plot(range(6), mean[:6].to_numpy(), color="black", lw=3, label=f"mean ({mean['mean_1_5']:.1%} over 1-5)")
        ax.set(title=f"{dataset} · {row}", xlabel="severity", ylabel="accuracy", ylim=(0, 1.02))
        ax.set_xticks(range(6), ["clean", "1", "2", "3", "4", "5"])
        ax.yaxis.set_major_formatter(PercentFormatter(1.0))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    return fig


def render_corruptions(frame: pd.DataFrame, out_dir: Path | str, formats: Sequence[str] = ("png", "svg"),
                       baseline: str | None = None) -> list[Path]:
    """Per data set 'corruptions_<dataset>.<fmt>' and its table, '.md' and '.csv' (with `ce` and `mce`
    relative to the model row `baseline` when one is named)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    table = corruption_table(frame)
    if baseline is not None:
        table = with_corruption_errors(table, baseline)
    paths = []
    for dataset in table.index.get_level_values("dataset").unique():
        stem = out_dir / f"corruptions_{slug([dataset])}"
        fig = corruption_figure(table, dataset)
        for fmt in formats:
            fig.savefig(stem.with_suffix(f".{fmt}"), dpi=150)
            paths.append(stem.with_suffix(f".{fmt}"))
        numbers = table.loc[[dataset]]
        caption = (f"Common corruptions · {dataset}: accuracy clean and at severities 1-5; '{AGGREGATE}' is the mean over "
                   "the corruptions, and its mean_1_5 RobustBench's number")
        shown = numbers.map(lambda v: "" if pd.isna(v) else f"{v:.1%}")
        stem.with_suffix(".md").write_text(f"{caption}\n\n{markdown_table(shown)}", encoding="utf-8")
        numbers.to_csv(stem.with_suffix(".csv"))
        paths += [stem.with_suffix(".md"), stem.with_suffix(".csv")]
    return paths
