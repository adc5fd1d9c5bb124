"""The contract every no-reference quality metric follows."""

from __future__ import annotations

import torch
from torch import nn

from advbench.core.errors import AdvbenchError


class MissingDependencyError(AdvbenchError):
    """An optional package needed by the chosen metric is not installed."""


def check_images(x: torch.Tensor, metric: str, dims: int = 4) -> None:
    """Images (N, 3, H, W) or videos (N, T, 3, H, W), else a one-line AdvbenchError."""
    layout = "(N, 3, H, W)" if dims == 4 else "(N, T, 3, H, W)"
    if x.dim() != dims or x.shape[-3] != 3 or 0 in x.shape[: dims - 3]:
        raise AdvbenchError(f"{metric}: expected a float tensor {layout} in [0, 1], got shape {tuple(x.shape)}")


class QualityMetric(nn.Module):
    """Images in [0, 1] (N, 3, H, W) -> one score per image (N,).

    Subclasses set the metadata below; the UAP loss normalises by the width of
    `score_range`, and stability tables flip signs for `higher_better=False` metrics. A
    user's own network comes in through `metrics/user.py`.

    Videos are scored in two halves so a long clip can stream through in chunks:
    `frame_features` per frame, then `pool_video` over the whole clip. An image metric's
    feature is its frame score and its pooling the mean over frames; a video metric
    (`is_video`, e.g. VSFA) returns its CNN features and pools them with its temporal model.
    """

    higher_better: bool = True
    score_range: tuple[float, float] = (0.0, 1.0)
    input_size: tuple[int, int] | None = None
    differentiable: bool = True
    is_video: bool = False
    range_known: bool = True  # False: `score_range` is only the attacks' scale, and the records say NaN

    def code_identity(self) -> dict[str, str]:
        """What decides the scores besides the weights and options (`module_digest`), for the cell key:
        nothing for advbench's own metrics, whose code is the release's; a user's code digests."""
        return {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    @property
    def range_width(self) -> float:
        lo, hi = self.score_range
        return float(hi - lo)

    def frame_features(self, frames: torch.Tensor) -> torch.Tensor:
        """Frames (M, 3, H, W) -> (M, D): what `pool_video` needs of each frame."""
        return self(frames).unsqueeze(1)

    def pool_video(self, features: torch.Tensor) -> torch.Tensor:
        """Per-frame features of whole clips (N, T, D) -> one score per clip (N,)."""
        return features[..., 0].mean(dim=1)

    def score_video(self, frames: torch.Tensor) -> torch.Tensor:
        """Videos (N, T, 3, H, W) or one video (T, 3, H, W) in [0, 1] -> (N,) scores."""
        if frames.dim() == 4:
            frames = frames.unsqueeze(0)
        check_images(frames, getattr(self, "name", type(self).__name__), dims=5)
        n, t = frames.shape[:2]
        return self.pool_video(self.frame_features(frames.flatten(0, 1)).view(n, t, -1))
