"""`advbench plot`'s drawing per kind of record, the plotting stack imported only for the kind drawn."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import pandas as pd

from advbench.core.errors import AdvbenchError


def render(kind: str, frame: pd.DataFrame, out_dir: Path, group_by: str, baseline: str | None, console: Any) -> list[Path]:
    """One kind of record's figures and tables (`advbench plot` draws benchmark and corruption records side by side)."""
    if kind == "rd":
        from advbench.quality.stability.report import render_stability

        return render_stability(frame, out_dir)
    if kind == "iqa":
        from advbench.quality.iqa.iqa_report import render_iqa

        return render_iqa(frame, out_dir)
    if kind == "corruption":
        from advbench.robustness.report.corruption_plot import render_corruptions

        return render_corruptions(frame, out_dir, baseline=baseline)
    from advbench.robustness.report.plot import print_tables, render_all
    from advbench.robustness.report.shards import missing_shards, mixed_shards
    from advbench.robustness.report.table3 import summary_table, with_categories

    mixed = mixed_shards(frame)
    if mixed:
        raise AdvbenchError(mixed[0] + (f" (and {len(mixed) - 1} more)" if len(mixed) > 1 else ""))
    for line in missing_shards(frame):
        click.echo(f"warning: {line}", err=True)
    written = render_all(frame, out_dir, group_by=group_by)
    print_tables(summary_table(with_categories(frame)), console, by_category=group_by == "category")
    return written
