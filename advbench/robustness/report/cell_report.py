"""What follows a cell's run on the console: its summary line, the warnings its records raised, its gate.

The engine (`evaluation.cell.run_cell`) returns where the records are and what they suggest; the
callers (`advbench run`, `advbench.evaluate`) report here, so that the engine needs nothing of the
readers and the summary line reads its rate from the same `summary_table` as Table 3 and the figures.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
from rich.console import Console

from advbench.core.resume import warn
from advbench.robustness.evaluation.cell import CellRun
from advbench.robustness.report.gate import gate_cell
from advbench.robustness.report.table3 import RATE, summary_table
from advbench.robustness.specs import Thresholds

console = Console(stderr=True)


def report_cell(run: CellRun, gate: Thresholds | None, *, in_sweep: bool = False) -> Path:
    """The lines of a cell just run (none for one found on disk), then its gate; the part's path."""
    if run.frame is not None:
        summarize(run.frame, run.label, run.shown, searched=run.searched)
        for line in run.warnings:
            warn(line)
    gate_cell(gate, run.part, run.label, in_sweep=in_sweep)
    return run.part


def summarize(frame: pd.DataFrame, label: str, out: Path | None, *, searched: bool = True) -> None:
    """One line per cell: clean accuracy; at the budget the rate its Table 3 row and figures give
    (`RATE`: adversarial accuracy untargeted, the attack success rate targeted), read from the
    same summary so the three agree; IBP's certified accuracy where the bound proves a sample
    safe (a model not trained for it certifies none, and a 0% would read as a failure of the
    model rather than of the bound); and the median min-ε where the search measured it (without it a
    broken sample's min_eps is only the budget)."""
    row = summary_table(frame).iloc[0]
    column, words = RATE[row["goal"]]
    rate = f"{'targeted ' if row['goal'] == 'targeted' else 'adversarial '}{words} {row[column]:.1%}"
    proven = row.get("certified_accuracy", math.nan)
    proven = f", certified (IBP bound) {proven:.1%}" if proven > 0 else ""
    median = f"median min-ε {frame['min_eps'].median():.4g}, " if searched else ""
    console.print(f"{label}: clean {frame['clean_correct'].mean():.1%}, {rate}{proven}, "
                  f"{median}{len(frame)} samples" + (f" -> {out}" if out is not None else ""), soft_wrap=True)
