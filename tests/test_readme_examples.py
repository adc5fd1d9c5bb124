"""The README's "Benchmark your own model" examples, run as a reader would copy them."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from advbench.cli.config import compose_config
from advbench.cli.main import main
from advbench.core.catalog import option_data
from advbench.core.errors import AdvbenchError
from advbench.robustness.models.robustbench_zoo import robustbench_missing

README = Path(__file__).resolve().parents[1] / "README.md"


def _section() -> str:
    text = README.read_text(encoding="utf-8")
    return text.split("### Benchmark your own model", 1)[1].split("\n### ", 1)[0]


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)\n```", _section(), re.S)


def _commands() -> list[list[str]]:
    lines = [line.split("#", 1)[0].strip() for block in _blocks("bash") for line in block.splitlines()]
    return [shlex.split(line)[1:] for line in lines if line.startswith("advbench ")]


def test_the_section_has_the_model_file_the_api_and_three_command_lines() -> None:
    python = _blocks("python")
    assert len(python) == 2 and python[0].startswith("# mynet.py")
    assert [c[1] for c in _commands()] == ["model=python", "model=torchvision", "model=robustbench"]


@pytest.fixture(scope="module")
def ran_example(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The folder the two Python blocks ran in (mynet.py, the trained mynet.pt, plots/), and their
    stdout, ending in a line with the clean accuracy of the records."""
    folder = tmp_path_factory.mktemp("readme")
    model_file, script = _blocks("python")
    (folder / "mynet.py").write_text(model_file)
    script += "\nprint('clean accuracy', records['clean_correct'].mean())"
    result = subprocess.run([sys.executable, "-c", script], cwd=folder, capture_output=True, text=True,
                            env={"ADVBENCH_CACHE": str(folder / "cache"), "PATH": "/usr/bin:/bin"}, timeout=600)
    assert result.returncode == 0, result.stderr
    return folder, result.stdout


def test_the_python_examples_run(ran_example: tuple[Path, str]) -> None:
    folder, stdout = ran_example
    assert "pgd" in stdout and (folder / "plots").is_dir()
    assert any((folder / "plots").glob("*.png"))
    assert (folder / "mynet.pt").is_file()


def test_the_python_example_trains_a_model_worth_attacking(ran_example: tuple[Path, str]) -> None:
    """Untrained, the example's net is at chance (about 10%) and every attack result is 0: the
    snippet trains it first, so its numbers mean something."""
    clean = float(ran_example[1].strip().splitlines()[-1].split()[-1])
    assert clean > 0.8
    assert "median_min_eps" in ran_example[1]  # the printed summary is whole, not "..." in its place


def test_the_python_model_command_runs(ran_example: tuple[Path, str], monkeypatch: pytest.MonkeyPatch) -> None:
    folder = ran_example[0]
    monkeypatch.chdir(folder)
    monkeypatch.setenv("ADVBENCH_CACHE", str(folder / "cache"))
    command = _commands()[0]
    assert "checkpoint=mynet.pt" in command  # the weights the Python example trained and saved
    result = CliRunner().invoke(main, command)
    assert result.exit_code == 0, result.output
    records = pd.read_parquet(next((folder / "advbench-out" / "records").glob("*.parquet")))
    assert set(records["model_label"]) == {"mynet.py:Net"}
    assert records["clean_correct"].mean() > 0.8
    assert (records["success_at_budget"] == (records["min_eps"] <= records["eps_budget"])).all()


@pytest.mark.parametrize("index", [1, 2], ids=["torchvision", "robustbench"])
def test_the_other_command_lines_compose(index: int) -> None:
    """They need weights a test cannot download; their options must still be the catalogue's.
    The RobustBench name is checked against RobustBench's zoo: without its distribution (the
    README's install has none), composing says how to install it."""
    command = _commands()[index]
    overrides = [arg for arg in command[1:] if not arg.startswith("checkpoint=")]
    missing = robustbench_missing() if command[1] == "model=robustbench" else None
    if missing is not None:
        with pytest.raises(AdvbenchError) as refused:
            compose_config("config", overrides)
        assert str(refused.value) == missing
        return
    cfg = compose_config("config", overrides)
    option = command[1].split("=", 1)[1]  # model=robustbench's model.name is the zoo's name, not the option's
    assert cfg.model._target_ == option_data("model", option)["_target_"]
