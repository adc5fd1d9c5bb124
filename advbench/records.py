"""Parquet record store: atomic part files, reading many parts, resume keys.

A part is written to a temporary name in the same folder and renamed, so a killed run never
leaves a half-written file and a rerun can trust that an existing part is complete.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Iterable

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from advbench.errors import AdvbenchError


def write_part(frame: pd.DataFrame, path: Path) -> Path:
    """Write `frame` to `path` atomically (temp file + rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def part_files(paths: Iterable[Path | str]) -> list[Path]:
    """Expand files and folders (recursively) into parquet parts, skipping hidden in-progress chunks."""
    found: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found.extend(sorted(q for q in p.rglob("*.parquet")
                                if not any(part.startswith(".") for part in q.relative_to(p).parts)))
        elif p.is_file():
            found.append(p)
        else:
            raise AdvbenchError(f"no records at '{p}': expected a .parquet file or a folder of them")
    return found


def read_records(paths: Iterable[Path | str]) -> pd.DataFrame:
    """Concatenate every part under `paths`; an unreadable part is a one-line error."""
    files = part_files(paths)
    if not files:
        raise AdvbenchError("no .parquet record files found in " + ", ".join(map(str, paths)))
    frames = []
    for f in files:
        try:
            frames.append(pq.read_table(f).to_pandas())
        except (pa.ArrowInvalid, OSError) as exc:
            raise AdvbenchError(f"cannot read record file '{f}': {exc}") from None
    return pd.concat(frames, ignore_index=True)
