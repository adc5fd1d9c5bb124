"""The CI gate: `advbench check` over records and `advbench run ... gate.*`, both ways (pass and fail)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from click.testing import CliRunner

from advbench.cli.config import compose_config
from advbench.cli.main import main
from advbench.cli.spec_builder import gate_thresholds, target_spec
from advbench.cli.validate import validate
from advbench.core.errors import AdvbenchError
from advbench.core.records import write_part
from advbench.robustness.defenses.trained import ensure_checkpoint
from advbench.robustness.report.gate import VERDICT_DIR_ENV, gate_cell, judge, sweep_verdicts
from advbench.robustness.specs import Thresholds


def cell(attack: str, goal: str, n: int, hits: int, *, eps: float = 0.2, correct: int | None = None) -> pd.DataFrame:
    """Records of one cell: `hits` samples broken at the budget (targeted: reached the target)."""
    correct = n if correct is None else correct
    label = np.arange(n) % 10
    clean_correct = np.arange(n) < correct
    broken = np.zeros(n, dtype=bool)
    broken[np.flatnonzero(clean_correct if goal == "untargeted" else np.ones(n, bool))[:hits]] = True
    adv_pred = np.where(broken | ~clean_correct, (label + 1) % 10, label)
    return pd.DataFrame({
        "dataset": "digits", "defense": "natural", "attack": attack, "norm": "linf", "goal": goal,
        "knowledge": "white", "sample_id": np.arange(n), "label": label, "adv_pred": adv_pred,
        "clean_correct": clean_correct, "success_at_budget": broken,
        "min_eps": np.where(broken, eps / 2, np.inf), "eps_budget": eps,
        "first_success_strength": np.where(broken, 1, -1), "strength_budget": 10,
        "adv_norm": np.where(broken, eps / 2, np.inf), "min_eps_source": "search",
    })


@pytest.fixture
def records(tmp_path: Path) -> Path:
    """bim breaks 8 of 10 (accuracy 20%), fgsm 3 of 10 (70%), targeted bim reaches 6 of 10 (ASR 60%)."""
    folder = tmp_path / "records"
    for name, frame in {"bim": cell("bim", "untargeted", 10, 8), "fgsm": cell("fgsm", "untargeted", 10, 3),
                        "bim_t": cell("bim", "targeted", 10, 6)}.items():
        write_part(frame, folder / f"{name}.parquet")
    return folder


def test_judge_untargeted_by_accuracy_counting_clean_mistakes() -> None:
    # 10 samples, 2 wrong before the attack, 3 broken by it: accuracy 5/10.
    frame = cell("bim", "untargeted", 10, 3, correct=8)
    assert judge(frame, Thresholds(min_accuracy=0.5)).passed
    verdict = judge(frame, Thresholds(min_accuracy=0.51))
    assert verdict.failures == ["digits/natural/bim linf untargeted ε=0.2: accuracy 50.0% < 51.0%"]


def test_judge_targeted_by_asr_and_leaves_ungated_goals_out() -> None:
    frame = pd.concat([cell("bim", "targeted", 10, 6), cell("bim", "untargeted", 10, 8)])
    verdict = judge(frame, Thresholds(max_asr=0.5))
    assert verdict.failures == ["digits/natural/bim linf targeted ε=0.2: ASR 60.0% > 50.0%"]
    assert verdict.judged == 1 and verdict.unjudged == {"untargeted": 1}
    assert judge(frame, Thresholds(max_asr=0.6)).passed


def test_check_fails_with_one_line_per_failing_cell(records: Path) -> None:
    result = CliRunner().invoke(main, ["check", str(records), "--min-accuracy", "0.4"])
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert lines == ["digits/natural/bim linf untargeted ε=0.2: accuracy 20.0% < 40.0%",
                     "Error: gate failed: 1 of 2 cells below the threshold"]


def test_check_passes_with_a_summary(records: Path) -> None:
    result = CliRunner().invoke(main, ["check", str(records), "--min-accuracy", "0.2", "--max-asr", "0.6"])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == "gate: 3 cells passed, untargeted accuracy ≥ 20.0%, targeted ASR ≤ 60.0%"


def test_check_says_which_cells_it_did_not_judge(records: Path) -> None:
    result = CliRunner().invoke(main, ["check", str(records), "--min-accuracy", "0.1"])
    assert result.exit_code == 0, result.output
    assert "2 cells passed" in result.output and "1 targeted not checked (no --max-asr)" in result.output


@pytest.mark.parametrize("args, needle", [
    (["--min-accuracy", "40"], "--min-accuracy must be a fraction in [0, 1] (40% is 0.4), got 40.0"),
    (["--max-asr", "-0.1"], "--max-asr must be a fraction in [0, 1], got -0.1"),
    (["--min-accuracy", "nan"], "--min-accuracy must be a fraction"),
    ([], "give a threshold"),
])
def test_bad_thresholds_are_one_line_errors(records: Path, args: list[str], needle: str) -> None:
    result = CliRunner().invoke(main, ["check", str(records), *args])
    assert result.exit_code == 1
    (line,) = result.output.strip().splitlines()
    assert line.startswith("Error: ") and needle in line, line


def test_unreadable_records_and_unjudged_records_are_one_line_errors(tmp_path: Path) -> None:
    missing = CliRunner().invoke(main, ["check", str(tmp_path / "nowhere"), "--min-accuracy", "0.4"])
    assert missing.exit_code == 1 and missing.output.strip() == f"Error: no records at '{tmp_path / 'nowhere'}': " \
                                                               "expected a .parquet file or a folder of them"
    (tmp_path / "junk.parquet").write_bytes(b"not parquet")
    junk = CliRunner().invoke(main, ["check", str(tmp_path / "junk.parquet"), "--min-accuracy", "0.4"])
    assert junk.exit_code == 1 and len(junk.output.strip().splitlines()) == 1 and "junk.parquet" in junk.output
    write_part(cell("bim", "targeted", 10, 6), tmp_path / "t" / "t.parquet")
    only_targeted = CliRunner().invoke(main, ["check", str(tmp_path / "t"), "--min-accuracy", "0.4"])
    assert only_targeted.exit_code == 1
    assert only_targeted.output.strip() == ("Error: no cell to check: the records hold only targeted cells; "
                                            "give --max-asr")


def test_gate_cell_fails_in_one_line_or_leaves_its_verdict_for_the_command(tmp_path: Path, capsys,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    part = write_part(cell("bim", "untargeted", 10, 8), tmp_path / "bim.parquet")
    gate = Thresholds(min_accuracy=0.4)
    monkeypatch.delenv(VERDICT_DIR_ENV, raising=False)
    with pytest.raises(AdvbenchError, match="^gate failed: digits/natural/bim linf untargeted ε=0.2: accuracy 20.0% < 40.0%$"):
        gate_cell(gate, part, "bim")
    with pytest.raises(SystemExit) as stop, sweep_verdicts():
        gate_cell(gate, part, "bim", in_sweep=True)  # returns: the sweep goes on
        gate_cell(Thresholds(min_accuracy=0.2), part, "bim", in_sweep=True)
    assert stop.value.code == 1
    err = capsys.readouterr().err.splitlines()
    assert err == ["digits/natural/bim linf untargeted ε=0.2: accuracy 20.0% < 40.0%",
                   "gate failed: 1 of 2 cells below the threshold"]
    with sweep_verdicts():  # every cell passes: no exit
        gate_cell(Thresholds(min_accuracy=0.2), part, "bim")
    assert capsys.readouterr().out.strip() == "gate: 1 cell passed, untargeted accuracy ≥ 20.0%"
    assert VERDICT_DIR_ENV not in os.environ


def test_gate_cell_without_a_threshold_for_its_goal(tmp_path: Path, capsys) -> None:
    part = write_part(cell("bim", "targeted", 10, 6), tmp_path / "t.parquet")
    with pytest.raises(AdvbenchError, match="only targeted cells; give gate.max_asr$"):
        gate_cell(Thresholds(min_accuracy=0.4), part, "digits/natural/bim linf targeted ε=0.2")
    gate_cell(Thresholds(min_accuracy=0.4), part, "digits/natural/bim linf targeted ε=0.2", in_sweep=True)
    assert capsys.readouterr().out.strip() == "gate: digits/natural/bim linf targeted ε=0.2 not judged (give gate.max_asr)"
    gate_cell(None, part, "off")  # gate off: nothing read, nothing said
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("value", ["40", "-1", "'high'"])
def test_run_gate_values_are_checked(value: str) -> None:
    with pytest.raises(AdvbenchError, match="gate.min_accuracy must be a fraction in \\[0, 1\\] or null"):
        compose_config("config", [f"gate.min_accuracy={value}"])


def test_run_gate_defaults_to_off() -> None:
    cfg = compose_config("config", [])
    validate(cfg)
    assert cfg.gate.min_accuracy is None and cfg.gate.max_asr is None


# ---- the commands of docs/ci.md, run as a CI job runs them ------------------------------------

def advbench(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "advbench", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=600)


@pytest.fixture(scope="module")
def checkpoint(trained_digits_cache: Path) -> Path:
    """The user's model in CI: the natural digits small_cnn checkpoint file the shared cache
    fixture trained (other tests may add other checkpoints to that cache)."""
    cfg = compose_config("train", ["defense=natural", "defense.recipe.epochs=4", f"cache_dir={trained_digits_cache}"])
    path = ensure_checkpoint(target_spec(cfg))
    return path


@pytest.mark.slow
def test_run_gate_both_ways_then_check(tmp_path: Path, checkpoint: Path) -> None:
    # As docs/ci.md: a smoke run of the user's checkpoint gated on robust accuracy.
    common = [f"checkpoint={checkpoint}", "experiment=smoke", "dataset.n_samples=16"]
    passed = advbench("run", *common, "threat.eps=0.02", "gate.min_accuracy=0.5", "out_dir=small", cwd=tmp_path)
    assert passed.returncode == 0, passed.stderr
    assert "gate: 1 cell passed, untargeted accuracy ≥ 50.0%" in passed.stdout
    failed = advbench("run", *common, "gate.min_accuracy=0.5", "out_dir=big", cwd=tmp_path)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "Traceback" not in failed.stderr
    assert failed.stderr.strip().splitlines()[-2:] == ["digits/natural/bim linf untargeted ε=0.2: accuracy 0.0% < 50.0%",
                                                        "gate failed: 1 of 1 cell below the threshold"]
    # Rerun: the cell is skipped (records exist) and judged from its records, failing again.
    again = advbench("run", *common, "gate.min_accuracy=0.5", "out_dir=big", cwd=tmp_path)
    assert again.returncode == 1 and "records exist" in again.stdout + again.stderr
    assert again.stderr.strip().splitlines()[-1] == "gate failed: 1 of 1 cell below the threshold"
    # The records stay on disk, so `advbench check` judges them the same way afterwards.
    assert advbench("check", "big/records", "--min-accuracy", "0.5", cwd=tmp_path).returncode == 1
    ok = advbench("check", "small/records", "--min-accuracy", "0.5", cwd=tmp_path)
    assert ok.returncode == 0 and ok.stdout.startswith("gate: 1 cell passed"), ok.stdout + ok.stderr


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["basic", "joblib", "submitit_local"])
def test_sweep_runs_every_cell_then_exits_1(tmp_path: Path, checkpoint: Path, launcher: str) -> None:
    # submitit_local's jobs write their output to log files: the verdicts still reach the command.
    extra = {"basic": [], "joblib": ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"],
             "submitit_local": ["hydra/launcher=submitit_local"]}[launcher]
    proc = advbench("run", "-m", f"checkpoint={checkpoint}", "experiment=smoke", "dataset.n_samples=16",
                    "threat.eps=0.2,0.02", "gate.min_accuracy=0.5", *extra, cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    # The failing first cell did not stop the second one, which passed.
    assert len(list((tmp_path / "advbench-out/smoke/records").glob("*.parquet"))) == 2
    assert proc.stderr.count("digits/natural/bim linf untargeted ε=0.2: accuracy 0.0% < 50.0%") == 1
    assert "ε=0.02: accuracy" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == "gate failed: 1 of 2 cells below the threshold"
    assert "Traceback" not in proc.stderr


def docs_commands(program: str) -> list[list[str]]:
    """Every `advbench <program> ...` command in docs/ci.md's YAML and bash blocks, as argv lists."""
    text = (Path(__file__).parents[1] / "docs" / "ci.md").read_text()
    blocks = re.findall(r"```(yaml|bash)\n(.*?)```", text, flags=re.S)
    lines: list[str] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)
        elif isinstance(node, str):
            lines.extend(node.splitlines())

    for kind, body in blocks:
        if kind == "yaml":
            walk(yaml.safe_load(body))
        else:
            lines.extend(body.splitlines())
    prefix = f"advbench {program} "
    return [shlex.split(ln.strip()[len("advbench "):]) for ln in lines if ln.strip().startswith(prefix)]


def test_docs_run_commands_compose() -> None:
    commands = docs_commands("run")
    assert len(commands) >= 3
    for argv in commands:
        overrides = [a.replace("$CHECKPOINT", "model.pt").split(",")[0] for a in argv[1:] if a != "-m"]
        cfg = compose_config("config", overrides)
        assert cfg.checkpoint == "model.pt" and cfg.dataset.name == "digits"


def test_docs_check_commands_parse(records: Path) -> None:
    commands = docs_commands("check")
    assert commands
    for argv in commands:
        result = CliRunner().invoke(main, ["check", str(records), *argv[2:]])
        assert result.exit_code in (0, 1) and not result.output.startswith("Usage"), result.output


def certified_cell(attack: str, n: int, hits: int, bound: int | None, *, norm: str = "linf") -> pd.DataFrame:
    """An untargeted cell whose first `bound` samples IBP certified (None: no bound, the column is NaN)."""
    frame = cell(attack, "untargeted", n, hits).assign(norm=norm)
    return frame.assign(certified=np.nan if bound is None else (np.arange(n) >= n - bound).astype(float))


def test_judge_certified_accuracy_where_a_bound_exists() -> None:
    # 10 samples, 3 broken (accuracy 70%), the last 4 certified (40%); the l2 cell has no bound.
    frame = pd.concat([certified_cell("bim", 10, 3, 4), certified_cell("pgd", 10, 3, None, norm="l2")])
    verdict = judge(frame, Thresholds(min_certified=0.5))
    assert verdict.failures == ["digits/natural/bim linf untargeted ε=0.2: certified accuracy 40.0% < 50.0%"]
    assert verdict.judged == 1 and verdict.unjudged == {"untargeted": 1}
    assert judge(frame, Thresholds(min_certified=0.4)).passed
    both = judge(frame, Thresholds(min_accuracy=0.75, min_certified=0.5))
    assert len(both.failures) == 3 and both.judged == 2, "accuracy fails both cells, the bound one of them"
    with pytest.raises(AdvbenchError, match="no cell has a certified bound"):
        judge(certified_cell("pgd", 10, 3, None, norm="l2"), Thresholds(min_certified=0.1))


def test_check_gates_certified_accuracy(tmp_path: Path) -> None:
    write_part(certified_cell("bim", 10, 3, 4), tmp_path / "r" / "bim.parquet")
    failed = CliRunner().invoke(main, ["check", str(tmp_path / "r"), "--min-certified", "0.5"])
    assert failed.exit_code == 1
    assert failed.output.strip().splitlines() == ["digits/natural/bim linf untargeted ε=0.2: certified accuracy "
                                                  "40.0% < 50.0%", "Error: gate failed: 1 of 1 cell below the threshold"]
    passed = CliRunner().invoke(main, ["check", str(tmp_path / "r"), "--min-certified", "0.4"])
    assert passed.exit_code == 0 and passed.output.strip() == "gate: 1 cell passed, certified accuracy ≥ 40.0%"
    bad = CliRunner().invoke(main, ["check", str(tmp_path / "r"), "--min-certified", "25"])
    assert bad.exit_code == 1 and "--min-certified must be a fraction in [0, 1] (25% is 0.25)" in bad.output
    with pytest.raises(AdvbenchError, match="gate.min_certified must be a fraction"):
        compose_config("config", ["gate.min_certified=2"])
    part = write_part(certified_cell("bim", 10, 3, 4), tmp_path / "run" / "bim.parquet")
    with pytest.raises(AdvbenchError, match="^gate failed: .*certified accuracy 40.0% < 50.0%$"):
        gate_cell(gate_thresholds(compose_config("config", ["gate.min_certified=0.5"]).gate), part, "bim")
