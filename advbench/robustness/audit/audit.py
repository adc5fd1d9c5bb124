"""The whole audit of a set of records: per model row and threat, the worst case, each attack's
optimality and every sign, computed once for the card (`card.py`) and the page (`html.py`)."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from advbench.robustness.audit.groups import Group, groups, prepare
from advbench.robustness.audit.optimality import AttackScore, scores
from advbench.robustness.audit.signs import FAILURE, GROUP_CHECKS, Sign
from advbench.robustness.audit.trends import rising_accuracy
from advbench.robustness.audit.worst_case import WorstCase, worst_case


@dataclass(frozen=True, eq=False)
class ThreatAudit:
    """One model row under one threat: its group, worst case and attack scores."""

    group: Group
    case: WorstCase
    scores: list[AttackScore]


@dataclass(frozen=True, eq=False)
class ModelAudit:
    """One model row: its records, its threats and the signs found on it."""

    row: str
    records: pd.DataFrame
    threats: list[ThreatAudit]
    signs: list[Sign]

    @property
    def failures(self) -> list[Sign]:
        return [s for s in self.signs if s.level == FAILURE]

    def verdict(self) -> str:
        """One sentence a reader takes away: the best-known robust accuracy and whether to trust it."""
        best = "; ".join(f"{t.group.threat}: {t.case.robust_at_budget:.1%} best-known robust "
                         f"{'accuracy' if t.group.untargeted else 'share (1 − targeted ASR)'}" for t in self.threats)
        failed = self.failures
        if failed:
            names = ", ".join(dict.fromkeys(s.title[0].lower() + s.title[1:] for s in failed))
            return (f"{best}. Not trustworthy: {len(failed)} sign{'s' if len(failed) != 1 else ''} of a failed "
                    f"evaluation ({names}).")
        remedied = [s for s in self.signs if s.level != FAILURE]
        note = f"; {len(remedied)} cause{'s' if len(remedied) != 1 else ''} of masking seen and remedied" \
            if remedied else ""
        return f"{best}. No sign of a failed evaluation{note}."


def audit(frame: pd.DataFrame) -> list[ModelAudit]:
    """Every model row of the records, audited."""
    prepared = prepare(frame)
    by_row: dict[str, list[Group]] = {}
    for group in groups(frame):
        by_row.setdefault(group.row, []).append(group)
    out = []
    for row, model_groups in by_row.items():
        threats, signs = [], []
        for group in model_groups:
            case = worst_case(group)
            threats.append(ThreatAudit(group, case, scores(group, case)))
            signs += [s for check in GROUP_CHECKS for s in check(group, case)]
        signs += rising_accuracy(model_groups)
        key = model_groups[0].model
        mask = pd.Series(True, index=prepared.index)
        for column, value in key.items():
            if value is not None and column in prepared:
                mask &= prepared[column].astype(str) == value
        out.append(ModelAudit(row, prepared[mask], threats, signs))
    return out
