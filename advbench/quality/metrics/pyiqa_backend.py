"""Any no-reference metric of IQA-PyTorch (`pyiqa`), e.g. MUSIQ, behind our metric contract.

`pyiqa` is an optional extra (`pip install advbench[pyiqa]`), imported only when such a metric
is built. The network is created without its pretrained weights (pyiqa would download them)
and the local file from the config is loaded weights-only, in pyiqa's layout (state dict,
usually under `params`). Scores come from the network itself, one per image, differentiable.
pyiqa's licence (PolyForm Noncommercial 1.0.0 since April 2026; its weights CC BY-NC-SA 4.0)
binds whoever installs it. tests/test_pyiqa_backend.py checks MUSIQ against the real package.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

import torch

from advbench.core.errors import AdvbenchError
from advbench.quality.metrics.base import MissingDependencyError
from advbench.quality.metrics.checkpoint import WeightFile
from advbench.quality.metrics.common import PretrainedMetric, WeightPath


def import_pyiqa() -> ModuleType:
    try:
        return importlib.import_module("pyiqa")
    except ImportError:
        raise MissingDependencyError("metric backend 'pyiqa' is not installed; install advbench[pyiqa]") from None


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
        try:
            wrapper = pyiqa.create_metric(name, as_loss=False, device="cpu", pretrained=False, **options)
        except (KeyError, ValueError, TypeError) as exc:
            raise AdvbenchError(f"pyiqa cannot build metric '{name}': {exc}") from None
        self.net = wrapper.net
        self.higher_better = not bool(getattr(wrapper, "lower_better", False))
        self.score_range = (float(score_range[0]), float(score_range[1]))
        self.input_size = tuple(input_size) if input_size is not None else None
        self.load_weights(weights=weights)

    def weight_files(self) -> dict[str, WeightFile]:
        return {"weights": WeightFile(self.net, f"pyiqa's weights file for '{self.name}'", container="params")}

    def score(self, x: torch.Tensor) -> torch.Tensor:
        out = self.net(x)
        if isinstance(out, (tuple, list)):
            out = out[0]
        return out.reshape(x.shape[0], -1)[:, 0]
