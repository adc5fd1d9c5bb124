"""A randomized row's worst case re-judged by a fresh vote on each sample's worst example.

On a randomized model each attack's verdict on a sample is a vote over random passes, so the
worst case over attacks, broken when any attack's vote says so, is a union of random verdicts:
a sample that every attack nearly breaks counts broken as soon as one of their votes falls on
the lucky side, and the union's robust accuracy leans low. Each randomized cell records a second
vote on its example (`recheck_fraction`, as many passes, independent draws). Per sample the
report picks the example by the first votes (among the attacks that broke it, else among all,
the one whose first vote came closest to or furthest past the goal) and re-judges that example
by its second vote: the pick cannot bias a vote it never saw. Records without the column get
a line saying so, never a number.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from advbench.robustness.audit.best_known import WorstCase, measure, shown
from advbench.robustness.audit.groups import Group

RECHECK = "recheck_fraction"
"""The record column of the fresh vote: the share of its passes meeting the goal on the recorded example."""


@dataclass(frozen=True)
class Rejudged:
    """A randomized row under one threat: the union's robust share, the re-judged one and where they agree
    (both None where the records hold no fresh vote), and the line the report prints."""

    union: float
    rejudged: float | None
    agreement: float | None
    line: str


def randomized(group: Group) -> bool:
    """Whether any cell of the group judged a randomized model: a fresh vote, a vote of several passes, or
    two passes of the model found to differ (`flag_randomized`)."""
    return any(RECHECK in r and r[RECHECK].notna().any()
               or ("judge_draws" in r and (r["judge_draws"] > 1).any())
               or ("flag_randomized" in r and r["flag_randomized"].astype(bool).any())
               for r in (a.records for a in group.attacks))


def rejudged_broken(success: np.ndarray, first: np.ndarray, fresh: np.ndarray) -> np.ndarray:
    """Per sample (columns), whether the fresh vote breaks the worst example: the attack (row) whose first
    vote `first` is largest among those that broke the sample (`success`), or among all where none did;
    the first such attack in row order on ties."""
    pick = np.argmax(np.where(success.any(axis=0)[None, :] & ~success, -np.inf, first), axis=0)
    return np.take_along_axis(fresh, pick[None, :], axis=0)[0] >= 0.5


def rejudge(group: Group, case: WorstCase) -> Rejudged | None:
    """The re-judged worst case of a randomized group; None for a deterministic one."""
    if not randomized(group):
        return None
    union = case.robust_at_budget
    name = measure(group.goal)
    shown_union = f"{shown(group.goal, union):.1%} {name} by the union of the attacks' votes"
    lacking = sum(not {RECHECK, "adv_fraction"} <= set(a.records) or bool(a.records[RECHECK].isna().any())
                  for a in group.attacks)
    if lacking:
        return Rejudged(union, None, None, f"{group.threat}: {shown_union}, not re-judged: no fresh vote is recorded "
                                           f"(no {RECHECK} in {lacking} of {len(group.attacks)} cells: written before "
                                           "it, or of a model not declared randomized).")
    first = np.stack([a.records["adv_fraction"].to_numpy(np.float64) for a in group.attacks])
    fresh = np.stack([a.records[RECHECK].to_numpy(np.float64) for a in group.attacks])
    broken = rejudged_broken(group.success, first, fresh)
    rejudged, agreement = float((~broken).mean()), float((broken == case.broken_at_budget).mean())
    draws = sorted({int(d) for a in group.attacks for d in a.records["judge_draws"]})
    return Rejudged(union, rejudged, agreement,
                    f"{group.threat}: {shown(group.goal, rejudged):.1%} {name} re-judged by a fresh vote "
                    f"({'/'.join(map(str, draws))} passes) on each sample's worst example, {shown_union}; "
                    f"they agree on {agreement:.1%} of {group.sample_ids.size} samples.")
