"""NIQE (Mittal, Soundararajan & Bovik 2013), differentiable, with a pristine model advbench fits itself.

NIQE measures how far an image's natural-scene statistics are from those of pristine photos:

1. grey image in [0, 255], cropped to whole 96x96 patches; MSCN coefficients
   (I - mu) / (sigma + 1) with a 7x7 Gaussian window (sigma 7/6);
2. per patch, 18 features: a generalised Gaussian (GGD) fit of the MSCN values (shape,
   variance) and an asymmetric GGD (AGGD) fit of the four neighbour products (horizontal,
   vertical, both diagonals; shape, mean, left and right variance), at the original and at
   half resolution: 36 features;
3. score = sqrt((mu_p - mu_d)^T ((S_p + S_d) / 2)^-1 (mu_p - mu_d)), a Mahalanobis-like
   distance between the multivariate Gaussian of the image's patches (mu_d, S_d) and the
   pristine model (mu_p, S_p). Lower is better.

The GGD/AGGD shapes are found by moment matching, as in the reference code, but the inverse
of the moment ratio is a piecewise-linear interpolation in a fine table instead of an
arg-min, so the score has a gradient with respect to every pixel.

The pristine model is not the authors' (fitted on 125 photos that are not shipped): advbench
fits its own with `fit_pristine_model(sample_photos("train"))`, keeping, as the reference
code does, only patches whose mean local deviation is at least 0.75 of the photo's sharpest
patch. The first use writes it to `<cache_dir>/niqe/pristine-v1.pt` (cache_dir defaults to
$ADVBENCH_CACHE or ~/.cache/advbench); `save_pristine_model(fit_pristine_model(images), path)`
fits one on any photos you trust and `NIQE(model=path)` uses it. Scores are therefore on
advbench's own scale, not comparable with published NIQE numbers.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Iterable

import torch
import torch.nn.functional as F

from advbench.core.errors import AdvbenchError
from advbench.core.paths import location
from advbench.quality.images import sample_photos
from advbench.quality.metrics.base import QualityMetric

PATCH = 96
SHARPNESS_THRESHOLD = 0.75
MODEL_FILE = "niqe/pristine-v1.pt"
_GREY = (0.2989, 0.5870, 0.1140)  # MATLAB rgb2gray, as the reference implementation
_SHIFTS = ((0, 1), (1, 0), (1, 1), (-1, 1))  # horizontal, vertical, main and secondary diagonal
_EPS = 1e-6


@lru_cache(maxsize=None)
def _gaussian_taps() -> tuple[float, ...]:
    """The 7-tap Gaussian (sigma 7/6) whose outer product is the reference code's 7x7 window."""
    ax = torch.arange(7, dtype=torch.float64) - 3
    g = torch.exp(-(ax ** 2) / (2 * (7 / 6) ** 2))
    return tuple((g / g.sum()).tolist())


def gaussian_blur(x: torch.Tensor) -> torch.Tensor:
    """(..., H + 6, W + 6) -> (..., H, W): the 7x7 Gaussian window, applied as two 7-tap passes.

    Shifted adds instead of a 7x7 convolution: the same weights, about three times faster on a
    CPU for one channel, and any leading dimensions.
    """
    taps = _gaussian_taps()
    h, w = x.shape[-2] - 6, x.shape[-1] - 6
    rows = x[..., :w] * taps[0]
    for i, tap in enumerate(taps[1:], 1):
        rows = rows.add_(x[..., i:i + w], alpha=tap)
    out = rows[..., :h, :] * taps[0]
    for i, tap in enumerate(taps[1:], 1):
        out = out.add_(rows[..., i:i + h, :], alpha=tap)
    return out


@lru_cache(maxsize=None)
def _rho_table() -> tuple[torch.Tensor, torch.Tensor]:
    """GGD moment ratio rho(a) = G(1/a) G(3/a) / G(2/a)^2 on a 0.2..10 grid, ascending in rho."""
    alpha = torch.arange(0.2, 10.0, 0.001, dtype=torch.float64)
    log_rho = torch.lgamma(1 / alpha) + torch.lgamma(3 / alpha) - 2 * torch.lgamma(2 / alpha)
    return log_rho.flip(0).float(), alpha.flip(0).float()


def shape_from_ratio(rho: torch.Tensor) -> torch.Tensor:
    """Inverse of rho(a) by linear interpolation in log rho: differentiable, clamped to [0.2, 10]."""
    log_rho, alpha = (t.to(rho.device) for t in _rho_table())
    x = rho.clamp_min(_EPS).log().clamp(float(log_rho[0]), float(log_rho[-1]))
    hi = torch.searchsorted(log_rho, x.detach().contiguous()).clamp(1, len(log_rho) - 1)
    lo = hi - 1
    t = (x - log_rho[lo]) / (log_rho[hi] - log_rho[lo])
    return alpha[lo] + t * (alpha[hi] - alpha[lo])


def ggd_features(x: torch.Tensor) -> torch.Tensor:
    """(..., M) samples -> (..., 2): GGD shape and variance by moment matching."""
    var = x.pow(2).mean(-1)
    mean_abs = x.abs().mean(-1)
    return torch.stack([shape_from_ratio(var / mean_abs.pow(2).clamp_min(_EPS)), var], -1)


def aggd_features(x: torch.Tensor) -> torch.Tensor:
    """(..., M) samples -> (..., 4): AGGD shape, mean, left and right scale squared."""
    neg, pos = (x < 0).to(x.dtype), (x > 0).to(x.dtype)
    sq = x.pow(2)
    left_std = ((sq * neg).sum(-1) / neg.sum(-1).clamp_min(1) + _EPS).sqrt()
    right_std = ((sq * pos).sum(-1) / pos.sum(-1).clamp_min(1) + _EPS).sqrt()
    gamma = left_std / right_std
    r_hat = x.abs().mean(-1).pow(2) / (sq.mean(-1) + _EPS)
    r_norm = r_hat * (gamma.pow(3) + 1) * (gamma + 1) / (gamma.pow(2) + 1).pow(2)
    alpha = shape_from_ratio(1 / r_norm.clamp_min(_EPS))
    scale = torch.exp(0.5 * (torch.lgamma(1 / alpha) - torch.lgamma(3 / alpha)))
    beta_l, beta_r = left_std * scale, right_std * scale
    mean = (beta_r - beta_l) * torch.exp(torch.lgamma(2 / alpha) - torch.lgamma(1 / alpha))
    return torch.stack([alpha, mean, beta_l.pow(2), beta_r.pow(2)], -1)


def mscn(grey: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, 1, H, W) grey in [0, 255] -> MSCN coefficients and local deviation sigma."""
    pad = F.pad(grey, (3, 3, 3, 3), mode="replicate")
    mu, mean_sq = gaussian_blur(torch.stack([pad, pad * pad]))
    var = mean_sq - mu * mu
    sigma = (var.abs() + _EPS).sqrt()
    return (grey - mu) / (sigma + 1), sigma


def patches(x: torch.Tensor, size: int) -> torch.Tensor:
    """(N, 1, H, W) with H, W multiples of size -> (N, K, size, size) non-overlapping patches."""
    n, _, h, w = x.shape
    return x.view(n, h // size, size, w // size, size).permute(0, 1, 3, 2, 4).reshape(n, -1, size, size)


def patch_features(block: torch.Tensor) -> torch.Tensor:
    """(N, K, P, P) MSCN patches -> (N, K, 18) NSS features (products wrap inside the patch)."""
    flat = block.flatten(-2)
    pairs = torch.stack([(block * block.roll(s, dims=(-2, -1))).flatten(-2) for s in _SHIFTS], -2)
    return torch.cat([ggd_features(flat), aggd_features(pairs).flatten(-2)], -1)


def niqe_features(images: torch.Tensor, patch: int = PATCH) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, 3, H, W) in [0, 1] -> per-patch features (N, K, 36) and patch sharpness (N, K)."""
    h, w = images.shape[-2:]
    if h < patch or w < patch:
        raise AdvbenchError(f"niqe: images must be at least {patch}x{patch}, got {h}x{w}")
    weights = images.new_tensor(_GREY).view(1, 3, 1, 1)
    grey = (images * weights).sum(1, keepdim=True) * 255
    grey = grey[..., : h // patch * patch, : w // patch * patch]
    coeffs, sigma = mscn(grey)
    small = F.interpolate(grey, scale_factor=0.5, mode="bicubic", antialias=True, align_corners=False)
    coeffs2, _ = mscn(small)
    feats = torch.cat([patch_features(patches(coeffs, patch)), patch_features(patches(coeffs2, patch // 2))], -1)
    return feats, patches(sigma, patch).mean((-2, -1))


def fit_pristine_model(images: Iterable[torch.Tensor], patch: int = PATCH,
                       sharpness_threshold: float = SHARPNESS_THRESHOLD) -> dict[str, torch.Tensor]:
    """Mean and covariance of the sharp patches' features over pristine photos (3, H, W) in [0, 1]."""
    kept = []
    with torch.no_grad():
        for image in images:
            feats, sharp = niqe_features(image[None].float(), patch)
            kept.append(feats[0][sharp[0] > sharpness_threshold * sharp[0].max()])
    data = torch.cat(kept).double()
    if len(data) <= data.shape[1]:
        raise AdvbenchError(f"niqe: {len(data)} sharp patches are too few for a 36-d model; give more or larger photos")
    return {"mu": data.mean(0), "cov": torch.cov(data.T), "n_patches": torch.tensor(len(data))}


def save_pristine_model(model: dict[str, torch.Tensor], path: str | Path) -> Path:
    """Write a pristine model (tensors only, so it loads with weights_only=True)."""
    out = Path(path).expanduser()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    torch.save(model, tmp)
    tmp.replace(out)
    return out


def load_pristine_model(path: str | Path) -> dict[str, torch.Tensor]:
    """Read a pristine model file; a missing or malformed file is a one-line error."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise AdvbenchError(f"niqe: pristine model '{file}' not found; expected a file from save_pristine_model")
    try:
        model = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unpickling failure means a bad file
        raise AdvbenchError(f"niqe: cannot read pristine model '{file}': {exc}") from None
    if not isinstance(model, dict) or {"mu", "cov"} - model.keys() or model["mu"].shape != (36,):
        raise AdvbenchError(f"niqe: '{file}' is not a pristine model: expected tensors mu (36,) and cov (36, 36)")
    return model


def default_model(cache_dir: str | Path) -> Path:
    """The cached pristine model, fitted on the training split of the sample photos on first use."""
    path = Path(cache_dir).expanduser() / MODEL_FILE
    if not path.is_file():
        save_pristine_model(fit_pristine_model(sample_photos("train")), path)
    return path


class NIQE(QualityMetric):
    """Differentiable NIQE against advbench's own pristine model; lower is better.

    Needs images of at least 96x96 (whole 96x96 patches are used, the rest cropped away).
    """

    higher_better = False
    score_range = (0.0, 30.0)
    differentiable = True

    def __init__(self, name: str = "niqe", model: str | None = None,
                 cache_dir: str | None = None) -> None:
        super().__init__()
        self.name = name
        pristine = load_pristine_model(model if model is not None else default_model(cache_dir or location("cache")))
        self.register_buffer("mu", pristine["mu"].double())
        self.register_buffer("cov", pristine["cov"].double())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4 or x.shape[1] != 3:
            raise AdvbenchError(f"niqe: expected images (N, 3, H, W) in [0, 1], got shape {tuple(x.shape)}")
        feats = niqe_features(x.float())[0].double()
        k = feats.shape[1]
        mu = feats.mean(1)
        centred = feats - mu[:, None]
        cov = centred.transpose(1, 2) @ centred / max(k - 1, 1)
        diff = (self.mu - mu).unsqueeze(-1)
        pooled = (self.cov + cov) / 2
        dist = (diff.transpose(1, 2) @ torch.linalg.solve(pooled, diff)).flatten()
        return dist.clamp_min(_EPS).sqrt().to(x.dtype)
