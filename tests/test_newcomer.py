"""What a newcomer meets first: an offline download, plot's default folder, piped listings, run's help."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest
from click.testing import CliRunner

from advbench.cli.main import main
from advbench.core.errors import AdvbenchError


def _no_network(*args, **kwargs):
    raise urllib.error.URLError(OSError(-2, "Name or service not known"))


def test_cifar10_download_without_network_is_one_line_naming_dataset_root(tmp_path, monkeypatch) -> None:
    pytest.importorskip("torchvision")
    from advbench.robustness.data.cifar10 import CIFAR10

    monkeypatch.setattr(urllib.request, "urlopen", _no_network)
    monkeypatch.setattr(urllib.request.OpenerDirector, "open", _no_network)
    with pytest.raises(AdvbenchError) as caught:
        CIFAR10(str(tmp_path), download=True)
    message = str(caught.value)
    assert "\n" not in message
    assert "download failed" in message and "no network" in message and "Name or service not known" in message
    assert "dataset.root=" in message


def test_cifar10_download_failure_through_the_cli_is_one_line(tmp_path, monkeypatch) -> None:
    pytest.importorskip("torchvision")
    monkeypatch.setattr(urllib.request, "urlopen", _no_network)
    monkeypatch.setattr(urllib.request.OpenerDirector, "open", _no_network)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["run", "dataset=cifar10", "dataset.download=true",
                                       f"dataset.root={tmp_path / 'data'}", f"out_dir={tmp_path / 'out'}"])
    assert result.exit_code == 1, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "no network" in lines[0] and "dataset.root=" in lines[0], result.output


def test_plot_writes_outside_the_committed_results_folder_by_default() -> None:
    from advbench.cli.main import PLOTS, plot

    out = next(p for p in plot.params if p.name == "out_dir")
    assert str(out.default) == PLOTS == "advbench-out/plots"
    text = CliRunner().invoke(main, ["plot", "--help"]).output
    text = "".join(text.split())
    assert "[default:advbench-out/plots]" in text and "committedresults/" in text


@pytest.mark.parametrize("args", [["list"], ["weights", "list"]], ids=" ".join)
def test_listings_in_a_pipe_stay_readable(args) -> None:
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert max(len(line) for line in result.output.splitlines()) <= 120


def test_weights_list_says_what_checked_means() -> None:
    output = CliRunner().invoke(main, ["weights", "list"]).output
    assert "checked: what `advbench weights fetch` verified" in " ".join(output.split())
    assert '"not yet": no file yet' in " ".join(output.split())
    assert "checked:  " not in output, "no empty 'checked' value"


def test_run_help_shows_an_example_and_the_everyday_keys() -> None:
    text = CliRunner().invoke(main, ["run", "--help"]).output
    assert "advbench run attack=pgd" in text
    for key in ("checkpoint=", "device=", "out_dir=", "label=", "seed=", "-m "):
        assert key in text, key
