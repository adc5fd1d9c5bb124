"""What a new user meets first: the README's commands and the output of a first run."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from advbench.cli.config import compose_config
from advbench.cli.spec_builder import target_spec
from advbench.robustness.defenses.trained import ensure_checkpoint

README = Path(__file__).resolve().parents[1] / "README.md"


def _setup_command() -> list[str]:
    """The one-line set-up command of README's 'Set up and run', split into words."""
    section = README.read_text(encoding="utf-8").split("## Set up and run", 1)[1]
    block = re.search(r"```bash\n(.*?)\n```", section, re.S)
    assert block, "README's set-up section has no bash block"
    return shlex.split(block.group(1))


def test_readme_setup_does_not_overwrite_committed_results() -> None:
    words = _setup_command()
    plots = [words[i + 1] for i, w in enumerate(words) if w == "--out"]
    assert plots, "the set-up command draws its figures somewhere explicit"
    for out in plots:
        assert not Path(out).parts or Path(out).parts[0] != "results", f"set-up writes into committed {out}"
    assert not any(w.startswith(("out_dir=results", "records_dir=results")) for w in words)


def test_readme_says_how_much_results_vary() -> None:
    text = README.read_text(encoding="utf-8")
    assert "How close your numbers will be" in text and "decision boundary" in text


def test_training_on_first_use_says_what_and_why_on_stderr(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = compose_config("config", ["defense=natural", "defense.recipe.epochs=2", f"cache_dir={tmp_path}"])
    path = ensure_checkpoint(target_spec(cfg))
    err = capsys.readouterr().err
    assert "training natural small_cnn on digits (first use: no cached checkpoint at" in err
    assert str(path) in err
    # not a terminal here: rich draws no bar, so every epoch gets its own line
    assert re.search(r"epoch 1/2: loss \d+\.\d{3}, [\d.]+ s", err) and "epoch 2/2" in err
    ensure_checkpoint(target_spec(cfg))
    assert "training" not in capsys.readouterr().err, "a cached model is loaded silently"


def test_table1_headers_name_amplitudes_and_numbers_share_one_format() -> None:
    import pandas as pd

    from advbench.quality.uap.evaluation import _seconds, table1_display, table1_markdown

    table = pd.DataFrame([{"attack": "UAP", "0.02": 0.02, "0.6": 0.9, "CPU time": _seconds(0.0373)},
                          {"attack": "MADC", "0.02": 7.73, "0.6": 7.7, "CPU time": _seconds(123.66)}])
    md = table1_markdown(table1_display(table, ["0.02", "0.6"]), "caption").splitlines()
    assert md[2] == "| attack | a = 0.02 | a = 0.6 | CPU time |"
    assert md[4] == "| UAP | 0.02 | 0.90 | 0.0373 s |"
    assert md[5] == "| MADC | 7.73 | 7.70 | 124 s |"
    assert [_seconds(s) for s in (0.0, 2.1, 45.25, 1500.0)] == ["0 s", "2.10 s", "45.2 s", "1500 s"]


def test_table2_numbers_have_fixed_decimals(tmp_path: Path) -> None:
    from io import StringIO

    import pandas as pd
    from rich.console import Console

    from advbench.quality.stability.report import write_table2

    table = pd.DataFrame({"metric": ["spaq", "vsfa"], "stability": [2.55, -3.8], "source": "stored areas",
                          "loss_lo": [0.104141, 0.104141], "loss_hi": [0.36, 0.36], "KonIQ": [0.9, float("nan")]})
    write_table2(table, tmp_path, Console(file=StringIO()))
    rows = (tmp_path / "table2.md").read_text(encoding="utf-8").splitlines()[-2:]
    assert rows == ["| spaq | 2.55 | stored areas | 0.1041 | 0.3600 | 0.900 |",
                    "| vsfa | -3.80 | stored areas | 0.1041 | 0.3600 |  |"]


def test_list_in_a_pipe_keeps_each_option_on_one_line() -> None:
    """In a pipe each option is one line of at most 100 columns: its name and the start of its
    description (cut with " …"), so `grep` finds both; a footer says how to see the whole text."""
    from click.testing import CliRunner

    from advbench.cli.main import main
    from advbench.core.catalog import describe, group_options

    result = CliRunner().invoke(main, ["list", "attack"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert max(len(line) for line in lines) <= 100
    cut = 0
    for option in group_options("attack"):
        rows = [line for line in lines if line.count("│") > 3 and line.split("│")[2].strip() == option]
        assert len(rows) == 1, f"{option} is not on exactly one line"
        shown = rows[0].split("│")[3].strip()
        whole = " ".join(describe("attack", option).split())
        assert shown == whole or (shown.endswith(" …") and whole.startswith(shown[:-2])), option
        cut += shown != whole
    assert cut, "the attacks' long descriptions are cut to fit"
    assert lines[-1] == "whole descriptions: advbench list attack --full"


def test_list_full_prints_every_description_whole_one_option_per_line() -> None:
    from click.testing import CliRunner

    from advbench.cli.main import main
    from advbench.core.catalog import describe, group_options

    result = CliRunner().invoke(main, ["list", "attack", "--full"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    for option in group_options("attack"):
        row = next(line for line in lines if f"│ {option} " in line)
        assert describe("attack", option) in row, f"{option}'s description is wrapped or cut"
    assert "--full" not in result.output


@pytest.mark.parametrize("columns", ["60", "140"])
def test_list_in_a_pipe_follows_columns(columns: str) -> None:
    from click.testing import CliRunner

    from advbench.cli.main import main
    from advbench.core.catalog import group_options

    lines = CliRunner().invoke(main, ["list", "attack"], env={"COLUMNS": columns}).output.splitlines()
    assert max(len(line) for line in lines) <= int(columns)
    # each option names exactly one row in the option column (descriptions may use the same words: FAB's "boundary")
    option_cells = [cells[2].strip() for line in lines if len(cells := line.split("│")) > 3]
    assert all(option_cells.count(o) == 1 for o in group_options("attack"))
