"""What a user changes or brings is followed and said: a data keyword against a `dataset=` override, a user's
data set, model or metric failing while advbench runs it, a user's substitute keyed by what it computes, and
file sizes as a user reads them."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from torch import nn

import advbench
from advbench.cli.main import main
from advbench.cli.weights import rows
from advbench.core.errors import AdvbenchError

QUIET = ["search.enabled=false"]


def _digits_net() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 10))


# ---- the data keyword and a dataset= override ----------------------------------------------------------

@pytest.mark.parametrize("call", [advbench.evaluate, advbench.evaluate_preset])
def test_a_data_set_name_and_a_dataset_override_are_refused(call) -> None:
    """`data="digits"` beside `dataset=cifar10` ran CIFAR-10 without a word: the caller asked for two data sets."""
    with pytest.raises(AdvbenchError, match="data='digits' and override 'dataset=cifar10' both set dataset: give it once"):
        call(_digits_net(), "digits", overrides=["dataset=cifar10"])


def test_a_dataset_override_alone_chooses_and_dataset_values_apply(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ADVBENCH_DATA", str(tmp_path))  # no CIFAR-10 here: the override chose it
    with pytest.raises(AdvbenchError, match="CIFAR-10 not found"):
        advbench.evaluate(_digits_net(), overrides=["dataset=cifar10"])
    records = advbench.evaluate(_digits_net(), "digits", attack="fgsm", overrides=["dataset.n_samples=3", *QUIET])
    assert len(records) == 3 and set(records["dataset"]) == {"digits"}


def test_weights_list_shows_a_small_file_in_kb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """NIQE's 12 kB parameter file read '0.0 MB', as if it were empty; sizes of 1 MB and more stay in MB."""
    monkeypatch.setenv("ADVBENCH_WEIGHTS", str(tmp_path))
    niqe = next(target for entry, target, _, _ in rows() if entry.name == "niqe")
    listed = CliRunner().invoke(main, ["weights", "list"])
    assert listed.exit_code == 0, listed.output
    niqe_line = next(line for line in listed.output.splitlines() if line.startswith("niqe "))
    assert "size: 12.0 kB" in niqe_line  # the published size, while absent
    niqe.parent.mkdir(parents=True, exist_ok=True)
    niqe.write_bytes(b"\0" * 12_345)
    listed = CliRunner().invoke(main, ["weights", "list"])
    niqe_line = next(line for line in listed.output.splitlines() if line.startswith("niqe "))
    assert "size: 12.3 kB" in niqe_line and "0.0 MB" not in listed.output
    assert "size: 97.8 MB" in listed.output  # torchvision's resnet50, published size
