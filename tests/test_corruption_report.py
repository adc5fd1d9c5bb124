"""`advbench report` on benchmark and corruption records together: each model row's corruption aggregate
(mean accuracy over corruptions × severities) stands beside its ℓp verdicts, with no verdict of its own."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from audit_records import INF, cell, records
from click.testing import CliRunner

import advbench
from advbench.cli.main import main
from advbench.core.errors import AdvbenchError
from advbench.core.records import write_part

SEVERITY = [f"correct_s{s}" for s in range(1, 6)]


def corruption_cell(name: str, correct: np.ndarray, defense: str = "natural",
                    weights: str = '{"cache_key": "abc"}') -> pd.DataFrame:
    """One corruption cell's records: `correct` is samples × severities 1-5, every sample right when clean."""
    n = correct.shape[0]
    frame = pd.DataFrame({"sample_id": np.arange(n) + 100, "label": 0, "clean_correct": True,
                          **{c: correct[:, i].astype(bool) for i, c in enumerate(SEVERITY)},
                          "dataset": "digits", "model": "small_cnn", "defense": defense, "model_label": defense,
                          "weights": weights, "corruption": name, "corruption_source": "generated",
                          "cell_key": f"{name}-{defense}", "cell_samples": n})
    broken = ~correct.astype(bool)
    frame["min_severity"] = np.where(broken.any(axis=1), broken.argmax(axis=1) + 1, INF).astype(float)
    return frame


def write_records(folder: Path, corruption: list[pd.DataFrame]) -> None:
    """The ℓp cells of two rows, natural and pgd_at, and the corruption cells, in one folder."""
    for defense in ("natural", "pgd_at"):
        write_part(records(cell("bim", [0.05, 0.1, INF, 0.3], defense=defense),
                           cell("pgd", [0.04, 0.12, 0.5, INF], defense=defense)), folder / f"{defense}_lp.parquet")
    for i, frame in enumerate(corruption):
        write_part(frame, folder / f"corruption_{i}.parquet")


def test_the_report_shows_a_rows_corruption_number_beside_its_verdicts(tmp_path: Path) -> None:
    fog = np.array([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0]])
    noise = np.ones((4, 5), int)
    other_weights = corruption_cell("fog", np.zeros((4, 5), int), weights='{"cache_key": "other"}')
    write_records(tmp_path / "records", [corruption_cell("fog", fog), corruption_cell("gaussian_noise", noise),
                                         other_weights])
    result = CliRunner().invoke(main, ["report", str(tmp_path / "records"), "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    expected = (fog.mean() + noise.mean()) / 2  # RobustBench's number: the mean over corruptions × severities
    assert f"natural · corruptions: {expected:.1%} mean accuracy over 2 corruptions × 5 severities" in result.output
    card = json.loads((tmp_path / "out" / "report.json").read_text(encoding="utf-8"))
    rows = {m["row"]: m for m in card["models"]}
    natural = rows["natural"]["corruption"]
    assert natural["mean_accuracy"] == pytest.approx(expected)
    assert natural["corruptions"] == pytest.approx({"fog": fog.mean(), "gaussian_noise": 1.0})
    assert natural["severity_accuracy"] == pytest.approx(list((fog.mean(axis=0) + 1) / 2))
    assert rows["pgd_at"]["corruption"] is None  # no corruption records of that model
    # The other checkpoint's records are listed on their own, never attached to the natural row.
    assert [e["mean_accuracy"] for e in card["corruptions"]] == pytest.approx([expected, 0.0])
    assert all(len(m["verdicts"]) == len(m["threats"]) == 1 for m in card["models"])  # no corruption verdict
    page = (tmp_path / "out" / "report.html").read_text(encoding="utf-8")
    assert "<h2>Common corruptions</h2>" in page
    assert f'<div class="verdict measured"><a href="#m-natural"><b>natural</b></a> · corruptions: {expected:.1%}' in page


def test_corruption_records_alone_are_refused_in_one_line(tmp_path: Path) -> None:
    write_part(corruption_cell("fog", np.ones((4, 5), int)), tmp_path / "records" / "fog.parquet")
    result = CliRunner().invoke(main, ["report", str(tmp_path / "records"), "--out", str(tmp_path / "out")])
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: expected benchmark records")
    assert "corruption records" in lines[0] and "advbench plot" in lines[0]


def test_the_api_takes_corruption_records_as_parts_or_as_a_frame(tmp_path: Path) -> None:
    fog = np.array([[1, 1, 0, 0, 0]] * 4)
    write_records(tmp_path / "records", [corruption_cell("fog", fog)])
    advbench.report(tmp_path / "records", tmp_path / "parts")
    lp = [tmp_path / "records" / f"{d}_lp.parquet" for d in ("natural", "pgd_at")]
    advbench.report(lp, tmp_path / "frame", corruptions=corruption_cell("fog", fog))
    for out in ("parts", "frame"):
        card = json.loads((tmp_path / out / "report.json").read_text(encoding="utf-8"))
        natural, pgd_at = card["models"]
        assert natural["corruption"]["mean_accuracy"] == pytest.approx(fog.mean())
        assert pgd_at["corruption"] is None
    with pytest.raises(AdvbenchError, match="corruption records"):
        advbench.report(lp, tmp_path / "bad", corruptions=records(cell("bim", [0.1, INF])))


def test_plot_draws_benchmark_and_corruption_records_of_one_folder(tmp_path: Path) -> None:
    write_records(tmp_path / "records", [corruption_cell("fog", np.array([[1, 1, 0, 0, 0]] * 4))])
    result = CliRunner().invoke(main, ["plot", str(tmp_path / "records"), "--out", str(tmp_path / "plots")])
    assert result.exit_code == 0, result.output
    written = {p.name for p in (tmp_path / "plots").iterdir()}
    assert "corruptions_digits.md" in written
    assert any(name.startswith("budget_digits_linf_untargeted") for name in written)
