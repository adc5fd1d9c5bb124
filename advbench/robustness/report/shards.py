"""Cells split into data shards (`shard.index`/`shard.count`): is every shard there?

Each shard of a cell is its own record file (its own resumable unit on a cluster), and the
curves pool a cell's shards by sample. Pooled curves of a cell whose shards are not all done
describe a subset of the samples; `advbench plot` says so instead of passing it off as the
whole split.
"""

from __future__ import annotations

import pandas as pd

from advbench.robustness.report.curves import CELL


def missing_shards(frame: pd.DataFrame) -> list[str]:
    """One line per cell whose records lack some of its shards (records without shard columns: none)."""
    if "shard_count" not in frame.columns or "shard" not in frame.columns:
        return []
    lines = []
    for cell, group in frame.groupby(CELL, sort=True):
        counts = set(group["shard_count"].dropna().astype(int))
        present = set(group["shard"].dropna().astype(int))
        for count in sorted(counts):
            absent = sorted(set(range(count)) - present)
            if absent:
                lines.append(f"{'/'.join(map(str, cell))}: shard(s) {', '.join(map(str, absent))} of {count} "
                             f"have no records yet; its curves cover {count - len(absent)} of {count} shards")
    return lines
