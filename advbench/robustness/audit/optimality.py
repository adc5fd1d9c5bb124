"""How far each attack falls short of the worst case, and what it cost (AttackBench's optimality).

AttackBench (Cinà et al. 2024) scores an attack by the area between its robust-accuracy-vs-ε
curve and the best-known (worst-case) curve, normalised by the area under the clean accuracy up
to the largest ε: 0 for an attack that matches the worst case on every sample, up to 1 for one
that breaks nothing the others break. Reported here as optimality = 1 − that gap.

The curves are step functions of the per-sample break ε, so the areas are exact, not sampled:
the area under mean(b > ε) from 0 to E is mean(min(b, E)). E is the largest finite break ε of
any attack in the group (where the worst case has reached its floor), the budget if none.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from advbench.robustness.audit.groups import Group
from advbench.robustness.audit.worst_case import WorstCase, attack_accuracy_at_budget


@dataclass(frozen=True)
class AttackScore:
    """One attack of a group against the worst case."""

    name: str
    knowledge: str
    robust_at_budget: float
    optimality: float
    area_gap: float
    matches_worst: int
    grad_evals: float
    queries: float
    seconds: float


def area_limit(group: Group) -> float:
    """E: the largest finite break ε of the group's attacks, else the budget."""
    finite = group.breaks[np.isfinite(group.breaks)]
    return float(finite.max()) if finite.size and finite.max() > 0 else group.eps_budget


def area_under(breaks: np.ndarray, limit: float) -> float:
    """∫_0^limit of the robust-accuracy curve mean(breaks > ε) dε, exactly."""
    return float(np.minimum(breaks, limit).mean())


def area_gaps(group: Group, case: WorstCase) -> np.ndarray:
    """Each attack's area between its curve and the worst case's over the clean area, in attack order."""
    limit = area_limit(group)
    clean_area = group.baseline() * limit
    worst = area_under(case.breaks, limit)
    areas = np.minimum(group.breaks, limit).mean(axis=1)
    if clean_area <= 0:
        return np.zeros(len(group.attacks))
    return (areas - worst) / clean_area


def _mean_column(records, column: str) -> float:
    return float(records[column].mean()) if column in records else float("nan")


def scores(group: Group, case: WorstCase) -> list[AttackScore]:
    """Optimality and cost (mean gradient evaluations and queries per sample, wall seconds) per attack."""
    gaps = area_gaps(group, case)
    at_budget = attack_accuracy_at_budget(group)
    matches = (group.breaks == case.breaks[None, :]).sum(axis=1)
    return [AttackScore(name=a.name, knowledge=a.knowledge, robust_at_budget=float(at_budget[i]),
                        optimality=float(1.0 - gaps[i]), area_gap=float(gaps[i]), matches_worst=int(matches[i]),
                        grad_evals=_mean_column(a.records, "grad_evals"), queries=_mean_column(a.records, "queries"),
                        seconds=float(a.records["seconds"].sum()) if "seconds" in a.records else float("nan"))
            for i, a in enumerate(group.attacks)]
