"""What a newcomer met, part 3: the console line of a cell says what its table says, `-h` is the
help, one line per warning and per missing file, one row name per network, a seeded README."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from click.testing import CliRunner
from test_api import NET_SOURCE, QUICK, _net
from torch import nn

import advbench
from advbench.cli.main import main
from advbench.core.errors import AdvbenchError

ROOT = Path(__file__).resolve().parents[1]


def _cell_lines(text: str) -> list[str]:
    """The console's one line per cell (`<cell>: clean ..., ... samples`)."""
    return [line for line in text.splitlines() if ": clean " in line and " samples" in line]


def test_a_targeted_cells_line_gives_the_success_rate_its_table_gives(digits_tensors, capsys) -> None:
    """Its table and figures give the targeted success rate; the line gave adversarial accuracy."""
    x, y = digits_tensors[2][:40], digits_tensors[3][:40]
    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
    records = advbench.evaluate(net, (x, y), attack="fgsm", threat="linf_targeted", eps=0.3,
                                overrides=["search.max_probes=2"])
    row = advbench.summary(records).iloc[0]
    assert row["goal"] == "targeted" and row["asr"] != row["accuracy"]  # the two numbers tell apart
    (line,) = _cell_lines(capsys.readouterr().err)
    assert f"targeted attack success rate {row['asr']:.1%}," in line
    assert "accuracy" not in line.split(": clean ", 1)[1].split(",", 1)[1]


@pytest.mark.parametrize(("eps", "shown"), [(0.2, False), (0.002, True)])
def test_certified_accuracy_is_on_the_line_only_where_the_bound_proves_a_sample(trained_digits_cache: Path, tmp_path,
                                                                                 eps: float, shown: bool) -> None:
    """A naturally trained net IBP can bound certifies nothing at the budget: 'certified 0.0%' was
    printed as if it meant something; at a tiny budget it proves most samples, and says so."""
    result = CliRunner().invoke(main, ["run", "attack=fgsm", f"cache_dir={trained_digits_cache}", f"threat.eps={eps}",
                                       "dataset.n_samples=20", "search.enabled=false", f"out_dir={tmp_path}"])
    assert result.exit_code == 0, result.output
    records = pd.read_parquet(next((tmp_path / "records").glob("*.parquet")))
    certified = float(records["certified"].mean())
    (line,) = _cell_lines(result.output)
    if shown:
        assert certified > 0 and f"certified (IBP bound) {certified:.1%}," in line
    else:
        assert certified == 0 and ", certified" not in line


@pytest.mark.parametrize("command", [["run"], ["train"], ["iqa", "run"], ["uap", "train"], ["uap", "eval"],
                                     ["uap", "stability"], ["plot"]], ids=" ".join)
def test_dash_h_is_the_help_of_every_command(command: list[str]) -> None:
    """`-h` went to Hydra on the commands that forward their arguments: its whole app help, seconds later."""
    short, long = (CliRunner().invoke(main, [*command, flag], prog_name="advbench") for flag in ("-h", "--help"))
    assert short.exit_code == long.exit_code == 0, short.output
    assert short.output == long.output and short.output.startswith(f"Usage: advbench {' '.join(command)} ")


def test_dash_h_after_overrides_is_still_the_help() -> None:
    result = CliRunner().invoke(main, ["run", "attack=pgd", "-h"], prog_name="advbench")
    assert result.exit_code == 0 and result.output.startswith("Usage: advbench run ")


WARNS = """
import warnings
from advbench.core.errors import AdvbenchWarning
{setup}
warnings.warn("masked gradients", AdvbenchWarning)
warnings.warn("other", UserWarning)
"""


@pytest.mark.parametrize("setup", [
    "from click.testing import CliRunner\nfrom advbench.cli.main import main\nCliRunner().invoke(main, ['list', 'attack'])",
    "from advbench.core.resume import python_warnings, warn\nwith python_warnings():\n    warn('near chance')",
], ids=["command line", "python api"])
def test_advbench_warnings_are_one_plain_line(setup: str) -> None:
    """Python's default printed '<file>:<line>: AdvbenchWarning: ...' and the source of advbench's
    own `warn(...)` call; other categories keep Python's format."""
    done = subprocess.run([sys.executable, "-c", WARNS.format(setup=setup)], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert "Warning: masked gradients" in lines
    assert ("Warning: near chance" in lines) == ("python_warnings" in setup)
    assert not any("AdvbenchWarning" in line or "warn(" in line for line in lines), lines
    assert any(line.endswith("UserWarning: other") for line in lines), lines


def test_evaluate_warns_in_one_line_naming_the_cell(digits_tensors) -> None:
    script = ("import torch, advbench\nfrom torch import nn\ntorch.manual_seed(0)\n"
              "x, y = torch.rand(12, 1, 8, 8), torch.arange(12) % 3\n"
              "advbench.evaluate(nn.Sequential(nn.Flatten(), nn.Linear(64, 3)), (x, y), attack='fgsm', eps=0.1,"
              " overrides=['search.enabled=false'])\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    warned = [line for line in done.stderr.splitlines() if "near chance" in line]
    assert len(warned) == 1 and warned[0].startswith("Warning: tensors/Sequential/fgsm "), done.stderr
    assert ".py:" not in done.stderr


def test_one_network_is_one_row_name_from_the_api_and_the_command_line(tmp_path: Path, monkeypatch,
                                                                       capsys) -> None:
    """The API's rows read 'net.py:Net+none' (its line 'net.py:Net'), the command line's 'net.py:Net+natural'."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ADVBENCH_CACHE", str(tmp_path / "cache"))
    (tmp_path / "net.py").write_text(NET_SOURCE)
    cli = CliRunner().invoke(main, ["run", "model=python", "model.target=net.py:Net", "attack=fgsm",
                                    f"out_dir={tmp_path / 'cli'}", *QUICK])
    assert cli.exit_code == 0, cli.output
    capsys.readouterr()
    api = advbench.evaluate(advbench.Model(_net(tmp_path / "net.py"), label="net.py:Net"), "digits", attack="fgsm", overrides=QUICK)
    lines = _cell_lines(cli.output) + _cell_lines(capsys.readouterr().err)
    records = pd.read_parquet(next((tmp_path / "cli" / "records").glob("*.parquet")))
    assert set(records["defense"]) == {"natural"} and set(api["defense"]) == {"none"}  # two defenses, one name
    for frame in (records, api):
        assert list(advbench.summary(frame)["row"]) == ["net.py:Net"]
    assert [line.split("/")[1] for line in lines] == ["net.py:Net", "net.py:Net"]


def test_a_defense_that_adds_something_stays_in_the_row_name() -> None:
    from advbench.robustness.models.given import AS_GIVEN
    from advbench.robustness.naming import PLAIN, row_name

    assert AS_GIVEN in PLAIN
    assert [row_name("mine", d) for d in ("natural", "none", "pgd_at", "jpeg")] == \
        ["mine", "mine", "mine+pgd_at", "mine+jpeg"]
    assert row_name("trades", "trades") == "trades"


def test_a_missing_metric_weights_file_names_the_command_that_fetches_it(tmp_path: Path) -> None:
    from advbench.cli.metrics import build_metric

    with pytest.raises(AdvbenchError) as caught:
        build_metric("paq2piq", weights=str(tmp_path / "paq2piq.pth"))
    assert "run `advbench weights fetch paq2piq`" in str(caught.value) and "weights list" not in str(caught.value)


def test_the_metrics_named_for_a_fetch_are_those_the_catalogue_fetches() -> None:
    from advbench.cli.weights import catalogue
    from advbench.quality.metrics.author_weights import FETCHED

    fetched = {e.metric for e in catalogue().values() if e.metric is not None and e.option == "weights"}
    assert set(FETCHED) == fetched
    assert all(catalogue()[name].metric == name for name in FETCHED)  # the fetch takes the metric's name


def test_a_missing_checkpoint_is_named_before_missing_data(tmp_path: Path, monkeypatch) -> None:
    """The README's torchvision line without data or weights named only the data."""
    pytest.importorskip("torchvision")
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["run", "model=torchvision", "model.arch=resnet18", "checkpoint=resnet18.pt",
                                       "dataset=cifar10", f"dataset.root={tmp_path / 'data'}"])
    assert result.exit_code == 1
    (line,) = [line for line in result.output.splitlines() if line.strip()]
    assert line.startswith("Error: checkpoint 'resnet18.pt' not found"), line


def test_the_readme_training_snippet_trains_the_same_weights_every_run() -> None:
    """Unseeded, its clean accuracy changed from one run to the next."""
    text = (ROOT / "README.md").read_text(encoding="utf-8").split("### Benchmark your own model", 1)[1]
    model_file, script = re.findall(r"```python\n(.*?)\n```", text, re.S)[:2]
    training = script.split("torch.save(", 1)[0].replace("from mynet import Net\n", "")
    weights = []
    for _ in range(2):
        namespace: dict = {}
        exec(compile(model_file + "\n" + training, "README.md", "exec"), namespace)  # noqa: S102 - the README's code
        weights.append(namespace["net"].state_dict())
    for key, value in weights[0].items():
        assert torch.equal(value, weights[1][key]), key


def test_the_test_command_says_why_each_test_was_skipped(tmp_path: Path) -> None:
    """Under `-q` the skips were a count without reasons; the project's pytest options add `-rs`."""
    (tmp_path / "test_skips.py").write_text("import pytest\n\n\ndef test_x():\n    pytest.skip('needs the pyiqa package')\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-c", str(ROOT / "pyproject.toml"), "--rootdir",
                           str(tmp_path), "-p", "no:cacheprovider", str(tmp_path / "test_skips.py")],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert "1 skipped" in done.stdout, done.stdout + done.stderr
    assert re.search(r"SKIPPED \[1\] .*test_skips\.py:5: needs the pyiqa package", done.stdout), done.stdout
