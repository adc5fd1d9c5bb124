"""Signs that an evaluation failed, each with its evidence, what to do about it and its source.

Every check reads only the records of one model row: its groups (one per threat) and, for
the budget and strength checks, the cells of one attack at several budgets or strengths. The
levels keep apart what a sign says about the model row's number and what it says about one attack:

- `failure`: the worst case itself may be too high (too optimistic), because the attacks it rests
  on could not see the model (masked, random or saturated gradients; test-time optimisation;
  white-box attacks beaten by black-box ones but under ℓ0, AutoAttack's `check_square_sr`) or because samples
  survive every attack at any ε. Only these make a row "not trustworthy";
- `weak_attack`: single attacks are weak where others covered them (an iterative attack beaten
  by FGSM on samples FGSM broke, a minimum-norm attack without an adversarial, no single attack
  near the ensemble): the samples are broken in the worst case, so the attack's score suffers,
  not the row's number. It is shown beside the attack's optimality;
- `remedied`: the model shows a cause of masking but the records say the remedy was applied
  (BPDA, EOT, a vote): worth a look, not a verdict.

A worst case with no sample left robust at the budget cannot be too high, so `settle` turns a
failure there into `weak_attack`. The sources:

- Carlini et al. 2019, *On Evaluating Adversarial Robustness*, the checklist of section 7;
- Pintor et al. 2022, *Indicators of Attack Failure*: unavailable gradients, unstable
  predictions, incomplete optimisation, transfer failure, unconstrained attack failure;
- Croce & Hein 2020, *Reliable evaluation of adversarial robustness with an ensemble of diverse
  parameter-free attacks* (AutoAttack), its warnings (`check_zero_gradients`,
  `check_randomized`, `check_square_sr`, `check_dynamic`) and its ensemble;
- Athalye et al. 2018, *Obfuscated Gradients Give a False Sense of Security* (BPDA, EOT).
- Croce et al. 2022, *Sparse-RS*: under ℓ0 its random search beats the white-box attacks on undefended
  models too, so there a black-box win shows weak white-box attacks, not masking.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from advbench.core.norms import norm
from advbench.robustness.audit.best_known import WorstCase, attack_accuracy_at_budget, measure, shown
from advbench.robustness.audit.groups import AttackCell, Group

CARLINI = "Carlini et al. 2019, On Evaluating Adversarial Robustness, checklist (section 7)"
PINTOR = "Pintor et al. 2022, Indicators of Attack Failure"
AUTOATTACK = "Croce & Hein 2020, AutoAttack's warnings"
ATHALYE = "Athalye et al. 2018, Obfuscated Gradients Give a False Sense of Security"
SPARSE_RS = "Croce et al. 2022, Sparse-RS: a versatile framework for query-efficient sparse black-box adversarial attacks"

FAILURE, WEAK, REMEDIED = "failure", "weak_attack", "remedied"
MIN_SHARE = 0.002
"""A sample-level sign needs more than this share of the samples (AutoAttack warns when Square
breaks more than 0.2 % after the white-box attacks), and at least one sample."""
WORST_GAP = 0.05
"""How far (in accuracy) the worst case may lie below the best single attack before no single
attack can be trusted alone."""
SHOWN_IDS = 20
"""Sample ids an evidence lists; the count says how many there are."""
BLACK_BOX = ("score", "decision", "transfer")


@dataclass(frozen=True)
class Sign:
    """One sign on one model row and threat: what was seen, on which cells and samples, what to do."""

    code: str
    title: str
    level: str
    row: str
    threat: str
    detail: str
    action: str
    sources: tuple[str, ...]
    cells: tuple[str, ...] = ()
    sample_ids: tuple[int, ...] = ()
    count: int = 0
    n_samples: int = 0
    extra: dict = field(default_factory=dict)
    attacks: tuple[str, ...] = ()
    """The attacks the sign shows weak (names within the group), beside whose optimality it is shown."""


def settle(signs: list[Sign], case: WorstCase) -> list[Sign]:
    """The signs of one group with their final level: a failure at a worst case with no sample left robust
    at the budget only shows attacks weak where others covered them, since a 0 % cannot be too high."""
    if case.robust_at_budget > 0:
        return signs
    return [dataclasses.replace(s, level=WEAK, detail=f"{s.detail}; no sample survives the worst case at the "
                                "budget, so its number cannot be too high") if s.level == FAILURE else s
            for s in signs]


def _enough(count: int, total: int) -> bool:
    return count >= 1 and count > MIN_SHARE * total


def _ids(group: Group, mask: np.ndarray) -> tuple[int, ...]:
    return tuple(int(i) for i in group.sample_ids[mask][:SHOWN_IDS])


def _cells(attacks: list[AttackCell]) -> tuple[str, ...]:
    return tuple(f"{a.name} [{', '.join(c[:12] for c in a.cells)}]" for a in attacks)


def _names(attacks: list[AttackCell]) -> tuple[str, ...]:
    return tuple(a.name for a in attacks)


def _beaten(group: Group, code: str, title: str, strong: list[int], weak: list[int], action: str,
            sources: tuple[str, ...], level: str) -> list[Sign]:
    """Samples some `weak` attack broke at the budget while every `strong` attack failed (the `strong`
    attacks are the ones the sign shows weak)."""
    if not strong or not weak:
        return []
    only = group.success[weak].any(axis=0) & ~group.success[strong].any(axis=0)
    count = int(only.sum())
    if not _enough(count, only.size):
        return []
    per = {group.attacks[i].name: int((group.success[i] & only).sum()) for i in weak}
    attacks = [group.attacks[i] for i in weak if per[group.attacks[i].name]] + [group.attacks[i] for i in strong]
    detail = (f"{count} of {only.size} samples broken at the budget by "
              f"{', '.join(f'{k} ({v})' for k, v in per.items() if v)} but by none of "
              f"{', '.join(group.attacks[i].name for i in strong)}")
    return [Sign(code, title, level, group.row, group.threat, detail, action, sources, _cells(attacks),
                 _ids(group, only), count, int(only.size), {"by_attack": per},
                 tuple(group.attacks[i].name for i in strong))]


def single_step_beats_iterative(group: Group, case: WorstCase) -> list[Sign]:
    iterative = [i for i, a in enumerate(group.attacks) if a.iterative]
    single = [i for i, a in enumerate(group.attacks) if a.single_step]
    return _beaten(group, "single_step_beats_iterative", "A single-step attack beats the iterative ones",
                   iterative, single,
                   "the iterative attacks are not converging: run more steps, a larger or adaptive step size "
                   "(APGD), several restarts; check their gradients (BPDA where the model is not differentiable)",
                   (CARLINI, PINTOR), WEAK)


def black_box_beats_white_box(group: Group, case: WorstCase) -> list[Sign]:
    """A failure, but under a norm whose random search beats gradients on any model (ℓ0: `Norm.search_leads`),
    where it shows the white-box attacks weak and the black-box one covering them."""
    white = [i for i, a in enumerate(group.attacks) if a.knowledge == "white"]
    black = [i for i, a in enumerate(group.attacks) if a.knowledge in BLACK_BOX]
    if norm(group.norm).search_leads:
        action, sources, level = (f"under {norm(group.norm).label} random search beats gradients on undefended "
                                  "models too (Sparse-RS over PGD-ℓ0): keep the search in the evaluation; its breaks "
                                  "are in the worst case", (CARLINI, SPARSE_RS), WEAK)
    else:
        action, sources, level = ("the white-box gradients are masked or misleading: attack through BPDA "
                                  "(non-differentiable layers), EOT (randomness), a margin loss on logits; run the "
                                  "ensemble (autoattack)", (CARLINI, PINTOR, AUTOATTACK, ATHALYE), FAILURE)
    return _beaten(group, "black_box_beats_white_box",
                   "A score-based, decision-based or transfer attack beats the white-box ones at the same budget",
                   white, black, action, sources, level)


def not_broken_as_budget_grows(group: Group, case: WorstCase) -> list[Sign]:
    """Samples no attack broke at any ε it tried (the search goes to `search.max_factor` × the budget),
    and samples an unbounded minimum-norm attack returned no adversarial for."""
    signs = []
    unbroken = group.clean & np.isinf(case.breaks) if group.untargeted else np.isinf(case.breaks)
    if _enough(int(unbroken.sum()), unbroken.size):
        signs.append(Sign(
            "accuracy_not_to_zero", "Robust accuracy does not fall towards 0 as the budget grows", FAILURE,
            group.row, group.threat,
            f"{int(unbroken.sum())} of {unbroken.size} samples were broken by no attack at any ε tried",
            "raise the search's max_factor, run an unbounded minimum-norm attack (fmn, ddn, fab): at a large "
            "enough ε every sample must fall; if none does, the attacks' gradients are masked",
            (CARLINI, PINTOR), _cells(list(group.attacks)), _ids(group, unbroken), int(unbroken.sum()),
            int(unbroken.size)))
    for i, attack in enumerate(group.attacks):
        if not attack.minimizing:
            continue
        missed = np.isinf(group.breaks[i]) & (group.clean if group.untargeted else True)
        if _enough(int(missed.sum()), missed.size):
            signs.append(Sign(
                "unbounded_attack_fails", "An unbounded minimum-norm attack did not find an adversarial for every "
                "sample", WEAK, group.row, group.threat,
                f"{attack.name} returned no adversarial example for {int(missed.sum())} of {missed.size} samples",
                "run it with more steps or restarts; a minimum-norm attack without a bound must succeed on every "
                "sample, so a failure means its optimisation (or the model's gradient) failed",
                (PINTOR, CARLINI), _cells([attack]), _ids(group, missed), int(missed.sum()), int(missed.size),
                attacks=(attack.name,)))
    return signs


def _flagged(group: Group, flag: str) -> list[AttackCell]:
    return [a for a in group.attacks if flag in a.records and a.records[flag].astype(bool).any()]


def _grad_modes(attack: AttackCell) -> set[str]:
    return set(attack.records["grad_mode"].astype(str)) if "grad_mode" in attack.records else {"exact"}


def masked_gradients(group: Group, case: WorstCase) -> list[Sign]:
    """Zero or non-finite input gradients in the model as deployed: a failure for white-box cells attacked through
    them, remedied where the records say the gradients were BPDA's."""
    white = [a for a in _flagged(group, "flag_zero_grad") if a.knowledge == "white"]
    naive = [a for a in white if not any("bpda" in m for m in _grad_modes(a))]
    adapted = [a for a in white if a not in naive]
    action = ("attack through BPDA (identity or a smooth approximation backward through the non-differentiable "
              "step), and confirm with score- and decision-based attacks, which need no gradient")
    return [Sign("zero_gradients", "Zero gradients in the deployed model", level, group.row, group.threat,
                 f"flag_zero_grad set (some input gradient exactly zero or not finite) on {', '.join(a.name for a in cells)}; "
                 f"gradients used: {', '.join(sorted(set().union(*map(_grad_modes, cells))))}",
                 action, (AUTOATTACK, PINTOR, ATHALYE), _cells(cells), attacks=_names(cells))
            for level, cells in ((FAILURE, naive), (REMEDIED, adapted)) if cells]


def randomized_without_eot(group: Group, case: WorstCase) -> list[Sign]:
    """Outputs that differ between passes, attacked without EOT gradients or judged by one pass."""
    flagged = _flagged(group, "flag_randomized")
    no_eot = [a for a in flagged if a.knowledge == "white" and not any("eot" in m for m in _grad_modes(a))]
    no_vote = [a for a in flagged if "judge_draws" in a.records and (a.records["judge_draws"] <= 1).any()]
    naive = list(dict.fromkeys(no_eot + no_vote))
    adapted = [a for a in flagged if a not in naive]
    action = ("average gradients over the model's randomness (EOT, eot_samples) and judge every example by a vote "
              "over several passes (judge.draws), or the robustness measured is the noise's")
    return [Sign("randomized_without_eot", "Randomized outputs" + (" judged without EOT or a vote" if level == FAILURE
                                                                   else " (EOT and votes applied)"),
                 level, group.row, group.threat,
                 f"flag_randomized set (two passes differ) on {', '.join(a.name for a in cells)}",
                 action, (AUTOATTACK, PINTOR, ATHALYE), _cells(cells), attacks=_names(cells))
            for level, cells in ((FAILURE, naive), (REMEDIED, adapted)) if cells]


def probabilities_not_logits(group: Group, case: WorstCase) -> list[Sign]:
    flagged = [a for a in _flagged(group, "flag_probabilities") if a.knowledge == "white"]
    if not flagged:
        return []
    return [Sign("probabilities_not_logits", "The model outputs probabilities instead of logits", FAILURE, group.row,
                 group.threat, f"flag_probabilities set (rows in [0, 1] summing to 1) on "
                 f"{', '.join(a.name for a in flagged)}",
                 "attack the logits (remove the final softmax) or a margin loss (DLR, C&W); a softmax saturates and "
                 "flattens the cross-entropy's gradient", (CARLINI, AUTOATTACK), _cells(flagged),
                 attacks=_names(flagged))]


def dynamic_inference(group: Group, case: WorstCase) -> list[Sign]:
    flagged = [a for a in _flagged(group, "flag_dynamic") if a.knowledge == "white"]
    if not flagged:
        return []
    return [Sign("dynamic_inference", "The model optimises at inference", FAILURE, group.row, group.threat,
                 f"flag_dynamic set (a forward pass calls autograd) on {', '.join(a.name for a in flagged)}",
                 "a fixed-model attack does not see through test-time optimisation: attack the whole procedure "
                 "(BPDA over it, EOT over its randomness) or use decision-based attacks", (AUTOATTACK, ATHALYE),
                 _cells(flagged), attacks=_names(flagged))]


def worst_far_below_best(group: Group, case: WorstCase) -> list[Sign]:
    """The worst case lies far below every single attack: no attack alone reached the model's weak spots."""
    if len(group.attacks) < 2:
        return []
    single = attack_accuracy_at_budget(group)
    best = int(np.argmin(single))
    gap = float(single[best] - case.robust_at_budget)
    if gap <= WORST_GAP:
        return []
    extra = group.success.any(axis=0) & ~group.success[best]
    return [Sign("worst_far_below_best", "The worst case lies far below the best single attack", WEAK, group.row,
                 group.threat, f"{measure(group.goal)} at the budget {shown(group.goal, case.robust_at_budget):.1%} "
                 f"over all attacks, {shown(group.goal, single[best]):.1%} for the best single one "
                 f"({group.attacks[best].name}): "
                 f"{int(extra.sum())} samples only other attacks broke",
                 "no single attack is reliable here: report the worst case of an ensemble (autoattack, "
                 "apgd_ensemble) and strengthen the attacks (more steps, restarts, EOT/BPDA)",
                 (AUTOATTACK, CARLINI), _cells([group.attacks[best]]), _ids(group, extra), int(extra.sum()),
                 int(extra.size), {"gap": gap}, (group.attacks[best].name,))]


GROUP_CHECKS = (single_step_beats_iterative, black_box_beats_white_box, not_broken_as_budget_grows,
                masked_gradients, randomized_without_eot, probabilities_not_logits, dynamic_inference,
                worst_far_below_best)
"""The checks that read one group (one model row under one threat)."""
