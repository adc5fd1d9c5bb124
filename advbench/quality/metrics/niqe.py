"""NIQE (Mittal, Soundararajan & Bovik 2013), differentiable, on the authors' pristine model by default.

NIQE measures how far an image's natural-scene statistics are from those of pristine photos:
the features of its 96x96 blocks (`niqe_features`) are pooled into a multivariate Gaussian
(mu_d, S_d), and the score is sqrt((mu_p - mu_d)^T pinv((S_p + S_d) / 2) (mu_p - mu_d)), a
Mahalanobis-like distance to the pristine model (mu_p, S_p) (`niqe_pristine`). Lower is better.

Pooling follows the reference code: a feature's mean is over the blocks where it is defined
(nanmean), the covariance over the blocks where all are (the rows without NaN). One block
alone gives a zero covariance here, where the reference gives NaN.

`NIQE.forward` is the differentiable path (interpolated AGGD shapes, a tiny epsilon under the
local deviation's square root, rounding with a straight-through gradient, float32 features
after a float64 MSCN step); `NIQE.reference`
is the reference computation (grid arg-min shapes, float64) without a gradient. On the
authors' parameters the reference agrees with basicsr's MATLAB-faithful `calculate_niqe`
(tests/test_niqe_reference.py).
"""

from __future__ import annotations

import torch

from advbench.core.paths import location
from advbench.quality.metrics.metric_contract import QualityMetric
from advbench.quality.metrics.niqe_features import nss_features
from advbench.quality.metrics.niqe_pristine import REFERENCE, load_pristine

_EPS = 1e-12


def mvg_distance(feats: torch.Tensor, valid: torch.Tensor, mu_p: torch.Tensor, cov_p: torch.Tensor) -> torch.Tensor:
    """(N, K, 36) block features and validity -> (N,) NIQE distance to the pristine Gaussian (mu_p, cov_p)."""
    mask = valid.to(feats.dtype)
    feats = torch.where(valid, feats, 0)
    mu = (feats * mask).sum(1) / mask.sum(1)
    rows = valid.all(-1, keepdim=True).to(feats.dtype)
    n_rows = rows.sum(1, keepdim=True)
    centred = (feats - (feats * rows).sum(1, keepdim=True) / n_rows.clamp_min(1)) * rows
    cov = centred.transpose(1, 2) @ centred / (n_rows - 1).clamp_min(1)
    diff = (mu_p - mu).unsqueeze(-1)
    dist = diff.transpose(1, 2) @ torch.linalg.pinv((cov_p + cov) / 2) @ diff
    return dist.flatten().clamp_min(_EPS).sqrt()


class NIQE(QualityMetric):
    """Differentiable NIQE; lower is better. Needs images of at least 96x96 (the rest past whole blocks is cropped).

    `pristine`: `reference` (the authors' parameters, from basicsr), `fitted` (advbench's own,
    fitted on the sample photos and cached under `cache_dir`), or a .npz/.mat/.pt file.
    """

    higher_better = False
    score_range = (0.0, 30.0)
    differentiable = True

    def __init__(self, name: str = "niqe", pristine: str = REFERENCE, cache_dir: str | None = None) -> None:
        super().__init__()
        self.name = name
        model = load_pristine(str(pristine), cache_dir or location("cache"))
        self.register_buffer("mu", model["mu"].double())
        self.register_buffer("cov", model["cov"].double())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feats, valid, _ = nss_features(x.float(), exact=False)
        return mvg_distance(feats.double(), valid, self.mu, self.cov).to(x.dtype)

    @torch.no_grad()
    def reference(self, x: torch.Tensor) -> torch.Tensor:
        """The reference computation in float64 (grid arg-min shapes, no epsilon), without a gradient: (N,) scores."""
        feats, valid, _ = nss_features(x.double(), exact=True)
        return mvg_distance(feats, valid, self.mu, self.cov)
