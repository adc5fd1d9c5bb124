"""The contract every no-reference quality metric follows."""

from __future__ import annotations

import torch
from torch import nn


class QualityMetric(nn.Module):
    """Images in [0, 1] (N, 3, H, W) -> one score per image (N,).

    Subclasses set the metadata below; the UAP loss normalises by the width of
    `score_range`, and stability tables flip signs for `higher_better=False` metrics.
    """

    higher_better: bool = True
    score_range: tuple[float, float] = (0.0, 1.0)
    input_size: tuple[int, int] | None = None
    differentiable: bool = True
    is_video: bool = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    @property
    def range_width(self) -> float:
        lo, hi = self.score_range
        return float(hi - lo)
