"""What the README quotes, what `advbench.summary` prints and what the tables and figures say
agree with each other and with the committed results."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

import advbench
from advbench.cli.main import main
from advbench.cli.quality import ablation, table2
from advbench.robustness.report.curves import budget_curve
from advbench.robustness.report.plot import budget_figure, write_tables
from advbench.robustness.report.table3 import format_table3, summary_table

ROOT = Path(__file__).resolve().parents[1]
BENCHMARK = ROOT / "results" / "benchmark"
PERCENT = re.compile(r"(\d+(?:\.\d+)?)%")


def _paragraph(path: Path, start: str) -> str:
    text = path.read_text(encoding="utf-8")
    return text.split(start, 1)[1].split("\n\n", 1)[0]


def test_the_readme_quotes_the_committed_default_benchmark() -> None:
    """Every accuracy and median the README gives for the default benchmark is a cell of
    results/benchmark's Table 3, so regenerating the results without the README fails here."""
    quoted = _paragraph(ROOT / "README.md", "**Default benchmark**")
    tables = "\n".join(p.read_text(encoding="utf-8") for p in sorted(BENCHMARK.glob("table3_*.md")))
    cells = set(re.findall(r"(\d+\.\d{3}|∞) / (\d+\.\d)%", tables))
    assert cells, "results/benchmark has no Table 3 cells"
    percents = PERCENT.findall(quoted)
    medians = re.findall(r"\b\d\.\d{3}\b", quoted)
    assert percents and medians
    assert set(percents) <= {rate for _, rate in cells}
    assert set(medians) <= {median for median, _ in cells}


@pytest.mark.parametrize("doc", ["README.md", "docs/getting-started.md"])
def test_the_reproducibility_note_quotes_no_result_that_can_go_stale(doc: str) -> None:
    note = _paragraph(ROOT / doc, "**How close your numbers will be.**")
    assert "results/benchmark/" in note
    assert PERCENT.findall(note) == []  # differences in pp and samples, not figures of one run


def _records(goal: str = "untargeted", n: int = 8, defense: str = "natural", **extra) -> pd.DataFrame:
    """One cell's records on the digits' ε = 0.2; half the samples break at min_eps 0.15."""
    min_eps = np.where(np.arange(n) % 2 == 0, 0.15, 0.375)
    success = min_eps <= 0.2
    label = np.arange(n) % 10
    hit_target = success if goal == "targeted" else np.zeros(n, bool)
    adv_pred = np.where(success, (label + 1) % 10, label)
    return pd.DataFrame({
        "dataset": "digits", "defense": defense, "attack": "pgd", "norm": "linf", "goal": goal,
        "knowledge": "white", "sample_id": np.arange(n), "label": label, "adv_pred": adv_pred,
        "target": np.where(hit_target, adv_pred, -1), "clean_correct": True, "success_at_budget": success,
        "min_eps": min_eps, "eps_budget": 0.2, "strength_budget": 10, "first_success_strength": -1, **extra,
    })


@pytest.mark.parametrize("columns", [None, 80])
def test_printed_summary_shows_the_median_minimum_eps(columns: int | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """`print(advbench.summary(records))` shows every column, the median min-ε included, not
    '... [1 rows x 14 columns]'; at a narrow terminal the columns wrap instead."""
    if columns is not None:
        monkeypatch.setenv("COLUMNS", str(columns))
    records = _records(certified=False, model_label="mynet.py:Net")
    table = advbench.summary(records)
    assert isinstance(table, pd.DataFrame) and table.shape[1] >= 13
    with pd.option_context("display.max_columns", 6):  # a terminal's fit-to-width would cut it like this
        text = str(table)
        assert "..." in str(pd.DataFrame(table))
    assert "median_min_eps" in text and "0.2625" in text  # median of four 0.15 and four 0.375
    assert "..." not in text and "columns]" not in text
    for column in table.columns:
        assert column in text
    assert repr(table) == str(table)
    assert type(table.head()) is pd.DataFrame  # derived frames are plain DataFrames


def test_targeted_table_and_figure_report_the_same_rate(tmp_path: Path) -> None:
    """Targeted cells: Table 3 gives the attack success rate the figure draws, and says so."""
    records = _records("targeted", defense="none").assign(adv_pred=lambda f: (f["label"] + 1) % 10)
    tidy = summary_table(records)
    row = tidy.iloc[0]
    assert row["asr"] == pytest.approx(0.5) and row["accuracy"] == 0.0  # failed targets still misclassified
    curve = budget_curve(records, np.array([0.2]))
    assert curve["asr"].iloc[0] == pytest.approx(row["asr"])
    cell = format_table3(tidy)[("linf", "targeted")].iloc[0, 0]
    assert cell == "0.263 / 50.0%"
    md = next(p for p in write_tables(tidy, tmp_path) if p.suffix == ".md").read_text(encoding="utf-8")
    assert "attack success rate at ε = 0.2" in md.splitlines()[0] and "accuracy" not in md.splitlines()[0]
    figure = budget_figure(budget_curve(records))
    assert figure.axes[0].get_ylabel() == "attack success rate"


def test_targeted_cells_differ_from_untargeted_ones_by_rate() -> None:
    """With accuracy and success rate apart, the targeted cell shows the success rate and the
    untargeted one the accuracy."""
    targeted = _records("targeted", defense="none").assign(adv_pred=lambda f: (f["label"] + 1) % 10)
    tidy = summary_table(pd.concat([targeted, _records(defense="none")]))
    tables = format_table3(tidy)
    by_goal = tidy.set_index("goal")
    assert by_goal.loc["targeted", "accuracy"] == 0.0 and by_goal.loc["targeted", "asr"] == pytest.approx(0.5)
    assert tables[("linf", "targeted")].iloc[0, 0].endswith("/ 50.0%")
    assert tables[("linf", "untargeted")].iloc[0, 0].endswith(f"/ {100 * by_goal.loc['untargeted', 'accuracy']:.1f}%")


@pytest.mark.parametrize(("command", "option", "default"), [
    (ablation, "out", Path("advbench-out/plots/uap_ablation.png")),
    (table2, "out_dir", Path("advbench-out/plots/table2_published")),
])
def test_uap_outputs_default_outside_the_committed_results(command, option: str, default: Path) -> None:
    param = next(p for p in command.params if p.name == option)
    assert param.default == default
    result = CliRunner().invoke(main, ["uap", command.name, "--help"])
    assert result.exit_code == 0, result.output
    assert "advbench-out/plots" in " ".join(result.output.split())
