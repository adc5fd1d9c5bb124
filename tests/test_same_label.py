"""Cells that share a name are told apart by their key: drawn, tabulated and judged one by one,
named by the setting that differs, with one line saying which files hold them (issue 18, item 5)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from advbench.cli.config import compose_config
from advbench.cli.main import main
from advbench.cli.spec_builder import run_main
from advbench.core.errors import AdvbenchError
from advbench.core.records import write_part
from advbench.robustness.report.curves import budget_curve, strength_curve
from advbench.robustness.report.gate import check_records
from advbench.robustness.report.shards import missing_shards, mixed_shards, same_name_cells
from advbench.robustness.report.table3 import format_table3, summary_table
from advbench.robustness.specs import Thresholds


def part(key: str, *, hits: int, n: int = 10, steps: int = 10, label: str = "natural", run: str = "run-a",
         shard: int = 0, count: int = 1, group: str | None = None) -> pd.DataFrame:
    """One cell's records as `advbench run` writes them: `hits` of `n` samples broken at ε = 0.2."""
    ids = np.arange(shard, n * count, count)
    broken = np.arange(n) < hits
    return pd.DataFrame({
        "dataset": "digits", "defense": "natural", "attack": "bim", "norm": "linf", "goal": "untargeted",
        "knowledge": "white", "sample_id": ids, "label": ids % 10, "adv_pred": np.where(broken, (ids + 1) % 10, ids % 10),
        "clean_correct": True, "success_at_budget": broken, "min_eps": np.where(broken, 0.1, np.inf), "eps_budget": 0.2,
        "first_success_strength": np.where(broken, 1, -1), "strength_budget": steps,
        "adv_norm": np.where(broken, 0.1, np.inf), "min_eps_source": "search",
        "run_id": run, "cell_key": key, "model_label": label, "seed": 0, "cell_samples": n,
        "attack_params": json.dumps({"steps": steps, "rel_stepsize": 0.15}, sort_keys=True),
        "shard": shard, "shard_count": count, "shard_group": group or f"g{key}",
    })


def folder(tmp_path: Path, *frames: pd.DataFrame) -> Path:
    """The parts in one records folder, each under its cell's file name."""
    out = tmp_path / "records"
    for frame in frames:
        write_part(frame, out / f"digits_natural_bim_linf_untargeted_s0_{frame['cell_key'].iloc[0]}.parquet")
    return out


A, B, C = "aaaaaaaaaaaa", "bbbbbbbbbbbb", "cccccccccccc"


def test_two_runs_of_one_name_are_two_rows_named_by_the_setting_that_differs():
    frame = pd.concat([part(A, hits=8, steps=10), part(B, hits=2, steps=20, run="run-b")])
    tidy = summary_table(frame).set_index("row")
    assert tidy["accuracy"].to_dict() == pytest.approx({"natural (steps=10)": 0.2, "natural (steps=20)": 0.8})
    assert set(tidy["defense"]) == {"natural"} and set(tidy["n_samples"]) == {10}
    assert set(budget_curve(frame)["row"]) == set(strength_curve(frame)["row"]) == set(tidy.index)
    assert list(format_table3(summary_table(frame))[("linf", "untargeted")].columns) == list(tidy.index)
    [line] = same_name_cells(frame)
    assert line.startswith("digits/natural/bim/linf/untargeted/white names 2 cells, shown as "
                           f"'natural (steps=10)' (*_{A}.parquet) and 'natural (steps=20)' (*_{B}.parquet)")
    assert "they differ in attack_params.steps, strength_budget" in line


def test_no_recorded_setting_differs_then_the_run_names_them_else_the_key():
    runs = pd.concat([part(A, hits=8), part(B, hits=8, run="run-b")])
    assert sorted(summary_table(runs)["row"]) == ["natural (run run-a)", "natural (run run-b)"]
    assert "no recorded setting differs (another checkpoint, model or data)" in same_name_cells(runs)[0]
    keys = pd.concat([part(A, hits=8), part(B, hits=8)])
    assert sorted(summary_table(keys)["row"]) == [f"natural (cell g{A})", f"natural (cell g{B})"]


def test_two_models_of_one_defense_are_two_rows_named_by_their_labels():
    frame = pd.concat([part(A, hits=8, label="resnet18"), part(B, hits=2, label="vgg11")])
    tidy = summary_table(frame).set_index("row")
    assert tidy["accuracy"].to_dict() == pytest.approx({"resnet18": 0.2, "vgg11": 0.8})
    assert same_name_cells(frame) == []


def test_one_part_read_twice_is_still_a_repeat():
    one = part(A, hits=8)
    with pytest.raises(AdvbenchError, match="expected one record per cell and sample, got 10 repeats"):
        summary_table(pd.concat([one, one]))


def test_check_judges_each_cell_and_names_it(tmp_path: Path, capsys):
    records = folder(tmp_path, part(A, hits=8, steps=10), part(B, hits=2, steps=20, run="run-b"))
    verdict = check_records([records], Thresholds(min_accuracy=0.5))
    assert verdict.judged == 2
    assert verdict.failures == ["digits/natural (steps=10)/bim linf untargeted ε=0.2: accuracy 20.0% < 50.0%"]
    assert capsys.readouterr().err.startswith("warning: digits/natural/bim/linf/untargeted/white names 2 cells")


def test_shards_of_one_split_made_with_other_settings_are_still_refused():
    split = pd.concat([part(A, hits=2, shard=0, count=3, group="one"), part(B, hits=2, shard=2, count=3, group="one"),
                       part(C, hits=2, shard=1, count=3, group="two", steps=3)])
    [line] = mixed_shards(split)
    assert "shards made with other settings" in line and "attack_params.steps" in line and f"*_{C}.parquet" in line
    # A whole run beside another run's unfinished split: two cells, the second lacking shards.
    beside = pd.concat([part(A, hits=2), part(C, hits=2, shard=1, count=3, steps=3)])
    assert mixed_shards(beside) == []
    assert missing_shards(beside) == ["digits/natural (steps=3)/bim/linf/untargeted/white: shard(s) 0, 2 of 3 have "
                                      "no records yet; its curves cover 1 of 3 shards"]


def test_the_quick_tour_in_order_leaves_records_plot_and_check_read(tmp_path: Path, trained_digits_cache: Path,
                                                                     monkeypatch: pytest.MonkeyPatch):
    """README: `advbench run experiment=smoke`, then docs/ci.md's run of a checkpoint into the same folder."""
    monkeypatch.setenv("ADVBENCH_CACHE", str(trained_digits_cache))
    common = ["experiment=smoke", "dataset.n_samples=16", "defense.recipe.epochs=4", f"out_dir={tmp_path}"]
    run_main(compose_config("config", common))
    checkpoint = next(trained_digits_cache.rglob("natural-*.pt"))
    run_main(compose_config("config", [*common, f"checkpoint={checkpoint}"]))
    records = tmp_path / "records"
    assert len(list(records.glob("digits_natural_bim_linf_untargeted_*.parquet"))) == 2
    checked = CliRunner().invoke(main, ["check", str(records), "--min-accuracy", "0"])
    assert checked.exit_code == 0, checked.output
    assert "gate: 2 cells passed" in checked.output
    warning = [line for line in checked.output.splitlines() if line.startswith("warning:")]
    assert len(warning) == 1 and "names 2 cells" in warning[0] and "they differ in weights" in warning[0]  # the cache entry vs checkpoint=
    plotted = CliRunner().invoke(main, ["plot", str(records), "--out", str(tmp_path / "plots")])
    assert plotted.exit_code == 0, plotted.output
    table = pd.read_csv(tmp_path / "plots" / "table3_linf_untargeted.csv")
    assert len(table) == 2 and table["row"].str.startswith("natural (weights=").all() and table["row"].nunique() == 2
