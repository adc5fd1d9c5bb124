"""Which records the audit compares: one model row under one threat, its attacks side by side.

A report judges a model by every attack run on it, so the unit here is not a cell but a
`Group`: the cells of one model (data set, model, defense, weights, label) under one threat
(norm, goal, budget), each cell an `AttackCell` (its shards pooled), aligned on the sample ids
they all hold. Per sample and attack the group keeps the *break ε*: the smallest ε at which the
attack verifiably broke the sample (its `min_eps`; 0 where an untargeted cell found the clean
input already misclassified; inf where nothing was found). Every curve, worst case and sign
of the audit is read from these thresholds, so they agree with `advbench plot`'s budget curves.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass

import numpy as np
import pandas as pd

from advbench.core.errors import AdvbenchError
from advbench.robustness.naming import GOALS, attack_label, row_name

MODEL_KEY = ["dataset", "model", "defense", "weights", "model_label"]
"""What identifies a model row: the same network, weights and name (missing columns are left out)."""
THREAT_KEY = ["norm", "goal", "eps_budget"]
NEEDED = ["dataset", "defense", "attack", "norm", "goal", "knowledge", "sample_id", "clean_correct",
          "success_at_budget", "min_eps", "eps_budget", "strength_budget"]


@dataclass(frozen=True, eq=False)
class AttackCell:
    """One attack's cell within a group: its names, settings and per-sample results (group's order)."""

    name: str
    attack: str
    knowledge: str
    params: dict
    strength_budget: int
    minimizing: bool
    cells: tuple[str, ...]
    records: pd.DataFrame

    @property
    def single_step(self) -> bool:
        """A one-step white-box attack (FGSM): the baseline an iterative attack must beat."""
        return self.knowledge == "white" and self.strength_budget <= 1 and not self.minimizing

    @property
    def iterative(self) -> bool:
        return self.knowledge == "white" and self.strength_budget > 1


@dataclass(frozen=True, eq=False)
class Group:
    """One model row under one threat: its attacks and their break thresholds on common samples."""

    model: dict
    row: str
    norm: str
    goal: str
    eps_budget: float
    sample_ids: np.ndarray
    clean: np.ndarray
    attacks: tuple[AttackCell, ...]
    breaks: np.ndarray
    success: np.ndarray
    dropped: int

    @property
    def threat(self) -> str:
        return f"{self.norm} {self.goal} ε={self.eps_budget:g}"

    @property
    def untargeted(self) -> bool:
        return self.goal == "untargeted"

    def baseline(self) -> float:
        """The share of samples counted robust at ε = 0: clean accuracy, or every sample when targeted."""
        return float(self.clean.mean()) if self.untargeted else 1.0


def _cell_ids(df: pd.DataFrame) -> pd.Series:
    """Each record's cell: its shard group (shards pooled), else its cell key, else its settings."""
    for column in ("shard_group", "cell_key"):
        if column in df:
            return df[column].astype(str)
    parts = [c for c in ("attack", "attack_params", "knowledge", "strength_budget", "seed") if c in df]
    return df[parts].astype(str).agg("|".join, axis=1)


def _params(text: object) -> dict:
    try:
        value = json.loads(str(text))
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _row_name(model: dict) -> str:
    """The model row's name as the figures write it (`naming.row_name`)."""
    return row_name(str(model.get("model_label", model["defense"])), str(model["defense"]))


def prepare(df: pd.DataFrame) -> pd.DataFrame:
    """The records with `_cell` and `_model` columns, after checking what the audit reads."""
    missing = sorted(set(NEEDED) - set(df.columns))
    if missing:
        raise AdvbenchError(f"the report needs record columns {', '.join(missing)}; they are missing")
    if df.empty:
        raise AdvbenchError("the report needs at least one record; there are none")
    bad = sorted(set(df["goal"].astype(str)) - set(GOALS))
    if bad:
        raise AdvbenchError(f"goal must be one of {', '.join(GOALS)}; records have {', '.join(bad)}")
    out = df.reset_index(drop=True).copy()
    if "model_label" not in out:
        out["model_label"] = out["defense"]
    out["model_label"] = out["model_label"].where(out["model_label"].notna(), out["defense"]).astype(str)
    out["_cell"] = _cell_ids(out)
    out["_model"] = out[[c for c in MODEL_KEY if c in out]].astype(str).agg("\x1f".join, axis=1)
    repeated = out.duplicated(["_cell", "sample_id"])
    if repeated.any():
        raise AdvbenchError(f"expected one record per cell and sample, got {int(repeated.sum())} repeats "
                            "(pass each run's records once)")
    return out


def _attack_cells(threat: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """The cells of one group, each with its name: the attack's label, made unique by what differs."""
    cells = [(key, g) for key, g in threat.groupby("_cell", sort=True)]
    labels = [attack_label(str(g["attack"].iloc[0]), _params(g["attack_params"].iloc[0]) if "attack_params" in g else {})
              for _, g in cells]
    names = []
    for label, (key, g) in zip(labels, cells):
        if labels.count(label) == 1:
            names.append(label)
            continue
        twins = [c for lab, c in zip(labels, cells) if lab == label]
        steps = {int(c[1]["strength_budget"].iloc[0]) for c in twins}
        seeds = {str(c[1]["seed"].iloc[0]) for c in twins} if "seed" in g else set()
        tag = (f"strength {int(g['strength_budget'].iloc[0])}" if len(steps) == len(twins) else
               f"seed {g['seed'].iloc[0]}" if len(seeds) == len(twins) else f"cell {key[:8]}")
        names.append(f"{label} ({tag})")
    order = sorted(range(len(cells)), key=lambda i: names[i])
    return [(names[i], cells[i][1]) for i in order]


def _break_eps(records: pd.DataFrame, untargeted: bool) -> np.ndarray:
    """Per sample, the smallest ε this cell broke it at (0: misclassified clean; inf: never)."""
    eps = records["min_eps"].to_numpy(np.float64)
    eps = np.where(np.isnan(eps), np.inf, eps)
    if untargeted:
        eps = np.where(records["clean_correct"].to_numpy(bool), eps, 0.0)
    return eps


def _group(model: dict, threat: pd.DataFrame, norm: str, goal: str, budget: float) -> Group:
    named = _attack_cells(threat)
    common = set.intersection(*(set(g["sample_id"].tolist()) for _, g in named))
    ids = np.array(sorted(common), dtype=np.int64)
    every = set().union(*(set(g["sample_id"].tolist()) for _, g in named))
    if ids.size == 0:
        raise AdvbenchError(f"{_row_name(model)} {norm} {goal} ε={budget:g}: its attacks share no sample ids; "
                            "run them on the same samples")
    attacks, untargeted = [], goal == "untargeted"
    for name, g in named:
        aligned = g.set_index("sample_id").loc[ids].reset_index()
        source = aligned["min_eps_source"].astype(str) if "min_eps_source" in aligned else pd.Series(["search"])
        attacks.append(AttackCell(
            name=name, attack=str(aligned["attack"].iloc[0]), knowledge=str(aligned["knowledge"].iloc[0]),
            params=_params(aligned["attack_params"].iloc[0]) if "attack_params" in aligned else {},
            strength_budget=int(aligned["strength_budget"].iloc[0]), minimizing=bool((source == "norm").all()),
            cells=tuple(sorted(g["_cell"].unique())), records=aligned))
    breaks = np.stack([_break_eps(a.records, untargeted) for a in attacks])
    clean = np.stack([a.records["clean_correct"].to_numpy(bool) for a in attacks]).all(axis=0)
    success = np.stack([a.records["success_at_budget"].to_numpy(bool) for a in attacks])
    if untargeted:
        success |= ~clean[None, :]
    return Group(model=model, row=_row_name(model), norm=norm, goal=goal, eps_budget=float(budget), sample_ids=ids,
                 clean=clean, attacks=tuple(attacks), breaks=breaks, success=success, dropped=len(every) - ids.size)


def groups(df: pd.DataFrame) -> list[Group]:
    """Every (model row, threat) of the records, in a stable order, names made unique across models."""
    df = prepare(df)
    out = []
    for _, model_records in df.groupby("_model", sort=True):
        first = model_records.iloc[0]
        model = {c: (str(first[c]) if c in model_records else None) for c in MODEL_KEY}
        for (norm, goal, budget), threat in model_records.groupby(THREAT_KEY, sort=True):
            out.append(_group(model, threat, str(norm), str(goal), float(budget)))
    return _unique_rows(out)


def _unique_rows(found: list[Group]) -> list[Group]:
    """Rows two models share a name in (another checkpoint) get their weights' key after the name."""
    names: dict[str, set[str]] = {}
    for g in found:
        names.setdefault(g.row, set()).add(str(g.model.get("weights")))
    out = []
    for g in found:
        if len(names[g.row]) > 1:
            text = str(g.model.get("weights"))
            weights = _params(text)
            tag = str(next(iter(weights.values()))) if weights else hashlib.sha256(text.encode()).hexdigest()
            g = dataclasses.replace(g, row=f"{g.row} ({tag[:12]})")
        out.append(g)
    return out
