"""Robustness curves from record frames (pure pandas/numpy); Table 3 is `report.table3`.

The definitions are those of section 4.1 of *Benchmarking Adversarial Robustness*:

* accuracy = share of ALL N samples that the model still classifies correctly;
* untargeted attack success rate = successes among the M clean-correct samples / M;
* targeted attack success rate = successes (prediction == target) / N.

Every curve is built from per-sample thresholds (``min_eps`` for the budget curve,
``first_success_strength`` for the strength and query curves, ``norm_at_<q>`` for the query
checkpoints) by counting how many thresholds lie at or below each x value, so accuracy is
non-increasing and ASR non-decreasing by construction.
A ``min_eps`` of NaN is read like ``inf``: no successful budget was found. ``min_eps`` and
the budgets are compared in float64, the dtype the engine records them in (a sample broken at
the budget has ``min_eps == eps_budget`` exactly), so the budget curve at ε = budget equals
:func:`advbench.robustness.report.table3.summary_table`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Union

import numpy as np
import pandas as pd

from advbench.core.errors import AdvbenchError
from advbench.core.norms import label as norm_label
from advbench.core.norms import names as norm_names
from advbench.core.norms import norm
from advbench.robustness.naming import GOALS, NORM_AT
from advbench.robustness.report.shards import CELL, NAME, NAMED, identify

KNOWLEDGE_ORDER = ("white", "transfer", "score", "decision")
"""Row order of Table 3 (the seed groups attacks by the adversary's knowledge)."""

STRENGTH_UNITS = {"white": "iterations", "transfer": "iterations", "score": "queries", "decision": "queries"}
"""What `first_success_strength` counts, by the adversary's knowledge: score- and decision-based
attacks count every query of the target (the query curve), the others iterations."""
CATEGORY = "defense_category"
"""Record column with the defense's category (the defense YAML's `category:` list, joined)."""

Grid = Union[np.ndarray, Mapping[tuple[str, str], np.ndarray]]

_BUDGET_COLUMNS = [*CELL, "sample_id", "clean_correct", "min_eps", "eps_budget"]
_STRENGTH_COLUMNS = [*CELL, "sample_id", "clean_correct", "first_success_strength", "strength_budget", "eps_budget"]
TABLE_COLUMNS = [*CELL, "sample_id", "label", "adv_pred", "clean_correct", "success_at_budget", "min_eps", "eps_budget"]


def validate_columns(df: pd.DataFrame, needed: list[str], what: str) -> pd.DataFrame:
    """The records with each cell's `row` (see :func:`shards.identify`), after failing early, naming
    every missing column, instead of a KeyError deep inside pandas."""
    missing = sorted(set(needed) - set(df.columns))
    if missing:
        raise AdvbenchError(f"{what} needs record columns {', '.join(missing)}; they are missing")
    if df.empty:
        raise AdvbenchError(f"{what} needs at least one record; the frame is empty")
    bad_goals = sorted(set(df["goal"].unique()) - set(GOALS))
    if bad_goals:
        raise AdvbenchError(f"goal must be one of {', '.join(GOALS)}; records have {', '.join(map(str, bad_goals))}")
    df = identify(df)
    repeated = df.duplicated([*NAMED, "sample_id"])
    if repeated.any():
        first = df.loc[repeated, [*NAME, "sample_id"]].iloc[0]
        raise AdvbenchError(
            f"expected one record per cell and sample, got {int(repeated.sum())} repeats "
            f"(first: {'/'.join(map(str, first))}); pass each run's records once"
        )
    return df


def require_unique(df: pd.DataFrame, column: str) -> None:
    """A cell's budget must be unique, else its curve would mix two different experiments."""
    counts = df.groupby(NAMED)[column].nunique()
    if (counts > 1).any():
        key = counts.index[counts > 1][0]
        values = sorted(df.loc[(df[NAMED] == key).all(axis=1), column].unique().tolist())
        name = dict(zip(NAMED, key))
        raise AdvbenchError(f"expected one {column} per cell, got {values} for {'/'.join(str(name[c]) for c in NAME)}")


def _rates(goal: str, correct: np.ndarray, hits: Callable[[np.ndarray], np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Accuracy and ASR at every x from ``hits(mask)`` = #samples in mask successful by x.

    Targeted accuracy is NaN: a sample whose targeted attack failed may still be
    misclassified, so the accuracy cannot be derived from the success thresholds.
    """
    n = correct.size
    if goal == "untargeted":
        m = int(correct.sum())
        broken = hits(correct)
        asr = broken / m if m else np.full(broken.shape, np.nan)
        return (m - broken) / n, asr
    reached = hits(np.ones(n, dtype=bool))
    return np.full(reached.shape, np.nan), reached / n


def _curves(df: pd.DataFrame, x_name: str, per_cell: Callable[[pd.DataFrame, tuple], tuple[np.ndarray, Callable]],
            band: Callable[[pd.DataFrame, tuple], Callable] | None = None) -> pd.DataFrame:
    """Apply a per-cell (x, hits) builder to every cell and stack the tidy result.

    `band(g, key)`, where given, is a second `hits` at the same x: the curve's other edge,
    written as `accuracy_from_lo` and `asr_from_lo`.
    """
    require_unique(df, "eps_budget")
    parts = []
    for key, g in df.groupby(NAMED, sort=True):
        x, hits = per_cell(g, key)
        goal = key[NAMED.index("goal")]
        correct = g["clean_correct"].to_numpy(bool)
        accuracy, asr = _rates(goal, correct, hits)
        part = pd.DataFrame({x_name: x, "accuracy": accuracy, "asr": asr})
        if band is not None:
            part["accuracy_from_lo"], part["asr_from_lo"] = _rates(goal, correct, band(g, key))
        meta = dict(zip(NAMED, key)) | {"eps_budget": g["eps_budget"].iloc[0], "n_samples": len(g)}
        parts.append(part.assign(**meta))
    out = pd.concat(parts, ignore_index=True)
    edges = ["accuracy_from_lo", "asr_from_lo"] if band is not None else []
    return out[[*NAMED, "eps_budget", "n_samples", x_name, "accuracy", "asr", *edges]]


def whole_norm(norm_name: str) -> bool:
    """Whether the records' norm measures in whole numbers (ℓ0 pixels, patch sides): a budget between two
    whole numbers allows what the lower one does, so its curves are steps at whole budgets only."""
    return norm_name in norm_names() and norm(norm_name).whole


def budget_axis(norm_name: str) -> str:
    """A budget axis's label: '<norm> budget ε', or under a whole norm what its budget counts."""
    return norm(norm_name).axis if whole_norm(norm_name) else f"{norm_label(norm_name)} budget ε"


def budget_grid(norm_name: str, top: float, n: int) -> np.ndarray:
    """Budgets 0 .. `top` for a curve: n evenly spaced, or under a whole norm every whole k up to ⌈top⌉ (the
    accuracy at k is the share of samples with min_eps > k; a fraction would repeat the whole number below)."""
    if whole_norm(norm_name):
        return np.arange(0.0, math.ceil(top) + 1.0)
    return np.linspace(0.0, top, n)


def eps_grid(df: pd.DataFrame, n: int = 101) -> dict[tuple[str, str], np.ndarray]:
    """Budget grid per (dataset, norm): 0 .. max(2 x budget, 99th pct of finite min_eps), n points, or the
    whole numbers there under a whole norm (`budget_grid`).

    Keyed by dataset as well as norm because budgets differ by data set (the seed uses
    8/255 on CIFAR-10 and 16/255 on ImageNet). The budgets themselves are added to the grid
    so every curve has an exact point at its budget.
    """
    df = validate_columns(df, _BUDGET_COLUMNS, "eps grid")
    if n < 2:
        raise AdvbenchError(f"eps grid needs n >= 2 points, got {n}")
    grids = {}
    for key, g in df.groupby(["dataset", "norm"], sort=True):
        eps = g["min_eps"].to_numpy(float)
        finite = eps[np.isfinite(eps)]
        top = max(2.0 * float(g["eps_budget"].max()), float(np.percentile(finite, 99)) if finite.size else 0.0)
        grids[key] = np.union1d(budget_grid(key[1], top, n), g["eps_budget"].unique())
    return grids


def budget_curve(df: pd.DataFrame, grid: Grid | None = None) -> pd.DataFrame:
    """Accuracy / ASR vs. perturbation budget from ``min_eps``, one curve per cell, with the band
    the search's resolution leaves.

    Untargeted: accuracy(ε) = mean over all N of (clean_correct & min_eps > ε);
    ASR(ε) = #(clean_correct & min_eps <= ε) / #clean_correct.
    Targeted: ASR(ε) = mean over all N of (min_eps <= ε); accuracy is NaN because a failed
    targeted attack says nothing about whether the prediction is still the true label.

    The search brackets each sample's minimum ε in (min_eps_lo, min_eps], so the curve from
    ``min_eps`` is one edge of the true curve and ``accuracy_from_lo`` / ``asr_from_lo``, which
    count a sample broken once ε > min_eps_lo, the other: the true curve lies between them. A
    sample without a bracket (NaN ``min_eps_lo``: a minimum-norm attack, a clean input that
    already fools the model, records without the column) adds no width. Drawn as a band, the
    mass of samples the search closes at the budget shows as the resolution it is, not a kink.

    ``grid`` is one array for every cell, or a mapping (dataset, norm) -> array as returned
    by :func:`eps_grid` (the default).
    """
    df = validate_columns(df, _BUDGET_COLUMNS, "budget curve")
    grids = eps_grid(df) if grid is None else grid

    def cell_grid(key: tuple) -> np.ndarray:
        if not isinstance(grids, Mapping):
            return np.unique(np.asarray(grids, dtype=np.float64))
        where = (key[NAMED.index("dataset")], key[NAMED.index("norm")])
        if where not in grids:
            raise AdvbenchError(f"eps grid has no entry for dataset/norm {'/'.join(where)}; it has {sorted(grids)}")
        return np.unique(np.asarray(grids[where], dtype=np.float64))

    def thresholds(g: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        hi = g["min_eps"].to_numpy(np.float64)
        lo = g["min_eps_lo"].to_numpy(np.float64) if "min_eps_lo" in g else np.full(hi.shape, np.nan)
        return np.where(np.isnan(hi), np.inf, hi), lo

    def per_cell(g: pd.DataFrame, key: tuple) -> tuple[np.ndarray, Callable]:
        eps, hi = cell_grid(key), thresholds(g)[0]
        return eps, lambda mask: np.searchsorted(np.sort(hi[mask]), eps, side="right")

    def band(g: pd.DataFrame, key: tuple) -> Callable:
        eps, (hi, lo) = cell_grid(key), thresholds(g)
        bracketed = ~np.isnan(lo)
        # possibly broken at ε: above the largest failing probe, or (no bracket) at min_eps itself
        return lambda mask: (np.searchsorted(np.sort(lo[mask & bracketed]), eps, side="left")
                             + np.searchsorted(np.sort(hi[mask & ~bracketed]), eps, side="right"))

    return _curves(df, "eps", per_cell, band)


def strength_curve(df: pd.DataFrame) -> pd.DataFrame:
    """Accuracy / ASR vs. attack strength 0..strength_budget at the fixed budget.

    A sample counts as broken at strength k when 0 <= first_success_strength <= k
    (0: already adversarial, -1: never). Same accuracy/ASR definitions as
    :func:`budget_curve`, including NaN accuracy for targeted cells.
    """
    df = validate_columns(df, _STRENGTH_COLUMNS, "strength curve")
    require_unique(df, "strength_budget")

    def per_cell(g: pd.DataFrame, key: tuple) -> tuple[np.ndarray, Callable]:
        budget = int(g["strength_budget"].iloc[0])
        first = g["first_success_strength"].fillna(-1).to_numpy(np.int64)

        def hits(mask: np.ndarray) -> np.ndarray:
            found = first[mask & (first >= 0) & (first <= budget)]
            return np.cumsum(np.bincount(found, minlength=budget + 1))

        return np.arange(budget + 1), hits

    out = _curves(df, "strength", per_cell)
    budgets = df.groupby(NAMED)["strength_budget"].first().rename("strength_budget")
    return out.join(budgets, on=NAMED)


def query_unit(df: pd.DataFrame) -> pd.Series:
    """Per record: whether its strength counts queries (score- and decision-based attacks)."""
    return df["knowledge"].map(STRENGTH_UNITS).eq("queries")


def query_curve(df: pd.DataFrame) -> pd.DataFrame:
    """Accuracy / ASR at the budget vs. queries, exact, for score- and decision-based cells.

    `first_success_strength` of these attacks is the number of queries a sample had spent when
    an example within the budget was first found, so a sample counts as broken after q
    queries when 0 <= first_success_strength <= q. The curve is evaluated at 1, every query
    count at which some sample broke, and the budget: drawn as steps it is exact, and on a log
    axis it needs no point at 0. Same accuracy/ASR definitions as :func:`strength_curve`.
    """
    df = validate_columns(df, _STRENGTH_COLUMNS, "query curve")
    other = sorted(df.loc[~query_unit(df), "knowledge"].unique())
    if other:
        raise AdvbenchError(f"query curves take score- and decision-based records; got knowledge {', '.join(other)} "
                            "(their strength counts iterations: use the strength curve)")
    require_unique(df, "strength_budget")

    def per_cell(g: pd.DataFrame, key: tuple) -> tuple[np.ndarray, Callable]:
        budget = int(g["strength_budget"].iloc[0])
        first = g["first_success_strength"].fillna(-1).to_numpy(np.int64)
        found = (first >= 0) & (first <= budget)
        queries = np.union1d([1, max(budget, 1)], first[found & (first >= 1)])
        return queries, lambda mask: np.searchsorted(np.sort(first[mask & found]), queries, side="right")

    out = _curves(df, "queries", per_cell)
    budgets = df.groupby(NAMED)["strength_budget"].first().rename("strength_budget")
    return out.join(budgets, on=NAMED)


def checkpoint_columns(df: pd.DataFrame) -> dict[int, str]:
    """The records' `norm_at_<q>` columns by q, ascending."""
    found = {}
    for column in df.columns:
        tail = str(column)[len(NORM_AT):]
        if str(column).startswith(NORM_AT) and tail.isdigit():
            found[int(tail)] = str(column)
    return dict(sorted(found.items()))


def checkpoint_curve(df: pd.DataFrame) -> pd.DataFrame:
    """Accuracy / ASR at the budget after q queries, from the `norm_at_<q>` checkpoints.

    A sample counts as broken after q queries when its best norm then (threat units) is within
    `eps_budget` and its success is verified (`success_at_budget`), the judgement
    :func:`query_curve` counts by: a randomized model's vote over fresh passes, where the
    attack's checkpoints record what its own single passes saw, lucky draws included. A success
    verified only through the projection of the final example onto the budget ball counts from
    the last query on, as the query curve dates it.
    Only cells whose records all hold a checkpoint use it; cells without any (budgeted attacks)
    are left out, so the frame may be empty. Where both exist, these points lie on
    :func:`query_curve`.
    """
    df = validate_columns(df, [*_BUDGET_COLUMNS, "strength_budget", "success_at_budget"], "checkpoint curve")
    columns = checkpoint_columns(df)
    parts = []
    for key, g in df.groupby(NAMED, sort=True):
        held = {q: c for q, c in columns.items() if g[c].notna().all()}
        if not held:
            continue
        budget = float(g["eps_budget"].iloc[0])
        norms = g[list(held.values())].to_numpy(np.float64)            # (samples, checkpoints)
        spent = np.asarray(list(held)) >= int(g["strength_budget"].iloc[0])
        broken = g["success_at_budget"].to_numpy(bool)[:, None] & ((norms <= budget) | spent[None, :])
        goal = key[NAMED.index("goal")]
        accuracy, asr = _rates(goal, g["clean_correct"].to_numpy(bool), lambda mask: broken[mask].sum(axis=0))
        parts.append(pd.DataFrame({"queries": list(held), "accuracy": accuracy, "asr": asr})
                     .assign(**dict(zip(NAMED, key)), eps_budget=budget, n_samples=len(g)))
    if not parts:
        return pd.DataFrame(columns=[*NAMED, "eps_budget", "n_samples", "queries", "accuracy", "asr"])
    return pd.concat(parts, ignore_index=True)[[*NAMED, "eps_budget", "n_samples", "queries", "accuracy", "asr"]]
