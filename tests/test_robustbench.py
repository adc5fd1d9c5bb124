"""RobustBench's model zoo as a model kind: `model=robustbench model.name=<name>`.

RobustBench's PreActResNet-18 entry `Wong2020Fast` (CIFAR-10, Linf; about 0.1 s a forward pass
of 8 images on one CPU thread, the cheapest CIFAR-10 Linf architecture of the zoo with the
ResNet-18s) is built with random weights and saved in RobustBench's layout under the test's
folder; a white-box, a score-based and a decision-based cell then run from the command line
on fake CIFAR-10 files. Nothing downloads: `advbench weights fetch robustbench:...` is run with
RobustBench's downloader replaced. The tests that need robustbench are skipped, saying why,
only where it does not import (CI installs the extra).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from click.testing import CliRunner
from hydra.utils import instantiate

from advbench.cli.config import compose_config
from advbench.cli.main import main
from advbench.core.errors import AdvbenchError
from advbench.robustness.defenses.zoo import load_defended_model
from advbench.robustness.models import robustbench_zoo
from advbench.robustness.models.user_models import source_identity


def _missing() -> str | None:
    try:
        robustbench_zoo.import_robustbench()
    except AdvbenchError as exc:
        return str(exc)
    return None


MISSING = _missing()
needs_robustbench = pytest.mark.skipif(MISSING is not None, reason=f"robustbench does not import: {MISSING}")
pytestmark = pytest.mark.usefixtures("one_thread")
NAME = "Wong2020Fast"
TINY = ["search.enabled=false", "threads=1", "batch_size=8"]
CELLS = {
    "white": ["attack=fgsm"],
    "score": ["attack=square", "attack.params.n_queries=20", "threat=linf_score"],
    "decision": ["attack=hsj", "attack.params.max_queries=50", "attack.params.init_evals=10",
                 "attack.params.max_evals=20", "attack.params.checkpoints=[50]", "threat=l2_decision"],
}


def _zoo_net() -> torch.nn.Module:
    utils = robustbench_zoo.import_robustbench()
    torch.manual_seed(0)
    return utils.all_models[utils.BenchmarkDataset("cifar10")][utils.ThreatModel("Linf")][NAME]["model"]().eval()


@pytest.fixture(scope="module")
def zoo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A RobustBench model folder holding `cifar10/Linf/Wong2020Fast.pt` (random weights)."""
    root = tmp_path_factory.mktemp("robustbench")
    (root / "cifar10" / "Linf").mkdir(parents=True)
    torch.save(_zoo_net().state_dict(), root / "cifar10" / "Linf" / f"{NAME}.pt")
    return root


def _common(zoo: Path, cifar: Path, out: Path, name: str = NAME) -> list[str]:
    return ["model=robustbench", f"model.name={name}", f"model.model_dir={zoo}", "dataset=cifar10",
            f"dataset.root={cifar}", f"out_dir={out}", *TINY]


def _run(argv: list[str]) -> tuple[int, list[str]]:
    result = CliRunner().invoke(main, argv)
    assert "Traceback" not in result.output, result.output
    return result.exit_code, [ln for ln in result.output.splitlines() if ln.strip()]


def _error(argv: list[str]) -> str:
    code, lines = _run(argv)
    errors = [ln for ln in lines if ln.startswith("Error:")]
    assert code == 1 and len(errors) == 1, lines
    return errors[0]


@needs_robustbench
def test_robustbench_cells_end_to_end(zoo_dir: Path, fake_cifar_root: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    for cell in CELLS.values():
        code, lines = _run(["run", *_common(zoo_dir, fake_cifar_root, out), *cell])
        assert code == 0, lines
    parts = sorted((out / "records").glob("*.parquet"))
    frame = pd.concat([pd.read_parquet(p).assign(part=p.name) for p in parts], ignore_index=True)
    assert frame["part"].nunique() == 3 and set(frame["knowledge"]) == {"white", "score", "decision"}
    assert (frame["success_at_budget"] == (frame["min_eps"] <= frame["eps_budget"])).all(), \
        "success_at_budget ⇔ min_eps <= eps_budget"
    assert len(frame) == 3 * 4 and set(frame["model_label"]) == {NAME} and set(frame["model"]) == {NAME}


@needs_robustbench
def test_robustbench_model_is_the_zoo_net_on_raw_pixels(zoo_dir: Path, fake_cifar_root: Path, tmp_path: Path) -> None:
    """The zoo's own network with the file's weights, no normalisation added in front of it; the
    cell key's weights part names the entry and the file's sha256."""
    cfg = compose_config("config", _common(zoo_dir, fake_cifar_root, tmp_path))
    model = load_defended_model(cfg, instantiate(cfg.dataset))
    x = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), _zoo_net()(x), rtol=0, atol=0)
    assert model.arch == NAME and float(model.std.min()) == 1.0 and float(model.mean.abs().max()) == 0.0
    ident = source_identity(cfg.model)
    assert ident["robustbench"] == f"cifar10/Linf/{NAME}" and len(ident["weights_sha256"]) == 64


@needs_robustbench
def test_robustbench_errors_are_one_line(zoo_dir: Path, fake_cifar_root: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    absent = _error(["run", *_common(empty, fake_cifar_root, tmp_path / "out"), "attack=fgsm"])
    assert absent == (f"Error: RobustBench model '{NAME}' (cifar10 Linf) needs its weights at "
                      f"'{empty / 'cifar10' / 'Linf' / f'{NAME}.pt'}'; fetch them (online) with: "
                      f"advbench weights fetch robustbench:{NAME} --dataset cifar10 --threat Linf")
    unknown = _error(["run", *_common(zoo_dir, fake_cifar_root, tmp_path / "out", "Wong2020Fest"), "attack=fgsm"])
    assert unknown.startswith("Error: unknown RobustBench model 'Wong2020Fest' for cifar10 Linf; close matches: Wong2020Fast")
    unnamed = _error(["run", "model=robustbench", "dataset=cifar10", f"dataset.root={fake_cifar_root}", "attack=fgsm"])
    assert "needs model.name=" in unnamed
    digits = _error(["run", "model=robustbench", f"model.name={NAME}", "attack=fgsm"])
    assert "RobustBench's data sets" in digits and "'digits'" in digits
    assert "model.threat must be one of Linf, L2, corruptions" in _error(
        ["run", *_common(zoo_dir, fake_cifar_root, tmp_path / "out"), "model.threat=linf", "attack=fgsm"])


@needs_robustbench
def test_weights_fetch_robustbench_uses_its_downloader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Online: the file RobustBench's downloader writes lands in the layout once it loads.
    Offline: one line, and nothing where model=robustbench looks."""
    utils = robustbench_zoo.import_robustbench()
    monkeypatch.setenv("ADVBENCH_WEIGHTS", str(tmp_path / "weights"))
    target = tmp_path / "weights" / "robustbench" / "cifar10" / "Linf" / f"{NAME}.pt"

    def offline(gdrive_id: str, fname_save: str) -> None:
        raise ConnectionError("Failed to establish a new connection")

    monkeypatch.setattr(utils, "download_gdrive_new", offline)
    error = _error(["weights", "fetch", f"robustbench:{NAME}"])
    assert error.startswith(f"Error: robustbench:{NAME}: fetching it failed (ConnectionError") and str(target) in error
    assert not target.exists() and list(target.parent.iterdir()) == []

    monkeypatch.setattr(utils, "download_gdrive_new", lambda gdrive_id, fname_save: torch.save(
        _zoo_net().state_dict(), fname_save))
    code, lines = _run(["weights", "fetch", f"robustbench:{NAME}", "--dataset", "cifar10", "--threat", "Linf"])
    assert code == 0 and lines == [f"robustbench:{NAME}: {target} (use it with model=robustbench model.name={NAME})"]
    assert target.is_file() and [p.name for p in target.parent.iterdir()] == [target.name]


def test_robustbench_missing_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    find_spec = importlib.util.find_spec
    monkeypatch.delitem(sys.modules, "robustbench.utils", raising=False)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "robustbench" else find_spec(name, *a))
    with pytest.raises(AdvbenchError, match=r"^model=robustbench needs the robustbench package: pip install -e '\.\[robustbench\]'$"):
        robustbench_zoo.import_robustbench()


def test_advbench_imports_robustbench_only_for_model_robustbench() -> None:
    code = ("import sys, advbench.cli.main, advbench.cli.weights, advbench.robustness.defenses.zoo, "
            "advbench.robustness.evaluation.cell, advbench.robustness.models.robustbench_zoo; "
            "assert not [m for m in sys.modules if m.split('.')[0] in ('robustbench', 'timm')], 'imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
