"""One resumable cell, whatever computes it: claim it under its lock, fill it chunk by chunk, write its part.

Both halves' benchmark jobs (`advbench run`, `advbench iqa run`) run their cells through
these two steps, so a skip, a resume after a kill and a rerun beside another run behave the
same everywhere (see `advbench.core.resume` for what each step trusts).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pandas as pd

from advbench.core.records import write_part
from advbench.core.resume import CellFiles, ChunkStore, sweep_orphans


@contextmanager
def claim_cell(part: Path, key: str, ids: list[int], *, force: bool) -> Iterator[CellFiles | None]:
    """Hold the cell's lock; yield None when its part already holds this cell (skip), else its files.

    Leftovers of killed runs are removed first; `force` discards the chunks of an earlier run.
    """
    files = CellFiles(part)
    if part.parent.is_dir():
        sweep_orphans(part.parent)
    with files.lock():
        files.remove_orphans()
        if force:
            files.clear_partial()
        elif files.part_is_readable() and files.part_holds(key, ids):
            files.clear_partial()
            yield None
            return
        yield files


def fill_cell(files: CellFiles, key: str, version: str, ids: list[int], chunk_size: int,
              compute: Callable[[list[int]], pd.DataFrame]) -> pd.DataFrame:
    """Compute the positions of `ids` no trusted chunk holds, `chunk_size` at a time, then write the part.

    `compute(positions)` returns the records of those positions (with `sample_id`, `cell_key`
    and `advbench_version` columns); each chunk is saved before the next starts. The part gets
    a `created_at` column (when its last chunk finished).
    """
    store = ChunkStore(files.partial, key, version, ids)
    store.load()
    while todo := store.missing():
        store.add(compute(todo[:chunk_size]))
    frame = store.merged()
    frame["created_at"] = pd.Timestamp.now(tz="UTC")
    write_part(frame, files.part)
    files.clear_partial()
    return frame
