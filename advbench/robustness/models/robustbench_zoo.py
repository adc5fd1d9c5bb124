"""RobustBench's model zoo as a model kind: `model=robustbench model.name=<name>` (`conf/model/robustbench.yaml`).

The architecture is RobustBench's own zoo entry for (data set, threat, name) and the weights are
RobustBench's file in RobustBench's layout, `<model_dir>/<dataset>/<threat>/<name>.pt`
(ensembles: `<name>.pt_m<i>.pt`), loaded by `robustbench.utils.load_model`, which is only
called once every file is there, so it never downloads; `advbench weights fetch
robustbench:<name>` is the one way in which advbench lets it download. RobustBench's networks
take [0, 1] images and normalise inside, so the `Classifier` around them normalises with the
identity. Entries that RobustBench builds by downloading (timm's hub, torchvision's pretrained
Standard_R50) have no zoo file and are refused.

`robustbench` is an optional extra, imported on first use here only: importing this module (and
so every other advbench module) does not import it. A module named `robustbench` is not the extra:
torchattacks 3.5.1 (the `test` extra) installs an old copy of RobustBench's package under that
name, without RobustBench's distribution metadata and without the downloader advbench calls. So
`robustbench_missing` asks for the `robustbench` distribution at the release the extra pins, and
for the `robustbench/utils.py` that the import finds to be the one that distribution installed
(not another package's copy written over it). Its 1.1.1 release imports `pkg_resources`
(gone from setuptools >= 81) and `autoattack` (PyPI's `pyautoattack`) at package level, for its
data loaders and its AutoAttack evaluation, which advbench does not use; where those are
missing, stand-ins are in `sys.modules` for the duration of the import only.
"""

from __future__ import annotations

import base64
import difflib
import hashlib
import importlib
import importlib.metadata
import importlib.util
import os
import shutil
import sys
import tempfile
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

from advbench.core.errors import AdvbenchError, first_line
from advbench.core.keys import file_digest
from advbench.core.torchfile import read_torch_file
from advbench.robustness.models.classifier import Classifier

TARGET = "advbench.robustness.models.robustbench_zoo.robustbench_model"
INSTALL = "pip install -e '.[robustbench]'"
PLACEHOLDER = "robustbench"
"""`model.name` of the option itself: no RobustBench model named yet."""
DATASETS = {"cifar10": "cifar10", "cifar100": "cifar100", "imagenet": "imagenet"}
"""advbench's `dataset=` option -> RobustBench's `BenchmarkDataset` value."""
THREATS = ("Linf", "L2", "corruptions")
VERSION = "1.1.1"
"""The RobustBench release the `robustbench` extra pins (pyproject.toml), whose loader and downloader advbench calls."""


# ---------------------------------------------------------------- the package, on first use


def _resource_filename(package: str, path: str) -> str:
    module = importlib.import_module(package)
    return os.path.join(os.path.dirname(str(module.__file__)), path)


def _stand_ins() -> dict[str, ModuleType]:
    """Modules robustbench's package imports that this environment lacks, by their import name."""
    found: dict[str, ModuleType] = {}
    if importlib.util.find_spec("pkg_resources") is None:
        shim = ModuleType("pkg_resources")
        shim.resource_filename = _resource_filename  # type: ignore[attr-defined]
        found["pkg_resources"] = shim
    if importlib.util.find_spec("autoattack") is None and importlib.util.find_spec("pyautoattack") is not None:
        found["autoattack"] = importlib.import_module("pyautoattack")
        found["autoattack.state"] = importlib.import_module("pyautoattack.state")
    return found


def _imported_utils() -> Path | None:
    """The `robustbench/utils.py` that `import robustbench.utils` gives: the one imported, else the one it would find."""
    module = sys.modules.get("robustbench.utils")
    if module is not None:
        where = getattr(module, "__file__", None)
        return Path(where) if where else None
    try:
        spec = importlib.util.find_spec("robustbench")
    except (ImportError, ValueError):  # a `robustbench` in sys.modules without a spec
        return None
    folders = (spec.submodule_search_locations or []) if spec is not None else []
    return next((Path(f) / "utils.py" for f in folders if (Path(f) / "utils.py").is_file()), None)


def _digest(path: Path, mode: str) -> str:
    """A file's hash as a wheel's RECORD writes it: urlsafe base64, no padding."""
    return base64.urlsafe_b64encode(hashlib.new(mode, path.read_bytes()).digest()).rstrip(b"=").decode()


def robustbench_missing() -> str | None:
    """Why RobustBench's distribution is not usable here, as one line; None where it is.

    The `robustbench` distribution at `VERSION`, and, where its RECORD lists `robustbench/utils.py`,
    that file (same place, same hash) is what the import finds: torchattacks' bundled copy, with no
    metadata of its own or written over RobustBench's files, is never taken for it.
    """
    try:
        dist = importlib.metadata.distribution("robustbench")
    except importlib.metadata.PackageNotFoundError:
        return f"model=robustbench needs the robustbench package: {INSTALL}"
    if dist.version != VERSION:
        return f"model=robustbench needs robustbench {VERSION}, found {dist.version}: {INSTALL}"
    listed = next((f for f in dist.files or () if f.as_posix() == "robustbench/utils.py"), None)
    if listed is None:  # no RECORD, or an editable install: nothing to compare
        return None
    installed, found = Path(str(dist.locate_file(listed))), _imported_utils()
    if (found is None or not installed.is_file() or found.resolve() != installed.resolve()
            or (listed.hash is not None and _digest(installed, listed.hash.mode) != listed.hash.value)):
        return (f"the robustbench package that imports ({found or 'none'}) is not robustbench {VERSION}'s own files "
                f"(torchattacks installs an old copy under that name); reinstall it: "
                f"pip install --force-reinstall --no-deps robustbench=={VERSION}")
    return None


PIP_NAMES = {"bs4": "beautifulsoup4", "autoattack": "pyautoattack==0.2.0", "pkg_resources": "'setuptools<81'"}
"""Modules robustbench's package imports whose distribution has another name (its own requirements)."""


def _import_failure(exc: ImportError) -> str:
    """Why `import robustbench.utils` failed and the command that fixes it: a module it imports that is not
    installed (robustbench installed without its dependencies) is installed by name."""
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        top = exc.name.split(".")[0]
        return (f"robustbench {VERSION} imports '{exc.name}', which is not installed: "
                f"pip install {PIP_NAMES.get(top, top)}")
    return f"the robustbench package does not import ({type(exc).__name__}: {first_line(exc)}); {INSTALL}"


def import_robustbench() -> ModuleType:
    """`robustbench.utils` (the loader and the zoo), or a one-line error saying how to install it."""
    missing = robustbench_missing()
    if missing is not None:
        raise AdvbenchError(missing)
    if "robustbench.utils" in sys.modules:
        return sys.modules["robustbench.utils"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        stand_ins = _stand_ins()
        added = {name: module for name, module in stand_ins.items() if name not in sys.modules}
        sys.modules.update(added)
        try:
            return importlib.import_module("robustbench.utils")
        except ImportError as exc:
            raise AdvbenchError(_import_failure(exc)) from None
        finally:
            for name, module in added.items():
                if sys.modules.get(name) is module:
                    del sys.modules[name]


# ---------------------------------------------------------------- names and files (no robustbench import)


def benchmark_dataset(dataset: Any) -> str:
    """RobustBench's spelling of advbench's data set option, or an error listing those it has."""
    if dataset not in DATASETS:
        raise AdvbenchError(f"model=robustbench needs one of RobustBench's data sets (dataset={', '.join(DATASETS)}), "
                            f"got dataset '{dataset}'")
    return DATASETS[str(dataset)]


def check_threat(threat: Any) -> str:
    if threat not in THREATS:
        raise AdvbenchError(f"model.threat must be one of {', '.join(THREATS)} (RobustBench's threat models), got '{threat}'")
    return str(threat)


def fetch_command(name: str, dataset: str, threat: str) -> str:
    return f"advbench weights fetch robustbench:{name} --dataset {dataset} --threat {threat}"


def zoo_path(model_dir: str | Path, dataset: str, threat: str, name: str) -> Path:
    """RobustBench's own layout: `<model_dir>/<dataset>/<threat>/<name>.pt`."""
    return Path(os.path.expanduser(str(model_dir))) / dataset / threat / f"{name}.pt"


# ---------------------------------------------------------------- the zoo


def zoo_entry(name: Any, dataset: Any, threat: Any) -> dict[str, Any]:
    """RobustBench's entry (architecture constructor, file ids) for the name, or a one-line error."""
    if name is None or name == PLACEHOLDER:
        raise AdvbenchError("model=robustbench needs model.name=<a RobustBench model>, e.g. model.name=Carmon2019Unlabeled")
    dataset, threat = benchmark_dataset(dataset), check_threat(threat)
    utils = import_robustbench()
    zoo = utils.all_models[utils.BenchmarkDataset(dataset)][utils.ThreatModel(threat)]
    if name not in zoo:
        close = difflib.get_close_matches(str(name), list(zoo), n=5, cutoff=0.6)
        listed = f"close matches: {', '.join(close)}" if close else f"{len(zoo)} models, e.g. {', '.join(list(zoo)[:3])}"
        raise AdvbenchError(f"unknown RobustBench model '{name}' for {dataset} {threat}; {listed}")
    entry = zoo[name]
    if not entry.get("gdrive_id"):
        raise AdvbenchError(f"RobustBench builds '{name}' ({dataset} {threat}) by downloading it from timm's or "
                            "torchvision's hub, not from a zoo file; advbench cannot load it offline")
    return entry


def weight_files(name: str, dataset: str, threat: str, model_dir: str | Path, entry: dict[str, Any]) -> list[Path]:
    """The zoo file(s) of an entry: one, or `<name>.pt_m<i>.pt` per member of an ensemble."""
    path = zoo_path(model_dir, dataset, threat, name)
    ids = entry["gdrive_id"]
    return [Path(f"{path}_m{i}.pt") for i in range(len(ids))] if isinstance(ids, list) else [path]


def present_files(name: Any, dataset: Any, threat: Any, model_dir: Any) -> list[Path]:
    """The entry's files, every one present, else a one-line error naming where and how to get it."""
    entry = zoo_entry(name, dataset, threat)
    dataset, threat = benchmark_dataset(dataset), check_threat(threat)
    files = weight_files(str(name), dataset, threat, model_dir, entry)
    missing = next((p for p in files if not p.is_file()), None)
    if missing is not None:
        raise AdvbenchError(f"RobustBench model '{name}' ({dataset} {threat}) needs its weights at '{missing}'; "
                            f"fetch them (online) with: {fetch_command(str(name), dataset, threat)}")
    return files


def identity(model_cfg: Any) -> dict[str, Any]:
    """What names the weights in cell keys: the zoo entry and the sha256 of its file(s)."""
    name, dataset, threat = model_cfg.get("model_name"), model_cfg.get("dataset"), model_cfg.get("threat")
    files = present_files(name, dataset, threat, model_cfg.get("model_dir"))
    digests = [file_digest(p) for p in files]
    return {"robustbench": f"{benchmark_dataset(dataset)}/{threat}/{name}",
            "weights_sha256": digests[0] if len(digests) == 1 else digests}


def _load(utils: ModuleType, name: str, dataset: str, threat: str, model_dir: str | Path) -> Any:
    """`robustbench.utils.load_model` from the folder, its failures as one line."""
    try:
        return _load_model(utils, name, dataset, threat, model_dir)
    except (RuntimeError, OSError, ValueError, KeyError) as exc:  # a file that does not fit or does not unpickle
        where = zoo_path(model_dir, dataset, threat, name)
        raise AdvbenchError(f"'{where}' does not load into RobustBench's {name}: {_first_line(exc)}") from None


def _load_model(utils: ModuleType, name: str, dataset: str, threat: str, model_dir: str | Path) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return utils.load_model(name, model_dir=str(model_dir), dataset=dataset, threat_model=threat)


def _first_line(exc: BaseException) -> str:
    return first_line(exc) or type(exc).__name__


def robustbench_model(num_classes: int, in_channels: int, model_name: str | None = None, threat: str = "Linf",
                      dataset: str | None = None, model_dir: str = ".", **meta: Any) -> Classifier:
    """RobustBench's network with its zoo file, taking [0, 1] images (identity normalisation outside).

    `num_classes` is checked against the network's output by `check_forward`; `meta` are the
    option's labels (`input_size`), which the builder ignores.
    """
    for path in present_files(model_name, dataset, threat, model_dir):
        # RobustBench's loader unpickles whatever is there (code and all, where the environment lifts
        # torch's weights-only default): a file must pass advbench's safe reader before it sees it.
        read_torch_file(path, f"RobustBench weights file of {model_name}")
    net = _load(import_robustbench(), str(model_name), benchmark_dataset(dataset), threat,
                Path(os.path.expanduser(str(model_dir))))
    return Classifier(net, str(model_name), in_channels, (0.0,), (1.0,))


def fetch(name: str, dataset: str, threat: str, model_dir: str | Path, force: bool = False) -> list[Path]:
    """Download an entry's file(s) with RobustBench's downloader, into the layout once they load.

    The download goes to a scratch folder beside the layout: a failed or partial download
    leaves nothing where `model=robustbench` looks.
    """
    entry = zoo_entry(name, dataset, threat)
    dataset, threat = benchmark_dataset(dataset), check_threat(threat)
    files = weight_files(name, dataset, threat, model_dir, entry)
    if all(p.is_file() for p in files) and not force:
        return files
    utils = import_robustbench()
    files[0].parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".fetch-", dir=files[0].parent))
    try:
        try:
            _load_model(utils, name, dataset, threat, scratch)
        except Exception as exc:  # gdown's and requests' errors when offline or refused, a file that does not load
            raise AdvbenchError(f"robustbench:{name}: fetching it failed ({type(exc).__name__}: {_first_line(exc)}); "
                                f"offline? put RobustBench's file at '{files[0]}'") from None
        for path in files:
            os.replace(zoo_path(scratch, dataset, threat, name).parent / path.name, path)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return files
