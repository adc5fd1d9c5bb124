"""The best-known robustness of a model: per sample, the worst case over every attack of a threat.

A sample is only as robust as the strongest attack run on it says: its break ε is the smallest
over the attacks (`Group.breaks`), and at the budget it is broken when any attack broke it
there. The robust accuracy of this worst case is the best-known upper bound on the model's true
robust accuracy; each single attack's is larger or equal. Each sample remembers the attack
that set its value, so a reader sees which attacks the bound rests on.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from advbench.robustness.audit.groups import Group
from advbench.robustness.report.curves import budget_grid

MEASURES = {"untargeted": "robust accuracy", "targeted": "targeted ASR"}
"""The one name the report gives the number it reads at the budget, per goal: the names `advbench run`
and `advbench plot` give it (a targeted threat is read as its attack success rate, the share of
samples some attack drove to their target, not as the share that never got there)."""

CLEAN = "clean"
"""Who set the value of a sample the model misclassifies without attack (untargeted)."""
NONE = "none"
"""Who set the value of a sample no attack broke at any ε it tried."""


@dataclass(frozen=True)
class WorstCase:
    """The worst case of one group: per-sample thresholds and setters, and its accuracy at the budget."""

    breaks: np.ndarray
    setters: np.ndarray
    robust_at_budget: float
    broken_at_budget: np.ndarray


def worst_case(group: Group) -> WorstCase:
    """Smallest break ε per sample over the group's attacks, the attack that reached it (the first
    in name order on ties) and the robust accuracy at the budget (no attack succeeded there)."""
    breaks = group.breaks.min(axis=0)
    names = np.array([a.name for a in group.attacks], dtype=object)
    setters = names[group.breaks.argmin(axis=0)]
    setters = np.where(np.isinf(breaks), NONE, setters)
    if group.untargeted:
        setters = np.where(group.clean, setters, CLEAN)
    broken = group.success.any(axis=0)
    return WorstCase(breaks=breaks, setters=setters, robust_at_budget=float((~broken).mean()),
                     broken_at_budget=broken)


def robust_accuracy(breaks: np.ndarray, eps: np.ndarray) -> np.ndarray:
    """Share of samples not broken at each ε: mean(break ε > ε), the budget curve of `advbench plot`.

    For a targeted threat this is the share that never reached its target (1 − targeted ASR).
    """
    ordered = np.sort(breaks)
    return (ordered.size - np.searchsorted(ordered, np.asarray(eps, dtype=np.float64), side="right")) / ordered.size


def measure(goal: str) -> str:
    """What the report calls the number of a threat with this goal."""
    return MEASURES[goal]


def shown(goal: str, robust: float | np.ndarray) -> float | np.ndarray:
    """The number the report shows for a share of samples left robust: itself untargeted, the targeted
    ASR (1 − it) targeted."""
    return robust if goal == "untargeted" else 1.0 - robust


def attack_accuracy_at_budget(group: Group) -> np.ndarray:
    """Each attack's robust accuracy at the budget, in the group's attack order."""
    return (~group.success).mean(axis=1)


def curve_grid(group: Group, n: int = 201) -> np.ndarray:
    """ε from 0 to the larger of twice the budget and the largest finite break ε, with every break
    ε and the budget on it, so steps fall where they are; under a whole norm the whole numbers there
    (`curves.budget_grid`), whose break ε are whole too."""
    finite = group.breaks[np.isfinite(group.breaks)]
    top = max(2.0 * group.eps_budget, float(finite.max()) if finite.size else 0.0)
    return np.union1d(budget_grid(group.norm, top, n), np.concatenate([finite[finite <= top], [group.eps_budget]]))


def setter_counts(group: Group, case: WorstCase) -> dict[str, int]:
    """How many samples each attack set the worst case for (plus `clean` and `none`), largest first."""
    names, counts = np.unique(case.setters.astype(str), return_counts=True)
    return {str(k): int(v) for k, v in sorted(zip(names, counts), key=lambda kv: (-kv[1], kv[0]))}
