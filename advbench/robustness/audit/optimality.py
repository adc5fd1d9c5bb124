"""How far each attack falls short of the worst case, and what it cost.

Two scores, each under its own name:

- `attackbench_optimality`: AttackBench's (Cinà et al. 2024, `eval_optimality` in
  attackbench/AttackBench's analysis/utils.py), exactly: with the reference (the per-sample best
  over every attack: the worst case) and the attack's per-sample distances,

      1 − (A_attack − A_best) / (clean_acc · max_dist − A_best)

  where max_dist is the reference's largest distance, clean_acc the share of nonzero reference
  distances, and A the trapezoid area of the points (d, 1 − share of distances ≤ d) over the sorted
  unique distances d, the attack's clipped at max_dist. The trapezoids join the points by straight
  lines and start at the smallest distance, so on a few samples an attack that breaks a sample
  later than the reference can still score above 1; on AttackBench's 1,000 samples the points are
  dense and this fades. Under a whole norm (ℓ0) too the lines join whole distances, as AttackBench
  scores its ℓ0 attacks; the area gap below is the step curves' own.
- `area_gap`: advbench's own, exact for the step curves the report draws: the area between the
  attack's robust-accuracy-vs-ε curve and the worst case's from 0 to E, over the area under the
  clean accuracy, clean_acc · E. The area under mean(b > ε) from 0 to E is mean(min(b, E)). E is
  the largest finite break ε of any attack in the group (the budget if none). 0 for an attack that
  matches the worst case on every sample, never negative.

AttackBench's minimum-norm attacks break every sample; here a search may break none at any ε it
tried (∞). The attack's ∞ are clipped at max_dist as AttackBench clips every attack distance; a
sample no attack broke has no reference distance, so max_dist is the largest finite one and the
reference's ∞ are clipped there too (both curves then end at 0 at max_dist). With no finite
nonzero reference distance the score is undefined (NaN).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from advbench.robustness.audit.best_known import WorstCase, attack_accuracy_at_budget
from advbench.robustness.audit.groups import Group


@dataclass(frozen=True)
class AttackScore:
    """One attack of a group against the worst case."""

    name: str
    knowledge: str
    robust_at_budget: float
    attackbench_optimality: float
    area_gap: float
    matches_worst: int
    grad_evals: float
    queries: float
    seconds: float


def _trapezoid_area(distances: np.ndarray, max_dist: float) -> float:
    """AttackBench's area: trapezoids over the sorted unique distances (clipped at max_dist) of the points
    (d, 1 − share of distances ≤ d)."""
    values, counts = np.unique(np.minimum(distances, max_dist), return_counts=True)
    robust = 1.0 - counts.cumsum() / distances.size
    return float(np.sum(np.diff(values) * (robust[1:] + robust[:-1]) / 2.0))


def attackbench_optimality(distances: np.ndarray, best: np.ndarray) -> float:
    """AttackBench's optimality of an attack's per-sample distances against the reference `best` (the
    per-sample minimum over every attack); ∞ marks a sample not broken (see the module's text)."""
    distances, best = np.asarray(distances, dtype=np.float64), np.asarray(best, dtype=np.float64)
    finite = best[np.isfinite(best)]
    max_dist = float(finite.max()) if finite.size else 0.0
    if max_dist <= 0.0:
        return float("nan")
    clean_acc = np.count_nonzero(best) / best.size
    best_area = _trapezoid_area(best, max_dist)
    scale = clean_acc * max_dist - best_area
    if scale <= 0.0:
        return float("nan")
    return 1.0 - (_trapezoid_area(distances, max_dist) - best_area) / scale


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
    """Both scores and the cost (mean gradient evaluations and queries per sample, wall seconds) per attack."""
    gaps = area_gaps(group, case)
    at_budget = attack_accuracy_at_budget(group)
    matches = (group.breaks == case.breaks[None, :]).sum(axis=1)
    return [AttackScore(name=a.name, knowledge=a.knowledge, robust_at_budget=float(at_budget[i]),
                        attackbench_optimality=attackbench_optimality(group.breaks[i], case.breaks),
                        area_gap=float(gaps[i]), matches_worst=int(matches[i]),
                        grad_evals=_mean_column(a.records, "grad_evals"), queries=_mean_column(a.records, "queries"),
                        seconds=float(a.records["seconds"].sum()) if "seconds" in a.records else float("nan"))
            for i, a in enumerate(group.attacks)]
