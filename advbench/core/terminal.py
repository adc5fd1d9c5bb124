"""Printing rich tables so that no cell is ever cut off.

On a terminal rich fits a table to the window by wrapping cells; words too long for their
column are folded onto the next line instead of ending in "…". Elsewhere (a pipe, a log
file, CI) rich assumes 80 columns and would squeeze or cut wide tables; there nothing limits
the width, so a table is printed at its own width.
"""

from __future__ import annotations

from rich.console import Console
from rich.measure import Measurement
from rich.segment import Segments
from rich.table import Table

_UNLIMITED = 10_000


def print_table(table: Table, console: Console | None = None) -> None:
    """Print `table` whole: wrapped to a terminal's width, at full width anywhere else."""
    console = console or Console()
    for column in table.columns:
        column.no_wrap, column.overflow = False, "fold"
    if console.is_terminal:
        console.print(table)
        return
    natural = Measurement.get(console, console.options.update(max_width=_UNLIMITED), table).maximum
    options = console.options.update_width(max(natural, console.width))
    # Rendered at full width first: `console.print` itself would clamp to the console's width.
    for line in console.render_lines(table, options, new_lines=True):
        console.print(Segments(line), end="", crop=False, soft_wrap=True)
