"""What a running `iqa run` cell shows: a rich bar on a terminal, and log lines where there is none.

A NIQE cell takes minutes on a CPU; under `-m`, or with stderr sent to a file, a live bar shows
nothing, so a run that is working looked like one that hangs. Off a terminal the cell prints a
line after its first batch and then at most every `every` seconds: rows done of the cell's rows,
and the time elapsed.
"""

from __future__ import annotations

import time
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

LOG_EVERY = 30.0
"""Seconds between two log lines of a cell off a terminal."""


def clock(seconds: float) -> str:
    """Elapsed time as `1m05s` (or `42s`)."""
    minutes, rest = divmod(int(round(seconds)), 60)
    return f"{minutes}m{rest:02d}s" if minutes else f"{rest}s"


class CellProgress:
    """Rows done of one cell: `advance(n)` after each batch; a context manager around the cell's work."""

    def __init__(self, label: str, total: int, console: Console, *, enabled: bool = True,
                 every: float = LOG_EVERY) -> None:
        self.label, self.total, self.console, self.every = label, total, console, every
        self.enabled, self.done, self.start, self.logged = enabled, 0, time.monotonic(), None
        live = enabled and console.is_terminal
        self.bar = Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                            TimeRemainingColumn(), console=console, transient=True, disable=not live)
        self.task = self.bar.add_task("iqa", total=total)

    def __enter__(self) -> CellProgress:
        self.start = time.monotonic()
        self.bar.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.bar.__exit__(kind, value, trace)

    def advance(self, rows: int) -> None:
        """`rows` more rows done: the bar moves, or a log line when the last is `every` seconds old."""
        self.done += rows
        self.bar.advance(self.task, rows)
        now = time.monotonic()
        if self.enabled and not self.console.is_terminal and (self.logged is None or now - self.logged >= self.every
                                                              or self.done >= self.total):
            self.logged = now
            self.console.print(f"{self.label}: {self.done}/{self.total} rows, {clock(now - self.start)} elapsed",
                               soft_wrap=True)
