"""`advbench report`'s analysis on records built by hand: the worst case, the area gap against a
hand computation, and every sign raised on records built to show it and silent on clean ones
(the verdicts and AttackBench's optimality: test_report_verdicts.py)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from audit_records import INF, cell, records

from advbench.core.errors import AdvbenchError
from advbench.robustness.audit.audit import audit
from advbench.robustness.audit.best_known import CLEAN, NONE, robust_accuracy, worst_case
from advbench.robustness.audit.groups import groups
from advbench.robustness.audit.optimality import area_gaps, scores
from advbench.robustness.audit.signs import FAILURE, REMEDIED, WEAK

CLEAN_RECORDS = [
    cell("bim", [0.05, 0.1, 0.15, 0.3], clean=[True, True, True, True]),
    cell("pgd", [0.05, 0.1, 0.15, 0.25]),
    cell("fgsm", [0.1, 0.15, 0.3, 0.4], strength=1),
    cell("square", [0.1, 0.1, 0.2, 0.35], knowledge="score", strength=500),
]


def signs_of(frame: pd.DataFrame) -> list:
    return [s for model in audit(frame) for s in model.signs]


def codes(frame: pd.DataFrame, level: str = FAILURE) -> set[str]:
    return {s.code for s in signs_of(frame) if s.level == level}


def test_clean_records_raise_no_sign() -> None:
    assert signs_of(records(*CLEAN_RECORDS)) == []
    model, = audit(records(*CLEAN_RECORDS))
    assert model.verdicts() == ["natural · linf untargeted ε=0.2: 25.0% best-known robust accuracy. Verified: no sign "
                                "that it is too high."]


def test_worst_case_takes_the_smallest_break_and_names_who_set_it() -> None:
    frame = records(cell("bim", [0.1, 0.3, INF, 0.2], clean=[True, True, True, False]),
                    cell("pgd", [0.2, 0.1, INF, 0.2], clean=[True, True, True, False]))
    group, = groups(frame)
    case = worst_case(group)
    assert case.breaks.tolist() == [0.1, 0.1, INF, 0.0]
    assert case.setters.tolist() == ["bim", "pgd", NONE, CLEAN]
    assert case.robust_at_budget == pytest.approx(0.25, rel=1e-12)  # only the sample nobody broke
    assert robust_accuracy(case.breaks, np.array([0.0, 0.1, 0.5])).tolist() == [0.75, 0.25, 0.25]


def test_the_area_gap_matches_a_hand_computation_on_three_samples() -> None:
    # A breaks at 0.1, 0.3, never; B at 0.2, 0.1, 0.4; worst case 0.1, 0.1, 0.4; E = 0.4, clean area 0.4.
    frame = records(cell("a", [0.1, 0.3, INF]), cell("b", [0.2, 0.1, 0.4]))
    group, = groups(frame)
    case = worst_case(group)
    by_name = {s.name: s for s in scores(group, case)}
    # areas under the curves: worst (0.1+0.1+0.4)/3, A (0.1+0.3+0.4)/3, B (0.2+0.1+0.4)/3
    assert by_name["a"].area_gap == pytest.approx((0.8 / 3 - 0.6 / 3) / 0.4, rel=1e-12)
    assert 1 - by_name["a"].area_gap == pytest.approx(5 / 6, rel=1e-12)
    assert 1 - by_name["b"].area_gap == pytest.approx(11 / 12, rel=1e-12)
    # the same areas by numerical integration of the step curves
    eps = np.linspace(0, 0.4, 400_001)
    worst = np.trapezoid(robust_accuracy(case.breaks, eps), eps)
    for i, attack in enumerate(group.attacks):
        between = np.trapezoid(robust_accuracy(group.breaks[i], eps), eps) - worst
        assert area_gaps(group, case)[i] == pytest.approx(between / 0.4, rel=1e-3)


def test_single_step_beating_iterative_is_a_sign() -> None:
    frame = records(cell("bim", [0.3, 0.1, 0.1]), cell("fgsm", [0.15, 0.2, 0.3], strength=1))
    sign, = [s for s in signs_of(frame) if s.code == "single_step_beats_iterative"]
    assert (sign.level, sign.count, sign.sample_ids, sign.attacks) == (WEAK, 1, (100,), ("bim",))
    assert any("fgsm" in c for c in sign.cells) and "Carlini" in sign.sources[0]


def test_black_box_beating_white_box_is_a_sign() -> None:
    frame = records(cell("pgd", [0.3, 0.3, 0.1]), cell("square", [0.1, 0.15, 0.3], knowledge="score"))
    sign, = [s for s in signs_of(frame) if s.code == "black_box_beats_white_box"]
    assert (sign.count, sign.sample_ids) == (2, (100, 101))
    assert "BPDA" in sign.action


def test_samples_no_attack_breaks_at_any_eps_are_a_sign() -> None:
    frame = records(cell("bim", [0.1, INF, INF]), cell("pgd", [0.1, INF, 0.3]))
    sign, = [s for s in signs_of(frame) if s.code == "accuracy_not_to_zero"]
    assert (sign.count, sign.sample_ids, sign.n_samples) == (1, (101,), 3)


def test_an_unbounded_attack_without_an_adversarial_is_a_sign() -> None:
    frame = records(cell("bim", [0.1, 0.2, 0.3]), cell("fmn", [0.1, INF, 0.3], source="norm"))
    assert codes(frame) == set() and codes(frame, WEAK) == {"unbounded_attack_fails"}
    sign, = signs_of(frame)
    assert sign.sample_ids == (101,) and "fmn" in sign.detail


def test_accuracy_rising_with_budget_is_a_sign() -> None:
    frame = records(cell("bim", [0.05, 0.08, 0.3], budget=0.1), cell("bim", [0.05, 0.3, 0.3], budget=0.2))
    sign, = [s for s in signs_of(frame) if s.code == "accuracy_rises"]
    assert (sign.count, sign.sample_ids, sign.level, sign.threat) == (1, (101,), FAILURE, "linf untargeted ε=0.2")
    assert "ε=0.1" in sign.detail and "ε=0.2" in sign.detail


def test_accuracy_rising_with_strength_is_a_sign() -> None:
    frame = records(cell("bim", [0.05, 0.1, 0.3], strength=10), cell("bim", [0.05, 0.3, 0.3], strength=40))
    assert codes(frame, WEAK) == {"accuracy_rises"}  # the weaker cell of the same threat broke it
    sign, = signs_of(frame)
    assert "strength 10" in sign.detail and "strength 40" in sign.detail


def test_falling_accuracy_with_budget_and_strength_raises_nothing() -> None:
    frame = records(cell("bim", [0.05, 0.15, 0.3], budget=0.1, strength=10),
                    cell("bim", [0.05, 0.15, 0.3], budget=0.2, strength=10),
                    cell("bim", [0.05, 0.12, 0.25], budget=0.2, strength=40))
    assert signs_of(frame) == []


@pytest.mark.parametrize(("flag", "code", "adapted"), [
    ("flag_zero_grad", "zero_gradients", {"grad_mode": "bpda"}),
    ("flag_randomized", "randomized_without_eot", {"grad_mode": "eot", "judge_draws": 10}),
])
def test_masking_is_a_failure_attacked_naively_and_remedied_with_bpda_or_eot(flag: str, code: str,
                                                                            adapted: dict) -> None:
    naive = records(cell("bim", [0.1, 0.2, 0.3], **{flag: True}), cell("pgd", [0.1, 0.2, 0.3], **{flag: True}))
    assert codes(naive) == {code}
    assert codes(naive, REMEDIED) == set()
    fixed = records(cell("bim", [0.1, 0.2, 0.3], **adapted, **{flag: True}))
    assert codes(fixed) == set() and codes(fixed, REMEDIED) == {code}


def test_randomized_outputs_judged_by_one_pass_fail_even_with_eot() -> None:
    frame = records(cell("bim", [0.1, 0.2, 0.3], grad_mode="eot", judge_draws=1, flag_randomized=True))
    assert codes(frame) == {"randomized_without_eot"}


@pytest.mark.parametrize(("flag", "code"), [("flag_probabilities", "probabilities_not_logits"),
                                            ("flag_dynamic", "dynamic_inference")])
def test_probabilities_and_inference_time_optimisation_are_signs(flag: str, code: str) -> None:
    assert codes(records(cell("bim", [0.1, 0.2, 0.3], **{flag: True}))) == {code}


def test_a_worst_case_far_below_every_single_attack_is_a_sign() -> None:
    frame = records(cell("bim", [0.1, 0.1, 0.3, 0.3, 0.1, 0.3]), cell("pgd", [0.3, 0.3, 0.1, 0.1, 0.1, 0.3]))
    sign, = [s for s in signs_of(frame) if s.code == "worst_far_below_best"]
    assert sign.extra["gap"] == pytest.approx(2 / 6, rel=1e-12)
    assert sign.count == 2


def test_model_rows_are_audited_apart() -> None:
    frame = records(*CLEAN_RECORDS, cell("fgsm", [0.1] + [0.3] * 29, strength=1, defense="jpeg"),
                    cell("bim", [0.3] + [0.1] * 29, defense="jpeg"))
    by_row = {m.row: m for m in audit(frame)}
    assert set(by_row) == {"natural", "jpeg"}
    assert by_row["natural"].signs == []
    assert {s.code for s in by_row["jpeg"].signs} == {"single_step_beats_iterative"}
    assert "Verified" in by_row["jpeg"].verdicts()[0] and "Attacks weak where others" in by_row["jpeg"].verdicts()[0]


def test_records_the_report_cannot_read_are_one_line_errors() -> None:
    with pytest.raises(AdvbenchError, match="needs record columns .*min_eps"):
        audit(records(*CLEAN_RECORDS).drop(columns="min_eps"))
    with pytest.raises(AdvbenchError, match="one record per cell and sample"):
        audit(records(CLEAN_RECORDS[0], CLEAN_RECORDS[0]))
    with pytest.raises(AdvbenchError, match="at least one record"):
        audit(CLEAN_RECORDS[0].iloc[:0])
