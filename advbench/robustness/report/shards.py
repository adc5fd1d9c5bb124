"""Cells split into data shards (`shard.index`/`shard.count`): is every shard there?

Each shard of a cell is its own record file (its own resumable unit on a cluster), and the
curves pool a cell's shards by sample. Pooled curves of a cell whose shards are not all done
describe a subset of the samples; `advbench plot` says so instead of passing it off as the
whole split.
"""

from __future__ import annotations

import pandas as pd

from advbench.robustness.report.curves import CELL

SETTINGS = ("seed", "attack_params", "eps_budget", "strength_budget", "judge_draws", "precision")
"""Record columns that name a setting, to say which one differs between mixed shards."""


def mixed_shards(frame: pd.DataFrame) -> list[str]:
    """One line per cell whose shards were made with other settings (their keys minus the shard differ).

    Pooling them would mix two experiments under one cell's name.
    """
    if "shard_group" not in frame.columns:
        return []
    lines = []
    for cell, group in frame.groupby(CELL, sort=True):
        if group["shard_group"].nunique() > 1:
            differ = [c for c in SETTINGS if c in group and group[c].astype(str).nunique() > 1]
            why = f"{', '.join(differ)} differ" if differ else "their settings differ (data, model or search)"
            lines.append(f"{'/'.join(map(str, cell))}: shards made with other settings are pooled ({why}); "
                         "keep one run's shards per folder")
    return lines


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
