"""The seed's Table 3 from record frames: one tidy row per cell, and its per-threat layout.

Cells read "median min-ε / rate at the budget": robust accuracy for untargeted cells, the
attack success rate for targeted ones (`RATE`), the quantity the figures of the same cell draw.
"""

from __future__ import annotations

import shutil

import numpy as np
import pandas as pd

from advbench.core.catalog import option_data
from advbench.core.errors import AdvbenchError
from advbench.core.keys import plain_value
from advbench.robustness.naming import category_label
from advbench.robustness.report.curves import (
    CATEGORY,
    KNOWLEDGE_ORDER,
    TABLE_COLUMNS,
    require_unique,
    validate_columns,
    whole_norm,
)
from advbench.robustness.report.shards import NAMED, ROW

RATE = {"untargeted": ("accuracy", "accuracy"), "targeted": ("asr", "attack success rate")}
"""What Table 3 and the figures report per goal: (summary column, words). Untargeted cells report
robust accuracy; targeted cells the attack success rate (the share of ALL samples that reach their
target), since a targeted attack that fails may still leave the prediction wrong and the figures
can only draw the success rate (see :func:`budget_curve`)."""

COST_COUNTS = ("grad_evals", "queries")
"""Record counts the summary averages per sample (``<count>_per_sample``): what a cell's numbers
cost, budget run and minimum-ε search together (a minimum-norm attack has no search), so attacks
that reach the same median can be ranked by price."""


class SummaryTable(pd.DataFrame):
    """The frame :func:`summary_table` returns: a plain DataFrame, except that printing it shows
    every column (wrapped to the terminal's width), so `print(advbench.summary(records))` never
    hides ``median_min_eps`` behind ``...``. Anything derived from it is a plain DataFrame."""

    def __repr__(self) -> str:
        width = shutil.get_terminal_size((120, 24)).columns
        with pd.option_context("display.max_columns", None, "display.width", width):
            return super().__repr__()

    def __str__(self) -> str:
        return self.__repr__()


def summary_table(df: pd.DataFrame) -> SummaryTable:
    """The seed's Table 3 as a tidy frame, one row per cell.

    ``median_min_eps``: median over all samples, clean-misclassified samples of untargeted
    cells counting as 0 (they need no perturbation), unfound ones as inf.
    ``accuracy``: mean(adv_pred == label) at the budget (valid for both goals).
    ``asr``: success at the budget, over clean-correct samples (untargeted) or all (targeted).
    Table 3 and the figures report ``accuracy`` for untargeted and ``asr`` for targeted cells
    (:data:`RATE`). Printed, the frame shows every column (:class:`SummaryTable`).
    ``certified_accuracy``: share of samples IBP verifies at the budget (records with a
    ``certified`` column; NaN where IBP does not apply: l2, models it cannot bound).
    ``defense_category`` follows the defense where the records carry it.
    ``grad_evals_per_sample``, ``queries_per_sample``: mean counts per sample (:data:`COST_COUNTS`),
    where the records carry them.
    """
    df = validate_columns(df, TABLE_COLUMNS, "summary table")
    untargeted = df["goal"].eq("untargeted").to_numpy()
    correct = df["clean_correct"].to_numpy(bool)
    thresholds = df["min_eps"].astype(float).fillna(np.inf).to_numpy()
    counted = correct | ~untargeted
    frame = df[NAMED].assign(
        eps_budget=df["eps_budget"],
        min_eps=np.where(untargeted & ~correct, 0.0, thresholds),
        correct_at_budget=(df["adv_pred"] == df["label"]).to_numpy(),
        hit=df["success_at_budget"].to_numpy(bool) & counted,
        counted=counted,
    )
    labels = {}
    if CATEGORY in df.columns:
        frame[CATEGORY] = df[CATEGORY].fillna("").astype(str).to_numpy()
        labels[CATEGORY] = (CATEGORY, "first")
    require_unique(frame, "eps_budget")
    tidy = frame.groupby(NAMED, sort=True).agg(
        **labels,
        eps_budget=("eps_budget", "first"),
        n_samples=("min_eps", "size"),
        median_min_eps=("min_eps", "median"),
        accuracy=("correct_at_budget", "mean"),
        hits=("hit", "sum"),
        counted=("counted", "sum"),
    )
    tidy["asr"] = tidy["hits"] / tidy["counted"].where(tidy["counted"] > 0)
    if "certified" in df.columns:
        tidy["certified_accuracy"] = df.groupby(NAMED, sort=True)["certified"].mean()
    for count in COST_COUNTS:
        if count in df.columns:
            tidy[f"{count}_per_sample"] = df.groupby(NAMED, sort=True)[count].mean()
    return SummaryTable(tidy.drop(columns=["hits", "counted"]).reset_index())


def _knowledge_rank(knowledge: pd.Series) -> pd.Series:
    """Seed order first (white, transfer, score, decision), unknown kinds after it."""
    return knowledge.map({k: i for i, k in enumerate(KNOWLEDGE_ORDER)}).fillna(len(KNOWLEDGE_ORDER))


def _format_cell(median: float, rate: float, whole: bool) -> str:
    """'0.039 / 56.0%' as in the seed; an attack that never succeeded has median ∞; a whole norm's median
    as the count it is ('2 / 35.0%', '2.5' between two)."""
    left = "∞" if np.isinf(median) else f"{median:g}" if whole else f"{median:.3f}"
    return f"{left} / {100.0 * rate:.1f}%"


def format_table3(tidy: pd.DataFrame, by_category: bool = False) -> dict[tuple[str, str], pd.DataFrame]:
    """Lay :func:`summary_table` out like the seed: one string table per (norm, goal).

    Rows are (dataset, knowledge, attack), columns are the model rows (`row`: the defense, or the
    records' model label with it, see :data:`shards.ROW`), cells read
    "median min_eps / accuracy at budget" (untargeted) or "median min_eps / attack success rate at
    budget" (targeted, what its figures draw: :data:`RATE`); a pair that was not run shows "—". `by_category`
    orders the defense columns by category and heads them "defense (category)".
    """
    _validate_tidy(tidy)
    if by_category and CATEGORY not in tidy.columns:
        raise AdvbenchError(f"grouping the table by category needs a {CATEGORY} column in the summary")
    tables = {}
    for key, g in tidy.groupby(["norm", "goal"], sort=True):
        rate = RATE[key[1]][0]
        g = g.assign(cell=[_format_cell(m, a, whole_norm(key[0])) for m, a in zip(g["median_min_eps"], g[rate])])
        g = g.sort_values(["dataset", "knowledge", "attack"], key=lambda s: _knowledge_rank(s) if s.name == "knowledge" else s)
        wide = g.pivot_table(index=["dataset", "knowledge", "attack"], columns=ROW, values="cell", aggfunc="first", sort=False)
        wide.columns.name = None
        if by_category:
            category = g.groupby(ROW)[CATEGORY].first()
            order = sorted(wide.columns, key=lambda d: (category[d], d))
            wide = wide[order].rename(columns=lambda d: f"{d} ({category[d]})" if category[d] else d)
        tables[key] = wide.fillna("—")
    return tables


def _validate_tidy(tidy: pd.DataFrame) -> None:
    """Table formatting takes the output of :func:`summary_table`, not raw records."""
    needed = [*NAMED, "eps_budget", "median_min_eps", "accuracy", "asr"]
    missing = sorted(set(needed) - set(tidy.columns))
    if missing:
        raise AdvbenchError(f"table formatting needs summary_table columns {', '.join(missing)}; they are missing")


def defense_categories(df: pd.DataFrame) -> dict[str, str]:
    """Category of every defense in the records: their `defense_category` column, else the
    `category:` of conf/defense/<defense>.yaml ("uncategorised" for a defense without one)."""
    known: dict[str, str] = {}
    if CATEGORY in df.columns:
        held = df[["defense", CATEGORY]].dropna().astype({CATEGORY: str})
        held = held[held[CATEGORY] != ""].drop_duplicates("defense", keep="last")  # one row per defense
        known = dict(zip(held["defense"], held[CATEGORY]))
    out = {}
    for defense in sorted(df["defense"].unique()):
        if defense not in known:
            data = option_data("defense", defense)
            category = None if data is None else plain_value(data.get("category"))
            known[defense] = category_label(category) or "uncategorised"
        out[defense] = known[defense]
    return out


def with_categories(df: pd.DataFrame) -> pd.DataFrame:
    """The records with `defense_category` filled for every row (see :func:`defense_categories`)."""
    return df.assign(**{CATEGORY: df["defense"].map(defense_categories(df))})
