"""The evaluation card: everything a reader needs to trust or redo the numbers, as `report.json`.

All of it is read from the records: the model's identity (names, weights key, the digest of
the deployed model), the data (set, sample count, ids), every attack with its parameters,
budget, strength, seed and how its gradients and verdicts were made, the versions (advbench,
torch), the device and precision, when the cells ran and what they cost, and then the results
(worst case, optimality) and signs. Columns older records lack are written as null.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import numpy as np
import pandas as pd

from advbench.core.version import __version__
from advbench.robustness.audit.audit import ModelAudit, ThreatAudit
from advbench.robustness.audit.best_known import measure, robust_accuracy, setter_counts
from advbench.robustness.audit.corruption import corruption_entries, model_key
from advbench.robustness.audit.groups import AttackCell
from advbench.robustness.audit.optimality import area_limit
from advbench.robustness.audit.signs import FAILURE, REMEDIED, WEAK, Sign

FORMAT = 3
"""The version of report.json's layout."""


def _number(value: Any) -> Any:
    """A JSON-safe number: NaN and infinities become null (JSON has neither)."""
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return None if not math.isfinite(float(value)) else float(value)
    return value


def _values(records: pd.DataFrame, column: str) -> list[Any]:
    """The distinct values of a column (null when the records lack it), sorted as text."""
    if column not in records:
        return []
    return sorted({_number(v.item() if hasattr(v, "item") else v) for v in records[column].dropna()}, key=str)


def _one(records: pd.DataFrame, column: str) -> Any:
    found = _values(records, column)
    return found[0] if len(found) == 1 else (found or None)


def _weights(text: Any) -> Any:
    try:
        return json.loads(str(text))
    except ValueError:
        return text


def identity(model: ModelAudit) -> dict[str, Any]:
    """Which model this is: its names, the weights' key and the deployed model's digest."""
    r = model.records
    return {"row": model.row, "dataset": _one(r, "dataset"), "model": _one(r, "model"), "defense": _one(r, "defense"),
            "model_label": _one(r, "model_label"), "defense_category": _one(r, "defense_category"),
            "weights": _weights(_one(r, "weights")), "model_sha256": _one(r, "model_sha256")}


def environment(records: pd.DataFrame) -> dict[str, Any]:
    """Versions, device, precision, when the cells ran and what they cost in all."""
    created = pd.to_datetime(records["created_at"], utc=True) if "created_at" in records else None
    total = {c: _number(records[c].sum()) if c in records else None
             for c in ("grad_evals", "queries", "seconds")}
    return {"advbench_version": _one(records, "advbench_version"), "torch_version": _one(records, "torch_version"),
            "device": _one(records, "device"), "precision": _one(records, "precision"),
            "channels_last": _one(records, "channels_last"), "run_ids": _values(records, "run_id"),
            "created_from": None if created is None else created.min().isoformat(),
            "created_to": None if created is None else created.max().isoformat(),
            "cells": int(records["_cell"].nunique()), "cost": total}


def attack_entry(attack: AttackCell, score: Any, signs: list[Sign]) -> dict[str, Any]:
    """An attack as run (parameters, budget, seed, gradients, votes), how it did against the worst case and
    the signs that show it weak where others covered it."""
    r = attack.records
    cost = {"grad_evals_per_sample": _number(score.grad_evals), "queries_per_sample": _number(score.queries),
            "search_grad_evals_per_sample": _number(r["search_grad_evals"].mean()) if "search_grad_evals" in r else None,
            "search_queries_per_sample": _number(r["search_queries"].mean()) if "search_queries" in r else None,
            "wall_seconds": _number(score.seconds)}
    return {"name": attack.name, "attack": attack.attack, "knowledge": attack.knowledge, "params": attack.params,
            "eps_budget": _one(r, "eps_budget"), "strength_budget": attack.strength_budget,
            "minimizing": attack.minimizing, "seed": _one(r, "seed"), "cells": list(attack.cells),
            "grad_mode": _one(r, "grad_mode"), "judge_draws": _one(r, "judge_draws"),
            # Which rule made the number: the engine's vote over judge_draws passes, or AutoAttack rand's original.
            "judge": attack.params.get("judge", "vote"),
            "flags": {f: bool(r[f].astype(bool).any()) for f in
                      ("flag_zero_grad", "flag_randomized", "flag_probabilities", "flag_dynamic") if f in r},
            "robust_at_budget": _number(score.robust_at_budget),
            "attackbench_optimality": _number(score.attackbench_optimality), "area_gap": _number(score.area_gap),
            "matches_worst_case": score.matches_worst, "cost": cost,
            "weak_signs": [s.code for s in signs if s.level == WEAK and attack.name in s.attacks]}


def curve_points(breaks: np.ndarray) -> list[list[float | None]]:
    """The worst-case curve's corners: (ε, robust accuracy from that ε on), exact as a step function."""
    knots = np.unique(np.concatenate([[0.0], breaks[np.isfinite(breaks)]]))
    return [[_number(e), _number(a)] for e, a in zip(knots, robust_accuracy(breaks, knots))]


def threat_entry(threat: ThreatAudit) -> dict[str, Any]:
    g, case = threat.group, threat.case
    return {"threat": g.threat, "norm": g.norm, "goal": g.goal, "eps_budget": g.eps_budget,
            "verdict": threat.verdict(), "verified": threat.verified, "measure": measure(g.goal),
            "at_budget": threat.value(),
            "n_samples": int(g.sample_ids.size), "samples_left_out": g.dropped,
            "sample_ids": {"first": int(g.sample_ids.min()), "last": int(g.sample_ids.max())},
            "clean_accuracy": _number(float(g.clean.mean())),
            "worst_case": {"robust_at_budget": case.robust_at_budget, "set_by": setter_counts(g, case),
                           "area_limit": area_limit(g), "curve": curve_points(case.breaks),
                           "per_sample": {"sample_id": g.sample_ids.tolist(),
                                          "break_eps": [_number(e) for e in case.breaks],
                                          "broken_at_budget": case.broken_at_budget.tolist(),
                                          "set_by": case.setters.astype(str).tolist()}},
            "rejudged": None if threat.rejudged is None else dataclasses.asdict(threat.rejudged),
            "attacks": [attack_entry(a, s, threat.signs) for a, s in zip(g.attacks, threat.scores)]}


def sign_entry(sign: Any) -> dict[str, Any]:
    out = dataclasses.asdict(sign)
    out["sources"], out["cells"], out["sample_ids"] = list(sign.sources), list(sign.cells), list(sign.sample_ids)
    return out


def model_entry(model: ModelAudit, corruption: dict[str, Any] | None = None) -> dict[str, Any]:
    """The row's card; `corruption`: its common-corruptions aggregate, shown beside the verdicts (no verdict)."""
    r = model.records
    levels = [s.level for s in model.signs]
    return {"row": model.row, "verdicts": model.verdicts(), "corruption": corruption, "failures": levels.count(FAILURE),
            "weak_attacks": levels.count(WEAK), "remedied": levels.count(REMEDIED), "identity": identity(model),
            "data": {"dataset": _one(r, "dataset"), "n_samples": int(r["sample_id"].nunique())},
            "environment": environment(r), "threats": [threat_entry(t) for t in model.threats],
            "signs": [sign_entry(s) for s in model.signs]}


def leaderboard(models: list[ModelAudit]) -> dict[str, list[dict[str, Any]]]:
    """Per threat (data set, norm, goal, budget), the verified model rows ranked by their best-known number
    (most robust first), then the rows with a sign that it is too optimistic, unranked (`rank` null) and
    never above a verified row: a board lists as ranked only numbers its evaluation stands behind."""
    boards: dict[str, list[dict[str, Any]]] = {}
    for model in models:
        for t in model.threats:
            key = f"{_one(model.records, 'dataset')} {t.group.threat}"
            boards.setdefault(key, []).append({
                "row": model.row, "verified": t.verified, "measure": measure(t.group.goal), "at_budget": t.value(),
                "robust_at_budget": t.case.robust_at_budget, "clean_accuracy": float(t.group.clean.mean()),
                "attacks": len(t.group.attacks), "failures": len(t.level(FAILURE))})
    for rows in boards.values():
        rows.sort(key=lambda r: (not r["verified"], -r["robust_at_budget"], r["row"]))
        for rank, row in enumerate(rows, 1):
            row["rank"] = rank if row["verified"] else None
    return dict(sorted(boards.items()))


def verdict_lines(report: dict[str, Any]) -> list[str]:
    """Every model row's verdict lines in the card's order, one per threat, then a randomized row's worst
    cases re-judged and its corruption number where it has them, as `advbench report` prints them."""
    return [line for model in report["models"] for line in
            [*model["verdicts"], *(f"{model['row']} · {t['rejudged']['line']}" for t in model["threats"] if t["rejudged"]),
             *([f"{model['row']} · {model['corruption']['line']}"] if model["corruption"] else [])]]


def card(models: list[ModelAudit], sources: list[str], corruption_records: pd.DataFrame | None = None) -> dict[str, Any]:
    """The report as one JSON-ready dict: its origin, the leaderboard, each model (with its corruption
    aggregate where `corruption_records` hold the same model), then every corruption aggregate found."""
    found = corruption_entries(corruption_records)
    return {"format": FORMAT, "reported_by": f"advbench {__version__}", "records": sources,
            "leaderboard": leaderboard(models),
            "models": [model_entry(m, found.get(model_key(m.threats[0].group.model))) for m in models],
            "corruptions": list(found.values())}
