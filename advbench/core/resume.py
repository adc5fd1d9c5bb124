"""Resumable cells: one lock per cell, chunks that carry their sample ids, clean-up after kills.

While a cell runs, each finished chunk is a parquet file under `records/.partial/<cell>/`.
A chunk is trusted only for what it proves about itself: it must be readable, carry this
cell's key and advbench version, and hold sample ids of this cell that no other chunk holds.
Anything else (truncated, foreign, from another key or schema) is deleted with a warning and
its samples are computed again. Which samples are missing is decided from the ids, never from
file names, so a rerun with another `chunk_size` neither loses nor duplicates a sample.

Every step that reads or changes a cell's files runs under the cell's lock (`fcntl.flock` on
`records/.locks/<cell>.lock`): a second run of the same cell waits, then finds the part and
skips it. Lock files are never removed (removing one would let two runs hold "the" lock).

None of these files and folders may be a symbolic link (`advbench.core.paths.no_links`): a
link planted as a cell's chunk folder would have the clean-up delete, and the run write, in
the folder it points to. A link is a one-line error naming it; nothing is done through it.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import warnings
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import IO

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from rich.console import Console
from torch.utils.data import Dataset

from advbench.core.download import open_no_follow
from advbench.core.errors import AdvbenchError, AdvbenchWarning, plain_warnings
from advbench.core.paths import no_links, refuse_link
from advbench.core.records import write_table

console = Console(stderr=True)

# `write_part`'s temporary names: `.<file name>.<32 hex>.tmp` beside the target.
_TMP = re.compile(r"^\.(?P<name>.+)\.[0-9a-f]{32}\.tmp$")


_PYTHON_CALLER: ContextVar[bool] = ContextVar("python_caller", default=False)


def warn(message: str) -> None:
    """A line on stderr for the command line; an `AdvbenchWarning` inside `python_warnings`."""
    if _PYTHON_CALLER.get():
        plain_warnings()
        warnings.warn(message, AdvbenchWarning, stacklevel=2)
        return
    console.print(f"[yellow]warning:[/yellow] {message}", soft_wrap=True, markup=True, highlight=False)


@contextmanager
def python_warnings() -> Iterator[None]:
    """Within: `warn` speaks Python's warnings (the API), which a caller can catch or filter."""
    token = _PYTHON_CALLER.set(True)
    try:
        yield
    finally:
        _PYTHON_CALLER.reset(token)


@contextmanager
def file_lock(path: Path, what: str) -> Iterator[None]:
    """Hold an exclusive `flock` on `path` (created if needed); say so when we have to wait."""
    with _open_lock_file(path) as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            console.print(f"[dim]waiting: another run holds {what}[/dim]", soft_wrap=True)
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _open_lock_file(path: Path) -> IO[bytes]:
    """The lock file opened for locking (never through a link); a folder we cannot write to is a one-line error."""
    try:
        refuse_link(path.parent).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise AdvbenchError(f"cannot create the lock file '{path}': {exc.strerror or exc}") from None
    return os.fdopen(open_no_follow(refuse_link(path), append=True), "ab")


def _try_lock(path: Path) -> IO[bytes] | None:
    """An open, locked handle on `path`, or None when another run holds it."""
    fh = _open_lock_file(path)
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.close()
        return None
    return fh


class CellFiles:
    """The files of one cell in a records folder: its part, chunk folder and lock."""

    def __init__(self, part: Path) -> None:
        self.part = part
        self.records_dir = part.parent
        self.partial = self.records_dir / ".partial" / part.stem
        self.lock_path = self.records_dir / ".locks" / f"{part.stem}.lock"
        for path in (self.part, self.partial, self.lock_path):
            no_links(path, self.records_dir)

    def lock(self) -> AbstractContextManager[None]:
        return file_lock(self.lock_path, f"the lock of {self.part.name}")

    def part_is_readable(self) -> bool:
        """A part that exists but cannot be read (e.g. a damaged disk) is not a finished cell."""
        if not self.part.is_file():
            return False
        try:
            pq.read_metadata(self.part)
        except (pa.ArrowInvalid, OSError) as exc:
            warn(f"unreadable records at {self.part} ({exc}); computing the cell again")
            return False
        return True

    def part_holds(self, key: str, ids: list[int]) -> bool:
        """Whether the part holds exactly this cell's records: its key, and each of `ids` once.

        A valid part of another cell copied under this name, or one with rows removed, is not
        a finished cell: it is said in one line and the cell is computed again.
        """
        table = pq.read_table(self.part, columns=[c for c in ("cell_key", "sample_id")
                                                  if c in pq.read_schema(self.part).names])
        held = table.column("cell_key").unique().to_pylist() if "cell_key" in table.column_names else []
        found = sorted(table.column("sample_id").to_pylist()) if "sample_id" in table.column_names else []
        if held != [key]:
            warn(f"records at {self.part} belong to another cell (cell key {', '.join(map(str, held)) or 'none'}, "
                 f"expected {key}); computing the cell again")
            return False
        if found != sorted(ids):
            warn(f"records at {self.part} hold {len(found)} rows for the cell's {len(ids)} samples; "
                 "computing the cell again")
            return False
        return True

    def clear_partial(self) -> None:
        shutil.rmtree(self.partial, ignore_errors=True)

    def remove_orphans(self) -> None:
        """Temporary files a killed write left behind (call under the cell's lock)."""
        for tmp in self.records_dir.glob(f".{self.part.name}.*.tmp"):
            tmp.unlink(missing_ok=True)


def sweep_orphans(records_dir: Path) -> None:
    """Remove what killed runs left for cells nobody is running now.

    Temporary part files go; a `.partial/` folder goes only when its cell's part exists (the
    run was killed between writing the part and removing its chunks). Cells whose lock is
    held are left alone, and so is resumable work of unfinished cells.
    """
    cells = {m["name"][: -len(".parquet")] for f in records_dir.glob(".*.tmp")
             if (m := _TMP.match(f.name)) and m["name"].endswith(".parquet")}
    partial = refuse_link(records_dir / ".partial")
    if partial.is_dir():
        cells |= {d.name for d in partial.iterdir() if d.is_dir() and (records_dir / f"{d.name}.parquet").is_file()}
    for stem in sorted(cells):
        files = CellFiles(records_dir / f"{stem}.parquet")
        handle = _try_lock(files.lock_path)
        if handle is None:
            continue
        try:
            files.remove_orphans()
            if files.part.is_file():
                files.clear_partial()
        finally:
            handle.close()


def sample_ids(eval_set: Dataset) -> list[int]:
    """The data set's sample id of every evaluation position, without decoding images.

    The in-tree sets keep their ids as `sample_ids` (tensor sets) or `ids` (image folders);
    any other data set is read item by item once.
    """
    ids = getattr(eval_set, "sample_ids", None)
    if ids is None:
        ids = getattr(eval_set, "ids", None)
    if ids is None:
        ids = [eval_set[i][2] for i in range(len(eval_set))]  # type: ignore[arg-type]
    return [int(i) for i in ids]


class ChunkStore:
    """The verified chunks of one cell, keyed by sample id.

    `folder` is the cell's `<records>/.partial/<cell>`: it and `.partial` must be real folders
    (or absent), and every entry in it a real file or folder. `expected` are the cell's sample
    ids in evaluation order; `missing()` are positions in it that no trusted chunk covers yet;
    `merged()` is the cell's frame in that order, checked to hold every expected id exactly once.
    """

    def __init__(self, folder: Path, cell_key: str, version: str, expected: list[int]) -> None:
        if len(set(expected)) != len(expected):
            raise AdvbenchError("the data set's sample ids are not unique; records could not be resumed or joined")
        self.folder = no_links(folder, folder.parent.parent)
        self.cell_key = cell_key
        self.version = version
        self.position = {sid: i for i, sid in enumerate(expected)}
        self.tables: dict[Path, pa.Table] = {}
        self.owner: dict[int, Path] = {}
        self.done = np.zeros(len(expected), dtype=bool)
        self.reused: set[Path] = set()
        self.schema: pa.Schema | None = None

    def load(self) -> int:
        """Adopt the trusted chunks a killed run left; delete the rest. Returns samples reused."""
        if not self.folder.is_dir():
            return 0
        for tmp in self.folder.glob(".*.tmp"):
            tmp.unlink(missing_ok=True)
        for path in sorted(self.folder.iterdir()):
            if refuse_link(path).is_dir():
                shutil.rmtree(path, ignore_errors=True)
                continue
            problem = self._adopt(path)
            if problem:
                warn(f"ignoring chunk {path} ({problem}); its samples are computed again")
                path.unlink(missing_ok=True)
        return len(self.owner)

    def _adopt(self, path: Path) -> str | None:
        """Register a chunk file, or say why it cannot be trusted."""
        if path.suffix != ".parquet":
            return "not a parquet chunk"
        try:
            table = pq.read_table(path)
        except (pa.ArrowInvalid, OSError) as exc:
            return f"unreadable: {exc}"
        names = set(table.column_names)
        if not {"sample_id", "cell_key", "advbench_version"} <= names:
            return "not a chunk of advbench records"
        if set(table.column("cell_key").to_pylist()) != {self.cell_key}:
            return "written for another cell"
        if set(table.column("advbench_version").to_pylist()) != {self.version}:
            return "written by another advbench version"
        ids = table.column("sample_id").to_pylist()
        if table.num_rows == 0 or len(set(ids)) != len(ids) or any(i not in self.position for i in ids):
            return "its sample ids are not distinct ids of this cell"
        if any(i in self.owner for i in ids):
            return "its samples are already in another chunk"
        self._register(path, table)
        self.reused.add(path)
        return None

    def _register(self, path: Path, table: pa.Table) -> None:
        self.tables[path] = table
        for sid in table.column("sample_id").to_pylist():
            self.owner[int(sid)] = path
            self.done[self.position[int(sid)]] = True

    def _forget(self, path: Path) -> None:
        table = self.tables.pop(path)
        for sid in table.column("sample_id").to_pylist():
            del self.owner[int(sid)]
            self.done[self.position[int(sid)]] = False
        self.reused.discard(path)
        path.unlink(missing_ok=True)

    def missing(self) -> list[int]:
        """Positions (in `expected` order) that still need computing."""
        return np.flatnonzero(~self.done).tolist()

    def add(self, frame: pd.DataFrame) -> None:
        """Save a freshly computed chunk; reused chunks of a different schema are dropped."""
        table = pa.Table.from_pandas(frame, preserve_index=False)
        ids = [int(i) for i in table.column("sample_id").to_pylist()]
        if any(i not in self.position or i in self.owner for i in ids):
            raise AdvbenchError("internal error: a computed chunk holds samples outside the cell or already done")
        if self.schema is None:
            self.schema = table.schema.remove_metadata()
            for path in [p for p in self.reused if not self.tables[p].schema.remove_metadata().equals(self.schema)]:
                warn(f"ignoring chunk {path} (its columns differ from this version's); its samples are computed again")
                self._forget(path)
        path = self.folder / f"chunk-{self.position[ids[0]]:06d}-{len(ids):05d}.parquet"
        write_table(table, path)
        self._register(path, table)

    def merged(self) -> pd.DataFrame:
        """All chunks as one frame in evaluation order; every expected sample exactly once."""
        if not self.tables:
            raise AdvbenchError("internal error: a cell finished without any records")
        frame = pa.concat_tables(list(self.tables.values()), promote_options="default").to_pandas()
        order = frame["sample_id"].map(self.position)
        frame = frame.iloc[order.argsort(kind="stable")].reset_index(drop=True)
        if frame["sample_id"].tolist() != list(self.position):
            raise AdvbenchError(f"internal error: the chunks of {self.folder} do not cover the cell's samples exactly once")
        return frame
