"""The committed reports (the digits defense zoo's, results/report; the white-box attacks',
results/attacks/report) are what `advbench report` writes from the records committed beside them
(results/attacks' tables too are what `advbench plot` writes from its), and what they say about
the zoo is what the report is for: a row whose worst case cannot be too high is verified, a row
whose worst case may be too high is not, and no such row ranks."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import advbench
from advbench.core.records import read_records
from advbench.robustness.report.plot import write_tables
from advbench.robustness.report.table3 import summary_table

ROOT = Path(__file__).resolve().parents[1]
REPORTS = {"zoo": ROOT / "results" / "report", "attacks": ROOT / "results" / "attacks" / "report"}
RECORDS = {"zoo": REPORTS["zoo"] / "records", "attacks": ROOT / "results" / "attacks" / "records"}


def _card(folder: Path) -> dict:
    return json.loads((folder / "report.json").read_text(encoding="utf-8"))


def _verdicts(card: dict) -> dict[str, list[str]]:
    return {m["row"]: m["verdicts"] for m in card["models"]}


def _board(card: dict) -> dict[str, list[tuple[str, bool, int | None]]]:
    return {k: [(r["row"], r["verified"], r["rank"]) for r in rows] for k, rows in card["leaderboard"].items()}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(REPORTS))
def test_a_committed_report_is_what_advbench_report_writes_from_its_records(name: str, tmp_path: Path) -> None:
    advbench.report(str(RECORDS[name]), str(tmp_path))
    committed, remade = _card(REPORTS[name]), _card(tmp_path)
    assert _verdicts(remade) == _verdicts(committed)
    assert _board(remade) == _board(committed)
    assert [a["name"] for m in remade["models"] for t in m["threats"] for a in t["attacks"]] == \
        [a["name"] for m in committed["models"] for t in m["threats"] for a in t["attacks"]]
    assert [t["rejudged"] and t["rejudged"]["line"] for m in remade["models"] for t in m["threats"]] == \
        [t["rejudged"] and t["rejudged"]["line"] for m in committed["models"] for t in m["threats"]]


def test_the_zoo_verifies_a_worst_case_of_zero_and_fails_the_naive_rows() -> None:
    verdicts = {row: lines[0] for row, lines in _verdicts(_card(REPORTS["zoo"])).items()}
    assert "0.0% best-known robust accuracy. Verified" in verdicts["rp"]
    assert "Attacks weak where others covered them" in verdicts["rp"]
    for row in ("bit_red-naive", "jpeg-naive", "rp-naive", "bit_red"):
        assert "Not trustworthy, it may be too high" in verdicts[row]
    for row in ("pgd_at", "natural", "jpeg"):
        assert "Verified: no sign that it is too high" in verdicts[row]


def test_the_zoo_re_judges_the_randomized_row_with_fresh_votes_and_says_where_none_is_recorded() -> None:
    """rp's cells record a fresh vote and its worst case is re-judged; rp-naive, judged as deterministic,
    has none; the deterministic rows get no such line."""
    rejudged = {m["row"]: m["threats"][0]["rejudged"] for m in _card(REPORTS["zoo"])["models"]}
    rp = rejudged.pop("rp")
    assert rp["rejudged"] is not None and 0 <= rp["agreement"] <= 1 and "re-judged by a fresh vote (20 passes)" in rp["line"]
    naive = rejudged.pop("rp-naive")
    assert naive["rejudged"] is None and "no fresh vote is recorded" in naive["line"]
    assert set(rejudged.values()) == {None}


@pytest.mark.parametrize("name", sorted(REPORTS))
def test_no_row_with_a_failure_ranks_or_stands_above_a_verified_row(name: str) -> None:
    for rows in _board(_card(REPORTS[name])).values():
        verified = [v for _, v, _ in rows]
        assert verified == sorted(verified, reverse=True)
        assert [rank for _, v, rank in rows if v] == list(range(1, verified.count(True) + 1))
        assert all(rank is None for _, v, rank in rows if not v)


def test_the_verdict_lines_docs_quote_are_the_committed_ones() -> None:
    """docs/report.md's text blocks quote verdict lines of both committed reports word for word (a line cut
    short with … excepted)."""
    quoted = re.findall(r"^(\S+ · \S+ \S+ ε=[^…\n]*)$", (ROOT / "docs" / "report.md").read_text(encoding="utf-8"), re.M)
    lines = {name: {line for lines in _verdicts(_card(folder)).values() for line in lines}
             for name, folder in REPORTS.items()}
    assert set(quoted) <= set().union(*lines.values())
    assert all(set(quoted) & mine for mine in lines.values())


def test_the_attacks_tables_are_what_advbench_plot_writes_from_the_records_the_report_reads(tmp_path: Path) -> None:
    """results/attacks' figures, tables and report come from one set of committed records."""
    written = write_tables(summary_table(read_records([RECORDS["attacks"]])), tmp_path)
    tables = [p for p in written if p.suffix == ".md"]
    assert len(tables) == 2
    for table in tables:
        assert table.read_text(encoding="utf-8") == (ROOT / "results" / "attacks" / table.name).read_text(encoding="utf-8")


def test_the_readme_links_both_reports() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "(results/report/report.html)" in readme and "(results/attacks/report/report.html)" in readme
