"""The sign no single cell shows: robust accuracy that rises with the budget or the attack's strength.

Within a cell the budget curve cannot rise (it counts per-sample thresholds), so the check
compares cells: the same attack (name, knowledge, parameters other than its strength) on the
same model and threat at two budgets, or at two strengths (steps, queries) at one budget. A
larger budget or more steps must break at least as many samples; where it breaks fewer, the
attack's optimisation is unreliable (Carlini et al. 2019: "verify that increasing the
distortion bound increases attack success"; Pintor et al. 2022: non-converging attacks).

A sample broken at a smaller ε is breakable at a larger one, so where such a sample survives every
attack of the larger budget's threat, that threat's worst case is too high: a `failure`. Where
other attacks broke it there, the sign only shows the attack weak (`weak_attack`).
"""

from __future__ import annotations

import itertools
import json

import numpy as np

from advbench.robustness.audit.best_known import measure
from advbench.robustness.audit.groups import AttackCell, Group
from advbench.robustness.audit.signs import CARLINI, FAILURE, PINTOR, SHOWN_IDS, WEAK, Sign

STRENGTH_KEYS = ("steps", "n_iter", "iterations", "max_queries", "n_queries", "queries", "max_iter", "n_restarts")
"""Attack parameters that set its strength: two cells differing only in them are one attack at two strengths."""


def _family(attack: AttackCell) -> str:
    """What must agree for two cells to be one attack at two strengths or budgets."""
    params = {k: v for k, v in attack.params.items() if k not in STRENGTH_KEYS}
    return json.dumps([attack.attack, attack.knowledge, params], sort_keys=True, default=str)


def _compare(weak: tuple[Group, AttackCell], strong: tuple[Group, AttackCell], what: str) -> Sign | None:
    """A sign when `strong` (larger budget or strength) leaves more samples robust than `weak`."""
    (wg, wa), (sg, sa) = weak, strong
    ids, wi, si = np.intersect1d(wg.sample_ids, sg.sample_ids, return_indices=True)
    w_success = wg.success[wg.attacks.index(wa)][wi]
    s_success = sg.success[sg.attacks.index(sa)][si]
    if ids.size == 0 or s_success.sum() >= w_success.sum():
        return None
    lost = w_success & ~s_success
    uncovered = lost & ~sg.success.any(axis=0)[si]
    rise = float(w_success.mean() - s_success.mean())
    detail = (f"{measure(sg.goal)} {'rises' if sg.untargeted else 'falls'} by {rise:.1%} from {wa.name} at "
              f"{what(wg, wa)} to {sa.name} at {what(sg, sa)}; {int(lost.sum())} samples broken by the weaker "
              f"setting survive the stronger one, {int(uncovered.sum())} of them every attack at {sg.threat}")
    return Sign("accuracy_rises", "Robust accuracy rises with the budget or the attack's strength",
                FAILURE if uncovered.any() else WEAK, sg.row, sg.threat, detail,
                "the attack does not converge: more steps or restarts, a smaller or adaptive step size, several "
                "random starts; a non-monotone trend also follows from masked or random gradients (BPDA, EOT)",
                (CARLINI, PINTOR), tuple(f"{a.name} [{', '.join(c[:12] for c in a.cells)}]" for a in (wa, sa)),
                tuple(int(i) for i in ids[lost][:SHOWN_IDS]), int(lost.sum()), int(ids.size),
                {"rise": rise, "uncovered": int(uncovered.sum())}, (sa.name,))


def _budget(group: Group, attack: AttackCell) -> str:
    return f"ε={group.eps_budget:g}"


def _strength(group: Group, attack: AttackCell) -> str:
    return f"strength {attack.strength_budget}"


def rising_accuracy(model_groups: list[Group]) -> list[Sign]:
    """Every pair of one attack's cells on one model row where the stronger setting breaks fewer samples."""
    cells: dict[tuple[str, str, str], list[tuple[Group, AttackCell]]] = {}
    for group in model_groups:
        for attack in group.attacks:
            cells.setdefault((group.norm, group.goal, _family(attack)), []).append((group, attack))
    signs = []
    for members in cells.values():
        for one, two in itertools.combinations(members, 2):
            (g1, a1), (g2, a2) = one, two
            if g1.eps_budget != g2.eps_budget and a1.strength_budget == a2.strength_budget:
                ordered, what = sorted((one, two), key=lambda m: m[0].eps_budget), _budget
            elif g1.eps_budget == g2.eps_budget and a1.strength_budget != a2.strength_budget:
                ordered, what = sorted((one, two), key=lambda m: m[1].strength_budget), _strength
            else:
                continue
            sign = _compare(ordered[0], ordered[1], what)
            if sign is not None:
                signs.append(sign)
    return signs
