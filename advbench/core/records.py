"""Parquet record store: atomic part files, reading many parts, resume keys.

A part is written to a temporary name in the same folder and renamed, so a killed run never
leaves a half-written file and a rerun can trust that an existing part is complete.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from advbench.core.errors import AdvbenchError


def write_part(frame: pd.DataFrame, path: Path) -> Path:
    """Write `frame` to `path` atomically (temp file + rename)."""
    return write_table(pa.Table.from_pandas(frame, preserve_index=False), path)


def write_table(table: pa.Table, path: Path) -> Path:
    """Write `table` to `path` atomically: `.<name>.<32 hex>.tmp` beside it, then rename.

    A kill can leave the temporary file (never a half-written `path`); `advbench.core.resume`
    removes such leftovers by that name pattern.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        pq.write_table(table, tmp)
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


@dataclass(frozen=True)
class RecordKind:
    """One kind of record file: how to recognise it, what every reader needs, what draws it."""

    name: str
    label: str
    marker: frozenset[str]
    columns: tuple[str, ...]
    numeric: tuple[str, ...]
    drawn_by: str


_CELL = ("dataset", "defense", "attack", "norm", "goal", "knowledge")
RECORD_KINDS: tuple[RecordKind, ...] = (
    RecordKind("rd", "RD records of `advbench uap stability`", frozenset({"target_bitrate_kbps"}),
               ("metric", "video", "amplitude", "target_bitrate_kbps", "real_bitrate_kbps", "metric_score", "psnr"),
               ("amplitude", "target_bitrate_kbps", "real_bitrate_kbps", "metric_score", "psnr"),
               "advbench plot"),
    RecordKind("uap_train", "UAP training records of `advbench uap train`", frozenset({"n_train", "gain"}),
               ("metric", "seed", "n_train", "epochs", "amplitude", "gain"),
               ("seed", "n_train", "epochs", "amplitude", "gain"),
               "advbench uap ablation"),
    RecordKind("uap_eval", "Table-1 records of `advbench uap eval`", frozenset({"uap", "gain"}),
               ("metric", "uap", "attack", "amplitude", "image", "gain"),
               ("amplitude", "image", "gain"),
               ""),
    RecordKind("iqa", "metric-attack records of `advbench iqa run`", frozenset({"score_trace", "higher_better"}),
               ("cell_key", "metric", "attack", "eps", "image_id", "score_clean", "score_attacked", "higher_better",
                "score_trace", "psnr", "ssim"),
               ("eps", "image_id", "score_clean", "score_attacked", "psnr", "ssim"),
               "advbench plot"),
    RecordKind("benchmark", "benchmark records of `advbench run`", frozenset({"min_eps"}),
               (*_CELL, "sample_id", "label", "adv_pred", "clean_correct", "success_at_budget", "min_eps",
                "eps_budget", "first_success_strength", "strength_budget", "adv_norm", "min_eps_source"),
               ("sample_id", "label", "adv_pred", "clean_correct", "success_at_budget", "min_eps", "eps_budget",
                "first_success_strength", "strength_budget", "adv_norm"),
               "advbench plot"),
    RecordKind("corruption", "corruption records of `advbench run threat=corruptions`", frozenset({"min_severity"}),
               ("dataset", "defense", "corruption", "sample_id", "label", "clean_correct", "min_severity",
                *(f"correct_s{s}" for s in range(1, 6))),
               ("sample_id", "label", "min_severity"),
               "advbench plot"),
)
"""The record files advbench writes. `columns` are those the readers (curves, plots, tables)
use, so a part without one of them comes from an older advbench and would be read wrongly.
Benchmark parts need `adv_norm` and `min_eps_source` too: parts without them predate the
current definition of `min_eps` (the smallest probed ε verified to succeed)."""
KINDS_BY_NAME = {k.name: k for k in RECORD_KINDS}


def record_kind(columns: Collection[str]) -> RecordKind | None:
    """The kind whose marker columns a file has, None for a foreign file."""
    return next((k for k in RECORD_KINDS if k.marker <= set(columns)), None)


def check_frame(frame: pd.DataFrame, kind: RecordKind) -> None:
    """Records handed in as a DataFrame, checked as a part file is (`_read_part`): every column the
    kind's readers need, and numbers where numbers belong (a text `min_eps` would fail deep in a reader)."""
    missing = [c for c in kind.columns if c not in frame.columns]
    if missing:
        raise AdvbenchError(f"the records lack column(s) {', '.join(missing)} of {kind.label}")
    for column in kind.numeric:
        values = frame[column]
        if not (pd.api.types.is_numeric_dtype(values) or values.isna().all()):
            raise AdvbenchError(f"column '{column}' of the records holds {values.dtype} values, expected numbers")


def read_records(paths: Iterable[Path | str], kinds: Collection[str] | None = None,
                 skip: Collection[str] = ()) -> pd.DataFrame:
    """Concatenate the parts under `paths` (see `read_kind`)."""
    return read_kind(paths, kinds, skip)[1]


def read_kind(paths: Iterable[Path | str], kinds: Collection[str] | None = None,
              skip: Collection[str] = ()) -> tuple[RecordKind, pd.DataFrame]:
    """Every part under `paths`, all of one kind (one of `kinds` if given), checked file by file.

    Parts of a kind in `skip` are left out (`uap eval` writes its records beside the training
    records). A foreign parquet, a part lacking a column its readers need, a text column
    where numbers belong and a mix of kinds are one-line errors naming the file or folders.
    """
    (name, frame), = read_kinds(paths, kinds, skip, together=()).items()
    return KINDS_BY_NAME[name], frame


def read_kinds(paths: Iterable[Path | str], kinds: Collection[str] | None = None, skip: Collection[str] = (),
               together: Collection[str] = ()) -> dict[str, pd.DataFrame]:
    """The parts under `paths` per kind, checked as `read_kind` does; kinds in `together` may share the
    folders (`advbench report` reads corruption records beside benchmark ones), any other mix is refused."""
    paths = list(paths)
    where = ", ".join(f"'{p}'" for p in paths)
    files = part_files(paths)
    if not files:
        raise AdvbenchError(f"no .parquet record files found in {where}")
    found: dict[str, list[Path]] = {}
    for f in files:
        names = _schema(f).names
        kind = record_kind(names)
        if kind is None:
            shown = ", ".join(names[:6]) + (", ..." if len(names) > 6 else "")
            raise AdvbenchError(f"'{f}' is not an advbench record file (columns: {shown}); move it out of {where}")
        if kind.name not in skip:
            found.setdefault(kind.name, []).append(f)
    if not found:
        raise AdvbenchError(f"no records to read in {where}: only {', '.join(KINDS_BY_NAME[k].label for k in skip)}")
    if kinds is not None and not found.keys() & set(kinds):
        expected = " or ".join(KINDS_BY_NAME[k].label for k in kinds)
        raise AdvbenchError(f"expected {expected} in {where}, found {_describe(found)}")
    if len(found) > 1 and not found.keys() <= set(together):
        raise AdvbenchError(f"{where} mixes record kinds, pass one folder per kind: {_describe(found)}")
    return {name: pd.concat([_read_part(f, KINDS_BY_NAME[name]) for f in parts], ignore_index=True)
            for name, parts in found.items()}


def _schema(path: Path) -> pa.Schema:
    try:
        return pq.read_schema(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise AdvbenchError(f"cannot read record file '{path}': {exc}") from None


def _read_part(path: Path, kind: RecordKind) -> pd.DataFrame:
    """One part, after checking it has the columns and column types its kind's readers need."""
    schema = _schema(path)
    missing = [c for c in kind.columns if c not in schema.names]
    if missing:
        raise AdvbenchError(f"'{path}' lacks column(s) {', '.join(missing)} of {kind.label}: it was written by an "
                            "older advbench; rerun the job that wrote it")
    for column in kind.numeric:
        kind_of_type = schema.field(column).type
        if not (pa.types.is_integer(kind_of_type) or pa.types.is_floating(kind_of_type)
                or pa.types.is_boolean(kind_of_type) or pa.types.is_null(kind_of_type)):
            raise AdvbenchError(f"column '{column}' of '{path}' holds {kind_of_type} values, expected numbers")
    try:
        frame = pq.read_table(path).to_pandas()
    except (pa.ArrowInvalid, OSError) as exc:
        raise AdvbenchError(f"cannot read record file '{path}': {exc}") from None
    _check_cell(path, frame)
    return frame


_KEY_IN_NAME = re.compile(r"_([0-9a-f]{12})\.parquet$")


def _check_cell(path: Path, frame: pd.DataFrame) -> None:
    """A part is one cell: the key its name gives, each sample once, as many as the cell holds.

    Catches a valid part of another cell copied under this name and a part with rows removed,
    which would otherwise be read as this cell's numbers.
    """
    named = _KEY_IN_NAME.search(path.name)
    if named and "cell_key" in frame and set(frame["cell_key"].astype(str)) != {named.group(1)}:
        held = ", ".join(sorted(set(frame["cell_key"].astype(str))))
        raise AdvbenchError(f"'{path}' holds the records of cell {held}, but its name says {named.group(1)}: "
                            "it was copied or renamed; move it out or run the cell again")
    if not {"cell_key", "sample_id", "cell_samples"} <= set(frame.columns):
        return  # older parts, and tables written by hand: the readers' own checks apply
    for key, cell in frame.groupby("cell_key"):
        expected = int(cell["cell_samples"].iloc[0])
        if cell["sample_id"].duplicated().any() or len(cell) != expected:
            raise AdvbenchError(f"'{path}' holds {cell['sample_id'].nunique()} distinct of cell {key}'s {expected} "
                                "samples: rows were removed or repeated; run the cell again")


def _describe(found: dict[str, list[Path]]) -> str:
    """"benchmark records of `advbench run` (3 files) in 'x' (draw with `advbench plot x`); ..."."""
    parts = []
    for name, files in found.items():
        kind = KINDS_BY_NAME[name]
        folder = Path(os.path.commonpath([str(f.parent) for f in files]))
        how = f"draw with `{kind.drawn_by} {folder}`" if kind.drawn_by else "its tables are written beside them"
        parts.append(f"{kind.label} ({len(files)} file{'s' if len(files) > 1 else ''}) in '{folder}' ({how})")
    return "; ".join(parts)
