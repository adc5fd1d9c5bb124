"""Cells split into data shards: the pooled shards are the unsharded run, and plot says when one is missing."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from advbench.cli.config import compose_config
from advbench.cli.main import main
from advbench.cli.spec_builder import run_main
from advbench.core.records import read_records
from advbench.robustness.report.table3 import summary_table

PER_SAMPLE = ["sample_id", "label", "adv_pred", "clean_correct", "success_at_budget", "min_eps", "min_eps_lo",
              "adv_norm", "first_success_strength", "grad_evals", "queries"]


def _run(out: Path, *overrides: str) -> None:
    run_main(compose_config("config", ["experiment=smoke", "attack=pgd", "attack.params.steps=5",
                                       "dataset.n_samples=30", "defense.recipe.epochs=4", f"out_dir={out}",
                                       *overrides]))


@pytest.fixture
def sharded(tmp_path: Path, trained_digits_cache: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    monkeypatch.setenv("ADVBENCH_CACHE", str(trained_digits_cache))
    whole, split = tmp_path / "whole", tmp_path / "split"
    _run(whole)
    for index in range(3):
        _run(split, f"shard.index={index}", "shard.count=3")
    return whole / "records", split / "records"


def test_three_shards_pooled_equal_one_run(sharded) -> None:
    whole_dir, split_dir = sharded
    assert len(list(split_dir.glob("*.parquet"))) == 3
    whole = read_records([whole_dir]).sort_values("sample_id").reset_index(drop=True)
    split = read_records([split_dir]).sort_values("sample_id").reset_index(drop=True)
    assert sorted(split["shard"].unique()) == [0, 1, 2] and set(split["shard_count"]) == {3}
    assert len(whole) == len(split) == 30
    # Batches of other sizes round the model's outputs differently (1e-7): probes placed from
    # margins may move by as much, never by a meaningful amount.
    pd.testing.assert_frame_equal(whole[PER_SAMPLE], split[PER_SAMPLE], check_exact=False, rtol=1e-4)
    pd.testing.assert_frame_equal(summary_table(whole), summary_table(split))


def test_plot_names_the_shards_a_cell_still_lacks(sharded, tmp_path: Path) -> None:
    _, split_dir = sharded
    next(split_dir.glob("*shard1of3*.parquet")).unlink()
    result = CliRunner().invoke(main, ["plot", str(split_dir), "--out", str(tmp_path / "plots")])
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.output.splitlines() if line.startswith("warning:")]
    assert warnings == ["warning: digits/natural/pgd/linf/untargeted/white: shard(s) 1 of 3 have no records yet; "
                        "its curves cover 2 of 3 shards"]


def test_a_rerun_of_the_sharded_sweep_recomputes_only_the_missing_shard(sharded, capsys) -> None:
    _, split_dir = sharded
    kept = {p.name: p.stat().st_mtime_ns for p in split_dir.glob("*.parquet") if "shard1of3" not in p.name}
    next(split_dir.glob("*shard1of3*.parquet")).unlink()
    for index in range(3):
        _run(split_dir.parent, f"shard.index={index}", "shard.count=3")
    assert {p.name: p.stat().st_mtime_ns for p in split_dir.glob("*.parquet") if p.name in kept} == kept
    assert len(list(split_dir.glob("*.parquet"))) == 3


def test_a_range_sweep_over_shards_is_checked_before_any_cell_runs(tmp_path: Path) -> None:
    from advbench.cli.config import _first_choices

    combos = _first_choices(["attack=fgsm,bim", "shard.count=3", "shard.index=range(0,3)"])
    assert [c[-1] for c in combos] == ["shard.index=0", "shard.index=1", "shard.index=2"] * 2
    assert {c[0] for c in combos} == {"attack=fgsm", "attack=bim"}
    result = CliRunner().invoke(main, ["run", "-m", "experiment=smoke", "shard.count=3", "shard.index=range(0,4)",
                                       f"out_dir={tmp_path}"])
    assert result.exit_code == 1
    assert result.output.strip().splitlines()[-1] == "Error: shard.index must be below shard.count (0..2), got 3"
    assert not list(tmp_path.rglob("*.parquet"))


def test_check_refuses_a_cell_with_a_shard_missing(sharded, tmp_path: Path) -> None:
    _, split_dir = sharded
    (sorted(split_dir.glob("*shard2of3*.parquet"))[0]).unlink()
    result = CliRunner().invoke(main, ["check", str(split_dir), "--min-accuracy", "0"])
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "cannot judge" in lines[0] and "shard(s) 2 of 3 have no records" in lines[0]


def test_check_and_plot_refuse_shards_made_with_other_settings(sharded, tmp_path: Path) -> None:
    _, split_dir = sharded
    (sorted(split_dir.glob("*shard1of3*.parquet"))[0]).unlink()
    _run(split_dir.parent, "shard.index=1", "shard.count=3", "attack.params.steps=3")  # shard 1 with fewer steps
    for command in (["check", str(split_dir), "--min-accuracy", "0"],
                    ["plot", str(split_dir), "--out", str(tmp_path / "plots")]):
        result = CliRunner().invoke(main, command)
        assert result.exit_code == 1, result.output
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and "shards made with other settings" in lines[0] and "attack_params" in lines[0]
