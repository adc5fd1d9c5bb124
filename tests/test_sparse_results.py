"""results/attacks-sparse, the run of `experiment=attacks_sparse` (ℓ1, ℓ0 and patches on digits): its tables
and report are what `advbench plot` and `advbench report` write from the records committed beside them, the
records hold every cell the preset runs, and docs/attacks.md quotes the tables' rows as they are."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import advbench
from advbench.core.records import read_records
from advbench.robustness.report.curves import budget_curve
from advbench.robustness.report.plot import write_tables
from advbench.robustness.report.table3 import summary_table

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "results" / "attacks-sparse"
RECORDS = FOLDER / "records"
TABLES = ("table3_l0_untargeted.md", "table3_l1_untargeted.md", "table3_patch_untargeted.md")


@pytest.fixture(scope="module")
def records():
    return read_records([RECORDS])


def test_the_records_hold_every_cell_the_preset_runs(records) -> None:
    cells = set(map(tuple, records[["defense", "attack", "norm", "knowledge"]].drop_duplicates().to_numpy()))
    runs = {("apgd_ce", "l1", "white"), ("autoattack", "l1", "white"), ("fmn", "l1", "white"), ("ead", "l1", "white"),
            ("fmn", "l0", "white"), ("pgd_l0", "l0", "white"), ("sparse_rs", "l0", "score"),
            ("sparse_rs", "patch", "score")}
    assert cells == {(defense, *run) for defense in ("natural", "pgd_at") for run in runs}
    assert set(records.groupby(["defense", "attack", "norm"])["sample_id"].nunique()) == {64}


def test_the_tables_are_what_advbench_plot_writes_from_the_records(records, tmp_path: Path) -> None:
    written = write_tables(summary_table(records), tmp_path)
    assert sorted(p.name for p in written if p.suffix == ".md") == list(TABLES)
    for name in TABLES:
        assert (tmp_path / name).read_text(encoding="utf-8") == (FOLDER / name).read_text(encoding="utf-8")


def test_the_whole_norms_curves_step_at_whole_k(records) -> None:
    curves = budget_curve(records[records["norm"].isin(["l0", "patch"])])
    assert curves["eps"].apply(float.is_integer).all()


def test_docs_quote_the_tables_rows_as_written() -> None:
    """Every row of the three tables appears word for word in docs/attacks.md."""
    page = (ROOT / "docs" / "attacks.md").read_text(encoding="utf-8")
    for name in TABLES:
        rows = [line for line in (FOLDER / name).read_text(encoding="utf-8").splitlines() if line.startswith("| digits")]
        assert rows and all(row in page for row in rows), name


@pytest.mark.slow
def test_the_report_is_what_advbench_report_writes_from_the_records(tmp_path: Path) -> None:
    advbench.report(str(RECORDS), str(tmp_path))
    committed, remade = (json.loads((folder / "report.json").read_text(encoding="utf-8"))
                         for folder in (FOLDER / "report", tmp_path))
    assert [m["verdicts"] for m in remade["models"]] == [m["verdicts"] for m in committed["models"]]
    def board(card: dict) -> dict:
        return {k: [(r["row"], r["verified"], r["rank"]) for r in rows] for k, rows in card["leaderboard"].items()}
    assert board(remade) == board(committed)
    assert [[a["name"] for t in m["threats"] for a in t["attacks"]] for m in remade["models"]] == \
        [[a["name"] for t in m["threats"] for a in t["attacks"]] for m in committed["models"]]
