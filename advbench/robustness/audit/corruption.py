"""The common-corruptions number of a model row, shown beside its ℓp verdicts in the report.

Corruption records (`threat=corruptions`) run no attack, so nothing in them can be too
optimistic the way an attack's number can: the report gives their aggregate, RobustBench's
mean accuracy over corruptions × severities, and no verdict. A row's corruption records are
those of the same model (data set, network, defense, weights and name: `groups.MODEL_KEY`).
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from advbench.robustness.audit.groups import MODEL_KEY
from advbench.robustness.naming import row_name
from advbench.robustness.report.corruption_plot import SEVERITY_COLUMNS

SEVERITIES = SEVERITY_COLUMNS[1:]


def model_key(model: dict[str, Any]) -> tuple[str | None, ...]:
    """The identity a model row and its corruption records share, as text (None where a column is missing)."""
    return tuple(None if model.get(c) is None else str(model[c]) for c in MODEL_KEY)


def _entry(records: pd.DataFrame) -> dict[str, Any]:
    """One model's corruption aggregate: per corruption the mean over severities 1-5, and their mean."""
    first = records.iloc[0]
    label = str(first["model_label"]) if "model_label" in records and pd.notna(first["model_label"]) else None
    per = records.groupby("corruption", sort=True)[list(SEVERITIES)].mean().astype(float)
    mean = float(per.mean(axis=1).mean())
    clean = float(records.groupby("corruption")["clean_correct"].mean().mean())
    row = row_name(label or str(first["defense"]), str(first["defense"]))
    sources = sorted(set(records["corruption_source"].astype(str))) if "corruption_source" in records else []
    line = (f"corruptions: {mean:.1%} mean accuracy over {len(per)} corruption{'s' if len(per) != 1 else ''} "
            f"× {len(SEVERITIES)} severities (clean {clean:.1%}); measured, no attack, no verdict.")
    return {"row": row, "dataset": str(first["dataset"]), "mean_accuracy": mean, "clean_accuracy": clean,
            "corruptions": {name: float(v) for name, v in per.mean(axis=1).items()},
            "severity_accuracy": [float(v) for v in per.mean(axis=0)], "sources": sources,
            "n_samples": int(records["sample_id"].nunique()), "line": line}


def corruption_entries(frame: pd.DataFrame | None) -> dict[tuple[str | None, ...], dict[str, Any]]:
    """Each model's corruption aggregate in the records, keyed by `model_key`; none without records."""
    if frame is None or frame.empty:
        return {}
    frame = frame.assign(model_label=frame["model_label"].where(frame["model_label"].notna(), frame["defense"])
                         if "model_label" in frame else frame["defense"])
    columns = [c for c in MODEL_KEY if c in frame]
    out = {}
    for values, records in frame.groupby(columns, sort=True, dropna=False):
        model = dict(zip(columns, values))
        out[model_key(model)] = _entry(records)
    return out
