"""Any no-reference metric of IQA-PyTorch (`pyiqa`), e.g. MUSIQ, behind our metric contract.

`pyiqa` is an optional extra (`pip install advbench[pyiqa]`), imported only when such a metric
is built. Nothing is downloaded on advbench's account: a network is created without its
pretrained weights (the `pretrained` argument is passed only to the architectures that take it,
as the "off" value their signature expects) and the local file from the config is loaded
weights-only, in pyiqa's layout (state dict, usually under `params`). A metric that reads a
parameter file instead of a state dict (NIQE, BRISQUE, NRQM, IL-NIQE: their architecture takes
`pretrained_model_path` and no `pretrained`) is handed the config's file there. A metric whose
architecture needs a package pyiqa does not install (timm, clip, transformers) or fetches a
backbone or parameter file at build, offline, is a one-line error saying which. Scores come
from the network itself, one per image. pyiqa's licence (PolyForm Noncommercial 1.0.0 since
April 2026; its weights CC BY-NC-SA 4.0) binds whoever installs it. tests/test_pyiqa_backend.py
checks each family against the real package; docs/quality.md tables what builds offline.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from advbench.core.errors import AdvbenchError, first_line
from advbench.core.torchfile import read_torch_file
from advbench.quality.metrics.author_weights import WeightFile
from advbench.quality.metrics.common import PretrainedMetric, WeightPath
from advbench.quality.metrics.metric_contract import MissingDependencyError


def import_pyiqa() -> ModuleType:
    try:
        return importlib.import_module("pyiqa")
    except ImportError:
        raise MissingDependencyError("metric backend 'pyiqa' is not installed; install advbench[pyiqa]") from None


PIP_NAMES = {"clip": "openai-clip"}
"""Packages pyiqa's architectures import whose pip name differs from the import name (pyiqa's own requirement)."""


def needs_package(name: str, exc: ImportError) -> MissingDependencyError:
    package = PIP_NAMES.get(exc.name or "", exc.name)
    return MissingDependencyError(f"pyiqa metric '{name}' needs the package '{exc.name}', which advbench's pyiqa "
                                  f"install does not bring: pip install {package}")


def architecture_parameters(pyiqa: ModuleType, name: str) -> Mapping[str, inspect.Parameter]:
    """The constructor parameters of `name`'s pyiqa architecture (which options it takes), or a one-line
    error naming the package its module needs. pyiqa registers an architecture when the module that
    defines it is imported; that module is found by its class statement among pyiqa's `*_arch.py`."""
    kind = importlib.import_module("pyiqa.default_model_configs").DEFAULT_CONFIGS[name]["metric_opts"]["type"]
    registry = importlib.import_module("pyiqa.utils.registry").ARCH_REGISTRY
    folder = Path(str(pyiqa.__file__)).parent / "archs"
    defines = (f"class {kind}(", f"class {kind}:")
    for module in sorted(folder.glob("*_arch.py")):
        if kind in registry:
            break
        if any(d in module.read_text(encoding="utf-8") for d in defines):
            try:
                importlib.import_module(f"pyiqa.archs.{module.stem}")
            except ImportError as exc:
                raise needs_package(name, exc) from None
    if kind not in registry:
        raise AdvbenchError(f"pyiqa cannot build metric '{name}': no module of pyiqa's defines its architecture {kind}")
    return inspect.signature(registry.get(kind)).parameters


def parameter_file(name: str, weights: str | Path) -> Path:
    """The parameter file a file-reading pyiqa metric is given; a torch file must hold tensors only,
    since pyiqa reads it with pickle allowed (BRISQUE's `.pth`)."""
    path = Path(weights).expanduser()
    if not path.is_file():
        raise AdvbenchError(f"pyiqa metric '{name}' reads its parameters from metric.weights='{path}', which is not a file")
    if path.suffix.lower() in (".pth", ".pt"):
        read_torch_file(path, f"pyiqa metric '{name}' parameter file")
    return path


def build(pyiqa: ModuleType, name: str, options: dict[str, Any]) -> Any:
    """pyiqa's metric object; what stops it (a package it imports, a file it downloads offline) in one line."""
    try:
        return pyiqa.create_metric(name, as_loss=False, device="cpu", **options)
    except ImportError as exc:
        raise needs_package(name, exc) from None
    except OSError as exc:  # urllib's URLError: a backbone or parameter file fetched at build
        raise AdvbenchError(f"pyiqa metric '{name}' downloads a file when built, which failed ({first_line(exc)}); "
                            f"see docs/quality.md (pyiqa) for the file and where pyiqa looks for it") from None
    except (KeyError, ValueError, TypeError, RuntimeError) as exc:  # timm's "hub model but no huggingface_hub", ...
        raise AdvbenchError(f"pyiqa cannot build metric '{name}': {first_line(exc)}") from None


class PyiqaMetric(PretrainedMetric):
    """A pyiqa NR metric; `name` is pyiqa's metric name, `options` go to its architecture."""

    def __init__(
        self,
        name: str = "musiq",
        weights: WeightPath = None,
        score_range: tuple[float, float] = (0.0, 100.0),
        input_size: tuple[int, int] | None = None,
        **options: Any,
    ) -> None:
        super().__init__(name)
        pyiqa = import_pyiqa()
        known = sorted(pyiqa.list_models(metric_mode="NR"))
        if name not in known:
            raise AdvbenchError(f"pyiqa has no no-reference metric '{name}'; it has {len(known)}: {', '.join(known)}")
        parameters = architecture_parameters(pyiqa, name)
        self.reads_file = "pretrained_model_path" in parameters and "pretrained" not in parameters
        if "pretrained" in parameters:
            default = parameters["pretrained"].default
            options.setdefault("pretrained", False if isinstance(default, bool) else None)
        if self.reads_file and weights is not None:
            options.setdefault("pretrained_model_path", str(parameter_file(name, weights)))
        wrapper = build(pyiqa, name, options)
        self.net = wrapper.net
        self.higher_better = not bool(getattr(wrapper, "lower_better", False))
        self.score_range = (float(score_range[0]), float(score_range[1]))
        self.input_size = tuple(input_size) if input_size is not None else None
        if self.reads_file or not self.net.state_dict():  # parameters in the file pyiqa read, or none (PIQE)
            self.freeze(missing=[])
        else:
            self.load_weights(weights=weights)

    def weight_files(self) -> dict[str, WeightFile]:
        return {"weights": WeightFile(self.net, f"pyiqa's weights file for '{self.name}'", container="params")}

    def score(self, x: torch.Tensor) -> torch.Tensor:
        out = self.net(x)
        if isinstance(out, (tuple, list)):
            out = out[0]
        return out.reshape(x.shape[0], -1)[:, 0]
