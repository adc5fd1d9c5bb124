"""A single `advbench run` is composed once (by Hydra), and still fails in one line.

Composing a config takes a quarter of a second on a CPU, and Hydra composes each run twice
already; the up-front composition is kept for sweeps and printed configs, where one bad job
must stop the others before they start.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from advbench.cli import config
from advbench.cli.main import main

SMOKE = ["run", "experiment=smoke", "attack=fgsm", "dataset.n_samples=8", "search.enabled=false", "threads=1"]


def _invoke(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cache: Path, *argv: str) -> tuple[int, str, int]:
    """Exit code, output, and how many times advbench itself composed the config."""
    composed = []
    real = config._compose

    def counting(name: str, overrides: list[str]) -> object:
        composed.append(name)
        return real(name, overrides)

    monkeypatch.setattr(config, "_compose", counting)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ADVBENCH_CACHE", str(cache))
    result = CliRunner().invoke(main, list(argv))
    return result.exit_code, result.output, len(composed)


def test_a_good_run_is_not_composed_ahead(tmp_path: Path, trained_digits_cache: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    code, output, composed = _invoke(tmp_path, monkeypatch, trained_digits_cache, *SMOKE, f"out_dir={tmp_path}/out")
    assert code == 0, output
    assert composed == 0
    assert len(pd.read_parquet(tmp_path / "out" / "records")) == 8


def test_a_run_leaves_no_hydra_job_behind(tmp_path: Path, trained_digits_cache: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Hydra keeps its last job's config set; a later run or `advbench.evaluate` in the same
    process would take that job's mode (multirun?) and overrides (the train line) for its own."""
    from hydra.core.hydra_config import HydraConfig

    code, output, _ = _invoke(tmp_path, monkeypatch, trained_digits_cache, *SMOKE, f"out_dir={tmp_path}/out")
    assert code == 0, output
    assert not HydraConfig.initialized()


def test_a_printed_config_is_still_composed_ahead(tmp_path: Path, trained_digits_cache: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    code, output, composed = _invoke(tmp_path, monkeypatch, trained_digits_cache, *SMOKE, "--cfg", "job")
    assert code == 0, output
    assert composed == 1


@pytest.mark.parametrize(("override", "needle"), [
    ("attack.paramz.steps=1", "did you mean attack.params"),
    ("out_dir=${nope}", "Interpolation key 'nope' not found"),
    ("dataset.n_samples=???", "missing required value(s): dataset.n_samples"),
    ("batch_size=abc", "batch_size must be a whole number"),
    ("hydra.run.dir=/proc/advbench-cannot-be-here", "hydra.run.dir"),
    ("hydra.run.dir=${nope}", "full_key: hydra.run.dir"),
    ("hydra/launcher=nope", "hydra/launcher/nope"),
], ids=["unknown-key", "interpolation", "missing", "bad-value", "hydra-folder", "hydra-interpolation",
        "hydra-group"])
def test_a_bad_run_fails_in_one_line(override: str, needle: str, tmp_path: Path, trained_digits_cache: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    code, output, _ = _invoke(tmp_path, monkeypatch, trained_digits_cache, *SMOKE, f"out_dir={tmp_path}/out", override)
    lines = [line for line in output.splitlines() if line.strip()]
    assert code == 1 and len(lines) == 1 and lines[0].startswith("Error: "), output
    assert needle in lines[0]
    assert not list(tmp_path.rglob("*.parquet"))


def test_a_robustness_run_loads_no_part_of_the_quality_half(tmp_path: Path, trained_digits_cache: Path) -> None:
    """PyAV and the metric code load only for the commands that use them."""
    probe = ("import json, sys\nfrom advbench.cli.main import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n"
             "    pass\nprint(json.dumps(sorted(m for m in sys.modules if m == 'av' or m.startswith('advbench.quality'))))")
    env = {**os.environ, "ADVBENCH_CACHE": str(trained_digits_cache), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", probe, *SMOKE, f"out_dir={tmp_path}/out"], capture_output=True,
                         text=True, env=env, cwd=tmp_path, check=True)
    assert (tmp_path / "out" / "records").is_dir(), out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
