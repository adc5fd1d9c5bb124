"""Which records form one cell, and what each cell is called.

A cell is identified by its key, not by its names: records of two runs whose names agree (the
quick tour's smoke run and its run with a checkpoint are both `digits/natural/bim linf
untargeted`) are two cells, and the readers draw, tabulate and judge them apart, named by the
setting that differs. A cell split into data shards (`shard.index`/`shard.count`) is one record
file per shard (its own resumable unit on a cluster) and its shards share `shard_group` (the
cell key without the shard), by which the readers pool them. Older parts and frames built by
hand, without keys, are identified by their names.

Pooled curves of a cell whose shards are not all done describe a subset of the samples;
`advbench plot` says so instead of passing it off as the whole split.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pandas as pd

from advbench.robustness.naming import attack_label, row_name

CELL: list[str] = ["dataset", "defense", "attack", "norm", "goal", "knowledge"]
"""Record columns that name a cell; cells of other runs may share them (see `ROW`)."""
ROW = "row"
"""Column the readers add: the name of a cell's model row. The records' `model_label` (`row_name`),
and, where cells of other runs share that name, the setting that tells them apart ('natural (seed=1)')."""
NAMED: list[str] = [*CELL, ROW]
"""What the readers group records by: one group is one cell, its shards pooled."""
NAME: list[str] = ["dataset", ROW, "attack", "norm", "goal", "knowledge"]
"""How messages name a cell: 'digits/natural/bim/linf/untargeted/white'."""

SETTINGS = ("seed", "attack_params", "eps_budget", "strength_budget", "judge_draws", "precision", "channels_last",
            "cell_samples", "shard_count", "model", "weights", "device", "advbench_version")
"""Record columns that name a setting, to say which one differs between cells of one name."""
_ID = "_cell"


def _tagged(frame: pd.DataFrame) -> pd.DataFrame:
    """The records (index reset) with their cell's identity in `_cell` and the row's plain name in `row`.

    The identity is `shard_group` (the shards of one cell share it), else `cell_key`, else ""
    (records without keys: their names alone identify the cell).
    """
    out = frame.reset_index(drop=True)
    ids = pd.Series("", index=out.index, dtype=object)
    for column in ("cell_key", "shard_group"):
        if column in out.columns:
            ids = out[column].astype(object).where(out[column].notna(), ids).astype(str)
    if "attack_params" in out:
        out["attack"] = [attack_label(str(a), _params(str(p))) for a, p in zip(out["attack"], out["attack_params"])]
    defense = out["defense"].astype(str)
    label = out["model_label"].where(out["model_label"].notna(), defense).astype(str) if "model_label" in out else defense
    return out.assign(**{ROW: [row_name(a, b) for a, b in zip(label, defense)], _ID: ids})


def _params(text: str) -> dict:
    """An `attack_params` record (JSON of the attack's parameters) as a dict; other text as one value."""
    try:
        value = json.loads(text)
    except ValueError:
        value = text
    return value if isinstance(value, dict) else {"": value}


def _settings(group: pd.DataFrame) -> pd.DataFrame:
    """One row per cell of `group`, its settings as text, the attack's parameters one column each."""
    first = group.groupby(_ID, sort=True).first()
    table = first[[c for c in SETTINGS if c in first.columns]].astype(str)
    if "attack_params" in table:
        params = pd.DataFrame([_params(text) for text in table.pop("attack_params")], index=table.index)
        params = params.astype(str).add_prefix("attack_params.").rename(columns=lambda c: c.rstrip("."))
        table = params.join(table)  # first: the other settings follow from them (steps -> strength_budget)
    return table


def _clashes(tagged: pd.DataFrame) -> Iterator[tuple[tuple, pd.DataFrame, dict[str, str], list[str]]]:
    """Every name several cells share: the name, its records, a tag per cell and the settings that differ.

    A tag is one differing setting ('steps=10'), else all of them, else the run ('run
    20240101T120000'), else the key ('cell 3f2a…'): the first of these that is different for
    every cell of the name.
    """
    counts = tagged.groupby(NAME, sort=True)[_ID].nunique()
    for name in counts.index[(counts > 1).to_numpy()]:
        group = tagged[(tagged[NAME] == name).all(axis=1)]
        table = _settings(group)
        differ = [c for c in table.columns if table[c].nunique() > 1]
        options = [table[columns].apply(lambda r: ", ".join(f"{c.removeprefix('attack_params.')}={v}"
                                                             for c, v in r.items()), axis=1)
                   for columns in [*([c] for c in differ), differ] if columns]
        if "run_id" in group:
            options.append("run " + group.groupby(_ID, sort=True)["run_id"].first().astype(str))
        options.append("cell " + table.index.to_series())
        tags = next(tag for tag in options if tag.is_unique)
        yield name, group, tags.to_dict(), differ


def identify(frame: pd.DataFrame) -> pd.DataFrame:
    """The records (index reset) with `row`, so that grouping by `NAMED` gives one group per cell."""
    tagged = _tagged(frame)
    rows = tagged[ROW].to_numpy(dtype=object)
    for _, group, tags, _ in _clashes(tagged):
        rows[group.index] = (group[ROW] + " (" + group[_ID].map(tags) + ")").to_numpy()
    return tagged.assign(**{ROW: rows}).drop(columns=_ID)


def _files(group: pd.DataFrame) -> str:
    """The part files of a cell's records by the key that ends their names ('*_3f2a….parquet')."""
    if "cell_key" not in group:
        return "records without cell keys"
    return ", ".join(f"*_{key}.parquet" for key in sorted(group["cell_key"].dropna().astype(str).unique()))


def same_name_cells(frame: pd.DataFrame) -> list[str]:
    """One line per name that cells of several runs share: how each is shown, its files, what differs.

    Such cells are drawn and judged apart; the line is for a user who mixed runs in one folder
    by mistake, and for one who meant it (a `label=` per run names the rows instead).
    """
    lines = []
    for name, group, tags, differ in _clashes(_tagged(frame)):
        cells = sorted(group.groupby(_ID, sort=True), key=lambda item: tags[item[0]])
        shown = " and ".join(f"'{cell[ROW].iloc[0]} ({tags[key]})' ({_files(cell)})" for key, cell in cells)
        why = (f"they differ in {', '.join(differ)}" if differ else
               "no recorded setting differs (another checkpoint, model or data)")
        lines.append(f"{'/'.join(map(str, name))} names {len(tags)} cells, shown as {shown}; {why}; "
                     "give each run its own out_dir, or a label= to compare them")
    return lines


def mixed_shards(frame: pd.DataFrame) -> list[str]:
    """One line per name with shards made with other settings: two or more cells of one name and
    shard count, each lacking shards, are one split run with its settings changed part-way.

    Reading them as two cells would show two incomplete ones; pooling them, two experiments under one name.
    """
    if "shard_group" not in frame.columns or "shard_count" not in frame.columns:
        return []
    tagged = _tagged(frame)
    held = tagged.groupby([*NAME, _ID], sort=True).agg(count=("shard_count", "max"), shards=("shard", "nunique"))
    partial = held[held["shards"] < held["count"]].reset_index()
    lines = []
    for (*name, _), cells in partial.groupby([*NAME, "count"], sort=True):
        if len(cells) < 2:
            continue
        group = tagged[tagged[_ID].isin(cells[_ID])]
        table = _settings(group)
        differ = [c for c in table.columns if table[c].nunique() > 1]
        why = f"{', '.join(differ)} differ" if differ else "their settings differ (data, model or search)"
        lines.append(f"{'/'.join(map(str, name))}: shards made with other settings ({why}; {_files(group)}); "
                     "keep one run's shards per folder")
    return lines


def missing_shards(frame: pd.DataFrame) -> list[str]:
    """One line per cell whose records lack some of its shards (records without shard columns: none)."""
    if "shard_count" not in frame.columns or "shard" not in frame.columns:
        return []
    lines = []
    for cell, group in identify(frame).groupby(NAME, sort=True):
        counts = set(group["shard_count"].dropna().astype(int))
        present = set(group["shard"].dropna().astype(int))
        for count in sorted(counts):
            absent = sorted(set(range(count)) - present)
            if absent:
                lines.append(f"{'/'.join(map(str, cell))}: shard(s) {', '.join(map(str, absent))} of {count} "
                             f"have no records yet; its curves cover {count - len(absent)} of {count} shards")
    return lines
