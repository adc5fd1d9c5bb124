"""RobustBench's model zoo as a model kind: `model=robustbench model.name=<name>`.

RobustBench's PreActResNet-18 entry `Wong2020Fast` (CIFAR-10, Linf; about 0.1 s a forward pass
of 8 images on one CPU thread, the cheapest CIFAR-10 Linf architecture of the zoo with the
ResNet-18s) is built with random weights and saved in RobustBench's layout under the test's
folder; a white-box, a score-based and a decision-based cell then run from the command line
on fake CIFAR-10 files. Nothing downloads: `advbench weights fetch robustbench:...` is run with
RobustBench's downloader replaced.

The tests that need the real package run against robustbench 1.1.1 itself: here where it imports,
else in a child pytest with `.robustbench-site` first on PYTHONPATH, the folder scripts/setup.sh
installs it into (torchattacks 3.5.1, of the test extra, bundles an old copy of RobustBench's
package whose files the real one's would overwrite in one site-packages). They are skipped, saying
why, only where neither has it. A module named `robustbench` does not count (the
`robustbench_zoo.robustbench_missing` check, tested here on fake packages); the tests of what
advbench says without RobustBench always run.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pandas as pd
import pytest
import torch
from click.testing import CliRunner
from hydra.utils import instantiate

from advbench.cli.config import compose_config
from advbench.cli.main import main
from advbench.cli.spec_builder import target_spec
from advbench.core.errors import AdvbenchError
from advbench.robustness.models import robustbench_zoo
from advbench.robustness.models.user_models import source_identity
from advbench.robustness.targets import load_target


def _missing() -> str | None:
    try:
        robustbench_zoo.import_robustbench()
    except AdvbenchError as exc:
        return str(exc)
    return None


MISSING = _missing()
SIDE = Path(__file__).resolve().parents[1] / ".robustbench-site"
"""Where scripts/setup.sh installs robustbench 1.1.1 and the modules its import needs, beside the environment."""
IN_SIDE = "ADVBENCH_TEST_IN_ROBUSTBENCH_SITE"


def real_robustbench(test: Callable[..., None]) -> Callable[..., None]:
    """The test as it is where the real RobustBench imports; else a test that runs it in a child pytest with
    SIDE first on PYTHONPATH and passes only if it passed there; skipped, saying why, only without SIDE."""
    if MISSING is None:
        return test
    if os.environ.get(IN_SIDE) or not SIDE.is_dir():
        where = f"nor in {SIDE}" if os.environ.get(IN_SIDE) else f"and {SIDE} is absent (bash scripts/setup.sh makes it)"
        return pytest.mark.skip(reason=f"no RobustBench to use here ({MISSING}) {where}")(test)

    def in_side_folder() -> None:
        path = os.pathsep.join(p for p in (str(SIDE), os.environ.get("PYTHONPATH", "")) if p)
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"{__file__}::{test.__name__}"],
                              cwd=SIDE.parent, env={**os.environ, IN_SIDE: "1", "PYTHONPATH": path},
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0 and re.search(r"^1 passed", proc.stdout, re.M), proc.stdout[-4000:] + proc.stderr[-2000:]

    in_side_folder.__name__, in_side_folder.__doc__ = test.__name__, test.__doc__
    return in_side_folder


NEEDS = "Error: model=robustbench needs the robustbench package: pip install -e '.[robustbench]'"
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


@real_robustbench
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


@real_robustbench
def test_robustbench_model_is_the_zoo_net_on_raw_pixels(zoo_dir: Path, fake_cifar_root: Path, tmp_path: Path) -> None:
    """The zoo's own network with the file's weights, no normalisation added in front of it; the
    cell key's weights part names the entry and the file's sha256."""
    cfg = compose_config("config", _common(zoo_dir, fake_cifar_root, tmp_path))
    model = load_target(target_spec(cfg), instantiate(cfg.dataset))
    x = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), _zoo_net()(x), rtol=0, atol=0)
    assert model.arch == NAME and float(model.std.min()) == 1.0 and float(model.mean.abs().max()) == 0.0
    ident = source_identity(target_spec(cfg).model)
    assert ident["robustbench"] == f"cifar10/Linf/{NAME}" and len(ident["weights_sha256"]) == 64


@real_robustbench
def test_robustbench_errors_are_one_line(zoo_dir: Path, fake_cifar_root: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    absent = _error(["run", *_common(empty, fake_cifar_root, tmp_path / "out"), "attack=fgsm"])
    assert absent == (f"Error: RobustBench model '{NAME}' (cifar10 Linf) needs its weights at "
                      f"'{empty / 'cifar10' / 'Linf' / f'{NAME}.pt'}'; fetch them (online) with: "
                      f"advbench weights fetch robustbench:{NAME} --dataset cifar10 --threat Linf")
    unknown = _error(["run", *_common(zoo_dir, fake_cifar_root, tmp_path / "out", "Wong2020Fest"), "attack=fgsm"])
    assert unknown.startswith("Error: unknown RobustBench model 'Wong2020Fest' for cifar10 Linf; close matches: Wong2020Fast")


def test_robustbench_option_errors_need_no_robustbench(fake_cifar_root: Path, tmp_path: Path) -> None:
    """No name, a data set RobustBench has not, a threat it has not: said before robustbench is asked for."""
    unnamed = _error(["run", "model=robustbench", "dataset=cifar10", f"dataset.root={fake_cifar_root}", "attack=fgsm"])
    assert "needs model.name=" in unnamed
    digits = _error(["run", "model=robustbench", f"model.name={NAME}", "attack=fgsm"])
    assert "RobustBench's data sets" in digits and "'digits'" in digits
    assert "model.threat must be one of Linf, L2, corruptions" in _error(
        ["run", *_common(tmp_path / "zoo", fake_cifar_root, tmp_path / "out"), "model.threat=linf", "attack=fgsm"])


@real_robustbench
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


@pytest.fixture
def own_robustbench_modules() -> Iterator[None]:
    """`robustbench` modules in sys.modules as they were before the test, whatever it imported."""
    def ours() -> dict[str, object]:
        return {k: v for k, v in sys.modules.items() if k.split(".")[0] == "robustbench"}

    before = ours()
    for name in before:
        del sys.modules[name]
    yield
    for name in ours():
        del sys.modules[name]
    sys.modules.update(before)


def _no_distribution(monkeypatch: pytest.MonkeyPatch) -> None:
    """As where RobustBench's distribution is not installed, whether or not it is here."""
    distribution = importlib.metadata.distribution

    def without(name: str) -> importlib.metadata.Distribution:
        if name == "robustbench":
            raise importlib.metadata.PackageNotFoundError(name)
        return distribution(name)

    monkeypatch.setattr(importlib.metadata, "distribution", without)


FAKE_UTILS = "download_gdrive_new = None  # a copy of the package, not the distribution\n"


def _fake_package(site: Path, version: str | None = None, utils: str = FAKE_UTILS) -> Path:
    """A top-level `robustbench` package in `site`; with `version`, RobustBench's metadata and RECORD for it."""
    package = site / "robustbench"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "utils.py").write_text(utils)
    if version is not None:
        info = site / f"robustbench-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: robustbench\nVersion: {version}\n")
        digest = base64.urlsafe_b64encode(hashlib.sha256(utils.encode()).digest()).rstrip(b"=").decode()
        (info / "RECORD").write_text(f"robustbench/__init__.py,,\nrobustbench/utils.py,sha256={digest},{len(utils)}\n"
                                     f"robustbench-{version}.dist-info/METADATA,,\nrobustbench-{version}.dist-info/RECORD,,\n")
    return package


def test_robustbench_missing_is_one_line(monkeypatch: pytest.MonkeyPatch, own_robustbench_modules: None) -> None:
    _no_distribution(monkeypatch)
    with pytest.raises(AdvbenchError, match=r"^model=robustbench needs the robustbench package: pip install -e '\.\[robustbench\]'$"):
        robustbench_zoo.import_robustbench()


def test_a_robustbench_module_without_the_distribution_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  own_robustbench_modules: None) -> None:
    """A top-level `robustbench` that imports (torchattacks' bundled copy is one) but no RobustBench
    distribution: the one line saying how to install it, on import and already imported, and the
    copy is never imported."""
    _no_distribution(monkeypatch)
    _fake_package(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert robustbench_zoo.robustbench_missing() == NEEDS[len("Error: "):]
    with pytest.raises(AdvbenchError) as refused:
        robustbench_zoo.import_robustbench()
    assert f"Error: {refused.value}" == NEEDS and "robustbench" not in sys.modules
    import robustbench.utils  # noqa: F401  (imported before advbench asks: still refused)
    assert robustbench_zoo.robustbench_missing() == NEEDS[len("Error: "):]


def test_robustbench_of_another_release_or_with_other_files_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                       own_robustbench_modules: None) -> None:
    """The pinned release with its own files is taken; another release, or a `robustbench/utils.py`
    that is not the one its RECORD lists (another package's copy written over it), is refused."""
    own = tmp_path / "own"
    _fake_package(own, robustbench_zoo.VERSION)
    monkeypatch.syspath_prepend(str(own))
    assert robustbench_zoo.robustbench_missing() is None
    assert robustbench_zoo.import_robustbench().__file__ == str(own / "robustbench" / "utils.py")
    for name in [k for k in sys.modules if k.split(".")[0] == "robustbench"]:
        del sys.modules[name]

    (own / "robustbench" / "utils.py").write_text(FAKE_UTILS + "# torchattacks' copy\n")
    overwritten = robustbench_zoo.robustbench_missing()
    assert overwritten is not None and "\n" not in overwritten
    assert overwritten.startswith(f"the robustbench package that imports ({own / 'robustbench' / 'utils.py'}) is not "
                                  f"robustbench {robustbench_zoo.VERSION}'s own files")
    assert overwritten.endswith(f"pip install --force-reinstall --no-deps robustbench=={robustbench_zoo.VERSION}")

    other = tmp_path / "other"
    _fake_package(other, "1.0")
    monkeypatch.syspath_prepend(str(other))
    assert robustbench_zoo.robustbench_missing() == (f"model=robustbench needs robustbench {robustbench_zoo.VERSION}, "
                                                     "found 1.0: pip install -e '.[robustbench]'")


@pytest.mark.parametrize(("imports", "command"), [("no_such_dependency_of_robustbench", "pip install no_such_dependency_of_robustbench"),
                                                ("bs4", "pip install beautifulsoup4")])
def test_a_dependency_robustbench_lacks_is_named_with_its_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  own_robustbench_modules: None, imports: str,
                                                                  command: str) -> None:
    """robustbench installed without a module it imports: the one line names the module and the pip command
    that installs it (not a reinstall of advbench, which does not bring it back)."""
    monkeypatch.setitem(sys.modules, "bs4", None)
    own = tmp_path / "own"
    _fake_package(own, robustbench_zoo.VERSION, utils=f"import {imports}\n")
    monkeypatch.syspath_prepend(str(own))
    with pytest.raises(AdvbenchError) as caught:
        robustbench_zoo.import_robustbench()
    assert str(caught.value) == f"robustbench {robustbench_zoo.VERSION} imports '{imports}', which is not installed: {command}"


def test_without_robustbench_run_and_fetch_say_how_to_install_it(fake_cifar_root: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                 own_robustbench_modules: None) -> None:
    _no_distribution(monkeypatch)
    _fake_package(tmp_path / "site")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setenv("ADVBENCH_WEIGHTS", str(tmp_path / "weights"))
    assert _error(["run", *_common(tmp_path / "zoo", fake_cifar_root, tmp_path / "out"), "attack=fgsm"]) == NEEDS
    assert _error(["weights", "fetch", f"robustbench:{NAME}"]) == NEEDS
    assert not (tmp_path / "weights").exists() and "robustbench" not in sys.modules


def test_advbench_imports_robustbench_only_for_model_robustbench() -> None:
    code = ("import sys, advbench.cli.main, advbench.cli.weights, advbench.robustness.targets, "
            "advbench.robustness.evaluation.cell, advbench.robustness.models.robustbench_zoo; "
            "assert not [m for m in sys.modules if m.split('.')[0] in ('robustbench', 'timm')], 'imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("content", [b"random bytes, not a torch file", "pickle"])
def test_a_weights_file_passes_the_safe_reader_before_robustbench_sees_it(tmp_path: Path, monkeypatch, content) -> None:
    path = tmp_path / "Carmon2019Unlabeled.pt"
    if content == "pickle":
        torch.save({"model": torch.nn.Linear(2, 2)}, path)  # a whole module: code to run on load
    else:
        path.write_bytes(content)
    monkeypatch.setattr(robustbench_zoo, "present_files", lambda *args: [path])

    def never(*args):
        raise AssertionError("RobustBench's loader was handed the file")

    monkeypatch.setattr(robustbench_zoo, "import_robustbench", never)
    with pytest.raises(AdvbenchError, match="RobustBench weights file of Carmon2019Unlabeled") as caught:
        robustbench_zoo.robustbench_model(10, 3, model_name="Carmon2019Unlabeled", dataset="cifar10", model_dir=tmp_path)
    assert "\n" not in str(caught.value) and "weights_only=False" not in str(caught.value)
