"""What a user changes or brings is followed and said: a data keyword against a `dataset=` override, a user's
data set, model or metric failing while advbench runs it, a user's substitute keyed by what it computes, and
file sizes as a user reads them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from test_errors_part3 import one_line
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


# ---- a user's data set or model failing while advbench runs it ------------------------------------------

@pytest.fixture
def user_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An ADVBENCH_CONF folder (dataset/) and the working folder, importable, in tmp_path."""
    (tmp_path / "conf" / "dataset").mkdir(parents=True)
    monkeypatch.setenv("ADVBENCH_CONF", str(tmp_path / "conf"))
    monkeypatch.setenv("ADVBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _run(*argv: str):  # noqa: ANN202
    return CliRunner().invoke(main, ["run", *argv, "dataset.n_samples=2", *QUIET, "threads=1", "attack=fgsm"])


DATA_OPTION = "_target_: {module}.Data\nname: mine\nn_samples: null\nbudgets:\n  linf: 0.2\n  l2: 0.8\n"


@pytest.mark.parametrize(("body", "said"), [
    ("import sys\n\n\nclass Data:\n    def __init__(self, **kw):\n        sys.exit(3)\n",
     "_target_ 'exits_built.Data': building it failed: exited with status 3"),
    ("import sys\n\nsys.exit(3)\n", "_target_ 'exits_built.Data': importing exits_built failed: exited with status 3"),
    ("class Data:\n    def __init__(self, **kw):\n        raise OSError('no images under /data')\n",
     "_target_ 'exits_built.Data': building it failed: OSError: no images under /data"),
], ids=["exits-when-built", "exits-on-import", "raises-when-built"])
def test_a_data_set_of_ones_own_that_exits_or_raises_is_one_line(user_code: Path, body: str, said: str) -> None:
    """A run that built it ended with the data set's status and no word (or a traceback for an exception)."""
    (user_code / "exits_built.py").write_text(body)
    (user_code / "conf" / "dataset" / "mine.yaml").write_text(DATA_OPTION.format(module="exits_built"))
    try:
        one_line(_run("dataset=mine"), said)
        with pytest.raises(AdvbenchError, match=said.replace("(", r"\(").replace(")", r"\)")):
            advbench.evaluate(_digits_net(), "mine", overrides=QUIET)
    finally:
        sys.modules.pop("exits_built", None)


def test_a_model_of_ones_own_that_exits_on_its_first_pass_is_one_line(user_code: Path) -> None:
    """`model=python` whose forward calls sys.exit: the run ended with status 4 and no word."""
    (user_code / "exits_forward.py").write_text(
        "import sys\n\nfrom torch import nn\n\n\nclass Net(nn.Module):\n    def forward(self, x):\n"
        "        sys.exit(4)\n")
    one_line(_run("model=python", "model.target=exits_forward.py:Net"),
             "model python 'exits_forward.py:Net' fails on the data set's 1x8x8 input: exited with status 4")


# ---- a Python substitute keyed by what it computes ------------------------------------------------------

SUBSTITUTE = '''import os

import torch
from torch import nn

from subhelp import shift

SCALE = float(os.environ.get("SUB_SCALE", "1"))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(10, 64, generator=torch.Generator().manual_seed(0)))

    def forward(self, x):
        return shift(x.flatten(1) @ self.weight.T) * SCALE
'''


def test_a_python_substitute_is_keyed_by_its_code_and_behaviour(user_code: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A transfer cell's Python substitute was keyed by its config and its own file only: a flag set at run time
    or an edited helper module returned the old records ("skip: records exist"). Unchanged, it is still reused."""
    (user_code / "subnet.py").write_text(SUBSTITUTE)
    (user_code / "subhelp.py").write_text("def shift(z):\n    return z\n")
    records = user_code / "out" / "records"

    def run() -> str:
        sys.modules.pop("subhelp", None)  # a new process imports the helper anew
        result = _run("threat.knowledge=transfer", "substitute=digits_seed1", "model@substitute.model=python",
                      "substitute.model.target=subnet.py:Net", f"out_dir={user_code / 'out'}")
        assert result.exit_code == 0, result.output
        return result.output

    try:
        run()
        assert "skip" in run() and len(list(records.glob("*.parquet"))) == 1  # the same substitute: reused
        monkeypatch.setenv("SUB_SCALE", "-1")  # a module-level flag: no file changes, its gradients flip
        assert "skip" not in run() and len(list(records.glob("*.parquet"))) == 2
        (user_code / "subhelp.py").write_text("def shift(z):\n    return z + z.roll(1, dims=1)\n")
        assert "skip" not in run() and len(list(records.glob("*.parquet"))) == 3
    finally:
        sys.modules.pop("subhelp", None)


# ---- a user's metric failing while a UAP is trained or evaluated ----------------------------------------

PICKY = '''import sys

from torch import nn


class Picky(nn.Module):
    """Mean brightness, until its call `fail_after` + 1 or an image `fail_size` pixels wide: then it raises or exits."""

    def __init__(self, fail_after=None, fail_size=None, exits=False):
        super().__init__()
        self.fail_after, self.fail_size, self.exits, self.calls = fail_after, fail_size, exits, 0

    def forward(self, x):
        self.calls += 1
        if (self.fail_after is not None and self.calls > self.fail_after) or x.shape[-1] == self.fail_size:
            if self.exits:
                sys.exit(5)
            raise ValueError("broke mid-way")
        return x.mean(dim=(1, 2, 3))
'''
METRIC = ["metric=python", "metric.target=picky.py:Picky", "metric.higher_better=true", "progress=false",
          "device=cpu", "out_dir=out"]


@pytest.fixture
def picky(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "picky.py").write_text(PICKY)
    return tmp_path


def _uap(*argv: str):  # noqa: ANN202
    return CliRunner().invoke(main, [*argv, *METRIC])


@pytest.mark.parametrize(("exits", "said"), [(False, "ValueError: broke mid-way"), (True, "exited with status 5")])
def test_uap_train_with_a_metric_failing_mid_training_is_one_line(picky: Path, exits: bool, said: str) -> None:
    """A traceback (or a run ending with the metric's status) where the metric broke on its second step."""
    one_line(_uap("uap", "train", "subset=2", "uap.batch_size=1", "uap.epochs=1", "uap.size=32",
                  f"metric.kwargs={{fail_after: 1, exits: {str(exits).lower()}}}"),
             f"metric 'python': training the UAP on 2 images failed: {said}")
    assert not list(picky.rglob("*.pt"))  # no UAP saved from a training that broke


def test_uap_eval_with_a_failing_metric_is_one_line(picky: Path) -> None:
    uap = picky / "u.pt"
    torch.save({"uap": torch.full((3, 32, 32), 0.05), "meta": "{}"}, uap)
    one_line(_uap("uap", "eval", f"perturbation={uap}", "methods=[uap]", "n_images=2", "size=32",
                  "metric.kwargs={fail_after: 0}"),
             "metric 'python': scoring 2 images with and without UAP u.pt failed: ValueError: broke mid-way")
    assert not list(picky.rglob("*.parquet"))


def test_a_cell_training_its_uap_on_a_failing_metric_is_one_line(picky: Path) -> None:
    """iqa run attack=uap trains the perturbation on 256-pixel photo crops, where this metric breaks."""
    result = _uap("iqa", "run", "attack=uap", "attack.params.n_train=2", "attack.params.epochs=1",
                  "attack.params.batch_size=1", "size=32", "n_images=2", "metric.kwargs={fail_size: 256}")
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert result.output.splitlines() == ["training uap on 2 photo crops, 1 epoch(s)",  # what it set out to do
                                          "Error: metric 'python': training uap on 2 photo crops failed: "
                                          "ValueError: broke mid-way"]
    assert not list(picky.rglob("*.parquet"))
