"""The whole audit of a set of records: per model row and threat, the worst case, each attack's
optimality and every sign, computed once for the card (`card.py`) and the page (`html.py`).

The verdict is per model row and threat, and says one thing: whether the number the row reports
there may be too optimistic (a `failure` sign), or stands (verified). Attacks weak where others
covered them (`weak_attack`) and remedied causes of masking are listed after it, never against it.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from advbench.robustness.audit.best_known import WorstCase, measure, shown, worst_case
from advbench.robustness.audit.groups import Group, groups, prepare
from advbench.robustness.audit.optimality import AttackScore, scores
from advbench.robustness.audit.rejudge import Rejudged, rejudge
from advbench.robustness.audit.signs import FAILURE, GROUP_CHECKS, REMEDIED, WEAK, Sign, settle
from advbench.robustness.audit.trends import rising_accuracy


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'s' if count != 1 else ''}"


def _titles(signs: list[Sign]) -> str:
    return ", ".join(dict.fromkeys(s.title[0].lower() + s.title[1:] for s in signs))


@dataclass(frozen=True, eq=False)
class ThreatAudit:
    """One model row under one threat: its group, worst case, attack scores and signs, and a randomized
    row's worst case re-judged by a fresh vote (None for a deterministic row)."""

    group: Group
    case: WorstCase
    scores: list[AttackScore]
    signs: list[Sign]
    rejudged: Rejudged | None

    def level(self, level: str) -> list[Sign]:
        return [s for s in self.signs if s.level == level]

    @property
    def verified(self) -> bool:
        """No sign that the worst case itself is too optimistic."""
        return not self.level(FAILURE)

    def value(self) -> float:
        """The number the report shows at the budget: robust accuracy, or the targeted ASR."""
        return float(shown(self.group.goal, self.case.robust_at_budget))

    def verdict(self) -> str:
        """One line a reader takes away: the threat's best-known number and whether it may be too optimistic."""
        g = self.group
        wrong = "too high" if g.untargeted else "too low"
        line = f"{g.threat}: {self.value():.1%} best-known {measure(g.goal)}."
        failed = self.level(FAILURE)
        line += (f" Not trustworthy, it may be {wrong}: {_plural(len(failed), 'sign')} ({_titles(failed)})."
                 if failed else f" Verified: no sign that it is {wrong}.")
        weak = self.level(WEAK)
        if weak:
            line += f" Attacks weak where others covered them: {_plural(len(weak), 'sign')} ({_titles(weak)})."
        remedied = self.level(REMEDIED)
        if remedied:
            line += f" {_plural(len(remedied), 'cause')} of masking seen and remedied."
        return line


@dataclass(frozen=True, eq=False)
class ModelAudit:
    """One model row: its records, its threats and the signs found on it."""

    row: str
    records: pd.DataFrame
    threats: list[ThreatAudit]

    @property
    def signs(self) -> list[Sign]:
        return [s for t in self.threats for s in t.signs]

    @property
    def failures(self) -> list[Sign]:
        return [s for s in self.signs if s.level == FAILURE]

    def verdicts(self) -> list[str]:
        """One verdict line per threat, led by the row's name, as `advbench report` prints them."""
        return [f"{self.row} · {t.verdict()}" for t in self.threats]


def _threats(model_groups: list[Group]) -> list[ThreatAudit]:
    """Each group audited; a sign across budgets (`rising_accuracy`) belongs to the threat it names."""
    across = rising_accuracy(model_groups)
    out = []
    for group in model_groups:
        case = worst_case(group)
        signs = [s for check in GROUP_CHECKS for s in check(group, case)]
        signs += [s for s in across if s.threat == group.threat]
        out.append(ThreatAudit(group, case, scores(group, case), settle(signs, case), rejudge(group, case)))
    return out


def audit(frame: pd.DataFrame) -> list[ModelAudit]:
    """Every model row of the records, audited."""
    prepared = prepare(frame)
    by_row: dict[str, list[Group]] = {}
    for group in groups(frame):
        by_row.setdefault(group.row, []).append(group)
    out = []
    for row, model_groups in by_row.items():
        key = model_groups[0].model
        mask = pd.Series(True, index=prepared.index)
        for column, value in key.items():
            if value is not None and column in prepared:
                mask &= prepared[column].astype(str) == value
        out.append(ModelAudit(row, prepared[mask], _threats(model_groups)))
    return out
