"""What `advbench report` concludes: a verdict that says whether a row's number may be too optimistic
(signs of single attacks weak where others covered them never make a row untrustworthy, nor does
anything a worst case of 0 % shows), a leaderboard that ranks only verified rows, AttackBench's
optimality against values worked by hand from its definition, and one name per number on the
page and the console."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from audit_records import INF, cell, records
from click.testing import CliRunner

from advbench.cli.main import main
from advbench.core.records import write_part
from advbench.robustness.audit.audit import ThreatAudit, audit
from advbench.robustness.audit.best_known import worst_case
from advbench.robustness.audit.card import card, verdict_lines
from advbench.robustness.audit.figures import drawn_curve
from advbench.robustness.audit.groups import groups
from advbench.robustness.audit.html import page
from advbench.robustness.audit.optimality import attackbench_optimality, scores
from advbench.robustness.audit.signs import FAILURE, REMEDIED, WEAK
from advbench.robustness.report.curves import budget_curve

RANDOM = {"defense": "rp", "grad_mode": "eot", "judge_draws": 20, "flag_randomized": True}


def rp_like(fmn_last: list[float]) -> pd.DataFrame:
    """R&P's pattern on six samples at ε = 0.2: FGSM breaks a sample BIM and FMN leave, FMN returns no adversarial
    for two samples BIM breaks, and the worst case lies far below BIM; `fmn_last` sets FMN on samples 4 and 5."""
    return records(cell("bim", [0.3, 0.1, 0.1, 0.1, 0.3, 0.1], **RANDOM),
                   cell("fgsm", [0.15, 0.3, 0.3, 0.3, 0.3, 0.3], strength=1, **RANDOM),
                   cell("fmn", [0.3, INF, INF, 0.05, *fmn_last], source="norm", **RANDOM))


def only_threat(frame: pd.DataFrame, row: str) -> ThreatAudit:
    threat, = next(m for m in audit(frame) if m.row == row).threats
    return threat


def test_a_worst_case_of_zero_with_weak_attacks_is_verified() -> None:
    threat = only_threat(rp_like([0.2, 0.3]), "rp")
    assert threat.case.robust_at_budget == 0.0
    assert {s.code for s in threat.level(WEAK)} == {"single_step_beats_iterative", "unbounded_attack_fails",
                                                     "worst_far_below_best"}
    assert threat.level(FAILURE) == [] and threat.verified
    assert {s.code for s in threat.level(REMEDIED)} == {"randomized_without_eot"}
    assert threat.verdict().startswith("linf untargeted ε=0.2: 0.0% best-known robust accuracy. Verified: no sign "
                                       "that it is too high. Attacks weak where others covered them: 3 signs")


def test_signs_of_weak_attacks_leave_a_row_with_survivors_verified_too() -> None:
    threat = only_threat(rp_like([0.3, 0.3]), "rp")  # sample 4 now survives every attack
    assert threat.case.robust_at_budget == pytest.approx(1 / 6, rel=1e-12)
    assert threat.verified and {s.code for s in threat.level(WEAK)} >= {"single_step_beats_iterative",
                                                                        "unbounded_attack_fails"}


@pytest.mark.parametrize(("square", "survivors"), [([0.1, 0.3, 0.3, 0.3], True), ([0.1, 0.1, 0.3, 0.1], False)])
def test_masked_gradients_fail_a_row_only_while_samples_survive(square: list[float], survivors: bool) -> None:
    frame = records(cell("pgd", [0.3, 0.3, 0.1, 0.3], flag_zero_grad=True),
                    cell("square", square, knowledge="score", strength=500))
    threat = only_threat(frame, "natural")
    failed = {"zero_gradients", "black_box_beats_white_box"}
    assert {s.code for s in threat.level(FAILURE)} == (failed if survivors else set())
    assert failed <= {s.code for s in threat.level(WEAK)} or survivors
    assert threat.verified is not survivors
    assert ("Not trustworthy, it may be too high: 2 signs" in threat.verdict()) is survivors
    assert all("cannot be too high" in s.detail for s in threat.level(WEAK) if s.code in failed)


def test_accuracy_rising_with_the_budget_fails_the_larger_budget_only_where_no_attack_covers_it() -> None:
    rising = [cell("bim", [0.05, 0.08, 0.3], budget=0.1), cell("bim", [0.05, 0.3, 0.3], budget=0.2)]
    model, = audit(records(*rising))
    small, large = model.threats
    assert small.signs == [] and [(s.code, s.level) for s in large.signs] == [("accuracy_rises", FAILURE)]
    assert "Not trustworthy" in large.verdict() and small.verified
    model, = audit(records(*rising, cell("pgd", [0.3, 0.15, 0.3], budget=0.2)))  # pgd breaks the sample bim lost
    sign, = [s for s in model.threats[1].signs if s.code == "accuracy_rises"]
    assert (sign.code, sign.level, sign.extra["uncovered"]) == ("accuracy_rises", WEAK, 0)
    assert model.threats[1].verified


def test_a_weak_attack_sign_is_shown_beside_that_attacks_optimality() -> None:
    report = card(audit(rp_like([0.2, 0.3])), [])
    attacks = {a["name"]: a["weak_signs"] for a in report["models"][0]["threats"][0]["attacks"]}
    assert attacks == {"bim": ["single_step_beats_iterative", "worst_far_below_best"],
                       "fgsm": [], "fmn": ["single_step_beats_iterative", "unbounded_attack_fails"]}
    html = page(report, {"rp": ["data:image/png;base64,"]})
    assert "single_step_beats_iterative, unbounded_attack_fails</td>" in html


def leaderboard_records(goal: str = "untargeted") -> pd.DataFrame:
    """Three rows: pgd_at (2 of 4 survive), natural (1 of 4) and a naive jpeg (3 of 4, with masked gradients)."""
    return records(cell("pgd", [0.1, 0.1, 0.3, 0.3], defense="pgd_at", goal=goal),
                   cell("pgd", [0.1, 0.1, 0.1, 0.3], goal=goal),
                   cell("pgd", [0.3, 0.3, 0.3, 0.1], defense="jpeg", flag_zero_grad=True, goal=goal))


def test_the_leaderboard_ranks_verified_rows_and_lists_flagged_ones_apart_below_them() -> None:
    board, = card(audit(leaderboard_records()), [])["leaderboard"].values()
    assert [(r["rank"], r["row"], r["verified"]) for r in board] == [(1, "pgd_at", True), (2, "natural", True),
                                                                      (None, "jpeg", False)]
    assert board[2]["at_budget"] > board[0]["at_budget"]  # the highest number, yet below every verified row
    report = card(audit(leaderboard_records()), [])
    html = page(report, {m["row"]: [""] for m in report["models"]})
    board_html = html[html.index("<h2>Leaderboard"):html.index('<h2 id="')]
    assert (board_html.index(">pgd_at<") < board_html.index(">natural<") < board_html.index("Not ranked")
            < board_html.index(">⚠ jpeg<"))


def test_a_targeted_board_ranks_by_the_targeted_asr_lowest_first() -> None:
    report = card(audit(leaderboard_records("targeted")), [])
    board, = report["leaderboard"].values()
    assert [(r["row"], r["measure"]) for r in board] == [("pgd_at", "targeted ASR"), ("natural", "targeted ASR"),
                                                         ("jpeg", "targeted ASR")]
    assert [r["at_budget"] for r in board] == pytest.approx([0.5, 0.75, 0.25], rel=1e-12)


# AttackBench's optimality, worked by hand from 1 − (A_attack − A_best) / (clean_acc · max_dist − A_best), where A
# is the trapezoid area of the points (d, 1 − share of distances ≤ d) over the sorted unique distances d.

def test_attackbench_optimality_with_a_tie_and_an_attack_that_never_broke_a_sample() -> None:
    best = np.array([0.1, 0.1, 0.4])  # tie at 0.1: points (0.1, 1/3), (0.4, 0); A_best = 0.3 · (1/3) / 2 = 0.05
    # clean_acc 1, max_dist 0.4: the scale is 0.4 − 0.05 = 0.35
    # A never broke its third sample: clipped at 0.4, points (0.1, 2/3), (0.3, 1/3), (0.4, 0); area 0.1 + 1/60
    assert attackbench_optimality(np.array([0.1, 0.3, INF]), best) == pytest.approx(1 - (7 / 60 - 0.05) / 0.35,
                                                                                    rel=1e-12)
    assert 1 - (7 / 60 - 0.05) / 0.35 == pytest.approx(17 / 21, rel=1e-12)
    # B: points (0.1, 2/3), (0.2, 1/3), (0.4, 0); area 0.05 + 1/30
    assert attackbench_optimality(np.array([0.2, 0.1, 0.4]), best) == pytest.approx(19 / 21, rel=1e-12)
    assert attackbench_optimality(best, best) == pytest.approx(1.0, rel=1e-12)


def test_attackbench_optimality_counts_clean_errors_out_and_joins_points_by_straight_lines() -> None:
    best = np.array([0.0, 0.2, 0.4, 0.4])  # a clean error (0): clean_acc 3/4; points (0, 3/4), (0.2, 1/2), (0.4, 0)
    # A_best = 0.2 · (3/4 + 1/2) / 2 + 0.2 · (1/2) / 2 = 0.175; scale 3/4 · 0.4 − 0.175 = 0.125
    # the attack breaks sample 1 only at 0.4 and never sample 2 (clipped at 0.4): points (0, 3/4), (0.4, 0), area
    # 0.15, below A_best: the straight line from (0, 3/4) to (0.4, 0) lies under the reference's corner
    worse = attackbench_optimality(np.array([0.0, 0.4, INF, 0.5]), best)
    assert worse == pytest.approx(1 - (0.15 - 0.175) / 0.125, rel=1e-12)
    assert worse == pytest.approx(1.2, rel=1e-12)


def test_attackbench_optimality_where_no_attack_broke_a_sample_and_where_it_is_undefined() -> None:
    # nobody broke sample 2: max_dist is the largest finite reference distance, 0.3, and both curves clip there
    # best: points (0.1, 2/3), (0.3, 0): A_best = 0.2 · (2/3) / 2 = 1/15; scale 0.3 − 1/15 = 7/30
    # attack: points (0.2, 2/3), (0.3, 0): area 1/30
    assert attackbench_optimality(np.array([0.2, INF, INF]), np.array([0.1, 0.3, INF])) == pytest.approx(
        1 - (1 / 30 - 1 / 15) / (7 / 30), rel=1e-12)
    assert math.isnan(attackbench_optimality(np.array([INF, INF]), np.array([INF, INF])))
    assert math.isnan(attackbench_optimality(np.array([0.0, 0.0]), np.array([0.0, 0.0])))


def test_the_report_scores_each_attack_by_attackbenchs_optimality_against_the_worst_case() -> None:
    group, = groups(records(cell("a", [0.1, 0.3, INF]), cell("b", [0.2, 0.1, 0.4])))
    by_name = {s.name: s.attackbench_optimality for s in scores(group, worst_case(group))}
    assert by_name == pytest.approx({"a": 17 / 21, "b": 19 / 21}, rel=1e-12)


# the page's words and curves, and the console

@pytest.mark.parametrize(("goal", "column"), [("untargeted", "accuracy"), ("targeted", "asr")])
def test_the_page_draws_the_curves_advbench_plot_draws(goal: str, column: str) -> None:
    frame = records(cell("bim", [0.05, 0.1, INF, 0.3], clean=[True, False, True, True], goal=goal))
    group, = groups(frame)
    eps = np.linspace(0.0, 0.4, 41)
    theirs = budget_curve(frame, grid=eps)[column].to_numpy()
    assert drawn_curve(goal, group.breaks[0], eps) == pytest.approx(theirs, rel=1e-12)


def test_a_targeted_threat_has_one_name_on_the_page() -> None:
    frame = records(cell("bim", [0.05, 0.1, 0.3, 0.3], goal="targeted"), cell("pgd", [0.3, 0.1, 0.15, 0.3],
                                                                             goal="targeted"))
    report = card(audit(frame), [])
    threat = report["models"][0]["threats"][0]
    assert (threat["measure"], threat["at_budget"]) == ("targeted ASR", pytest.approx(0.75, rel=1e-12))
    html = page(report, {"natural": [""]})
    assert "robust share" not in html and "1 − targeted ASR" not in html and "robust accuracy at budget" not in html
    assert "75.0% best-known targeted ASR" in html and "targeted ASR at budget" in html
    assert "forward-only query</b> is one forward pass" in html


def test_advbench_report_prints_each_rows_verdict_line(tmp_path: Path) -> None:
    frame = records(cell("pgd", [0.1, 0.1, 0.3, 0.3], defense="pgd_at"),
                    cell("pgd", [0.3, 0.3, 0.3, 0.1], defense="jpeg", flag_zero_grad=True),
                    cell("pgd", [0.1, 0.3, 0.1, 0.3], defense="jpeg", budget=0.1, flag_zero_grad=True))
    for key, part in frame.groupby("cell_key"):
        write_part(part.assign(cell_samples=len(part)), tmp_path / "records" / f"digits_x_s0_{key}.parquet")
    result = CliRunner().invoke(main, ["report", str(tmp_path / "records"), "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[:3] == verdict_lines(card(audit(frame), []))
    assert [line.split(":")[0] for line in lines[:3]] == ["jpeg · linf untargeted ε=0.1", "jpeg · linf untargeted ε=0.2",
                                                          "pgd_at · linf untargeted ε=0.2"]
    assert "Not trustworthy" in lines[1] and "Verified" in lines[2]
    assert lines[3:] == [f"wrote {tmp_path / 'out' / name}" for name in ("report.json", "report.html")]
