"""NIQE's natural-scene-statistics features, computed as the authors' MATLAB release does, in torch.

The pristine parameters the NIQE authors published describe features of one exact pipeline
(`niqe_release`, as ported faithfully by basicsr's `calculate_niqe`); a score is only on the
published scale when the image's features are computed the same way:

1. luma: the Y channel of MATLAB's `rgb2ycbcr` (BT.601, [16, 235]), rounded to integers as
   MATLAB's uint8 images are; cropped to whole 96x96 blocks;
2. MSCN coefficients (I - mu) / (sigma + 1) with the 7x7 Gaussian window (sigma 7/6) and
   replicated borders, at full size and after MATLAB's `imresize(I, 0.5)` (antialiased
   bicubic with mirrored borders, which is not torch's bicubic at the borders);
3. per block (96x96, then 48x48 at half size), 18 features: an asymmetric generalised
   Gaussian (AGGD) fit of the MSCN values (shape, mean of the two scales) and of the four
   neighbour products (shape, mean, left and right scale), products wrapping inside the block.

The AGGD shape is the grid point of 0.2:0.001:10 whose moment ratio is nearest the sample's
(`exact=True`, the reference arg-min) or, for a gradient, the ratio's linear interpolation
between grid points (`exact=False`), so the two differ by less than one grid step. Where a
sample has no negative or no positive value the reference code's features are NaN (a NaN
ratio makes its arg-min pick the first grid point, 0.2): every feature comes with a validity
mask saying which of them the reference would have dropped, and no NaN is ever computed, so
masked features keep a finite gradient.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch
import torch.nn.functional as F

from advbench.core.errors import AdvbenchError
from advbench.quality.metrics.metric_contract import check_images

BLOCK = 96
_LUMA = (65.481, 128.553, 24.966)  # MATLAB rgb2ycbcr's Y row for RGB in [0, 1]; offset 16
_SHIFTS = ((0, 1), (1, 0), (1, 1), (1, -1))  # horizontal, vertical, main and secondary diagonal
_FIRST_SHAPE = 0.2  # the grid's first point: the reference's shape when the moment ratio is NaN
SIGMA_EPS = 1e-6  # added to the local variance under the square root when a gradient is needed


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


def luma(images: torch.Tensor) -> torch.Tensor:
    """(N, 3, H, W) RGB in [0, 1] -> (N, 1, H, W) integer Y in [16, 235]; rounding passes the gradient straight through."""
    weights = images.new_tensor(_LUMA).view(1, 3, 1, 1)
    y = 16 + (images * weights).sum(1, keepdim=True)
    return y + (y.round() - y).detach()


def mscn(grey: torch.Tensor, eps: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, 1, H, W) grey levels -> MSCN coefficients and local deviation sigma (eps > 0 keeps sqrt's gradient finite)."""
    wide = grey.double()  # E[I^2] - E[I]^2 of grey levels near 235 loses the variance of smooth areas in float32
    pad = F.pad(wide, (3, 3, 3, 3), mode="replicate")
    mu, mean_sq = gaussian_blur(torch.stack([pad, pad * pad]))
    sigma = ((mean_sq - mu * mu).abs() + eps).sqrt()
    return ((wide - mu) / (sigma + 1)).to(grey.dtype), sigma.to(grey.dtype)


def _cubic(x: torch.Tensor) -> torch.Tensor:
    """MATLAB imresize's cubic kernel (a = -0.5)."""
    a = x.abs()
    near = 1.5 * a ** 3 - 2.5 * a ** 2 + 1
    far = -0.5 * a ** 3 + 2.5 * a ** 2 - 4 * a + 2
    return torch.where(a <= 1, near, torch.where(a <= 2, far, torch.zeros_like(a)))


@lru_cache(maxsize=None)
def _halving_matrix(n: int) -> torch.Tensor:
    """(ceil(n / 2), n) weights of MATLAB's imresize(., 0.5) along one axis: antialiased bicubic, mirrored borders."""
    scale, width = 0.5, 8.0  # the antialiased kernel is 4 / scale wide
    out = math.ceil(n * scale)
    centre = torch.arange(1, out + 1, dtype=torch.float64) / scale + 0.5 * (1 - 1 / scale)
    index = torch.floor(centre - width / 2)[:, None] + torch.arange(math.ceil(width) + 2, dtype=torch.float64)
    weights = scale * _cubic(scale * (centre[:, None] - index))
    weights = weights / weights.sum(1, keepdim=True)
    folded = (index.long() - 1) % (2 * n)  # 1-based index into [1..n, n..1], MATLAB's symmetric padding
    folded = torch.where(folded < n, folded, 2 * n - 1 - folded)
    return torch.zeros(out, n, dtype=torch.float64).scatter_add_(1, folded, weights)


def halve(grey: torch.Tensor) -> torch.Tensor:
    """(N, 1, H, W) -> (N, 1, H / 2, W / 2) as MATLAB's imresize(grey, 0.5): two matrix products, differentiable."""
    rows = _halving_matrix(grey.shape[-2]).to(grey)
    cols = _halving_matrix(grey.shape[-1]).to(grey)
    return rows @ grey @ cols.T


def blocks(x: torch.Tensor, size: int) -> torch.Tensor:
    """(N, 1, H, W) with H, W multiples of size -> (N, K, size, size) non-overlapping blocks."""
    n, _, h, w = x.shape
    return x.reshape(n, h // size, size, w // size, size).permute(0, 1, 3, 2, 4).reshape(n, -1, size, size)


@lru_cache(maxsize=None)
def _ratio_grid() -> tuple[torch.Tensor, torch.Tensor]:
    """The reference's shape grid 0.2:0.001:10 and its AGGD moment ratio G(2/a)^2 / (G(1/a) G(3/a)), ascending."""
    alpha = 0.2 + 0.001 * torch.arange(9801, dtype=torch.float64)
    ratio = torch.exp(2 * torch.lgamma(2 / alpha) - torch.lgamma(1 / alpha) - torch.lgamma(3 / alpha))
    return ratio, alpha


def shape_from_ratio(ratio: torch.Tensor, exact: bool) -> torch.Tensor:
    """The AGGD shape whose moment ratio is `ratio`: the nearest grid point (exact), or interpolated between two."""
    grid, alpha = (t.to(ratio) for t in _ratio_grid())
    hi = torch.searchsorted(grid, ratio.detach().contiguous()).clamp(1, len(grid) - 1)
    lo = hi - 1
    if exact:
        nearer_lo = (ratio - grid[lo]).pow(2) <= (grid[hi] - ratio).pow(2)  # ties: the first, as arg-min
        return torch.where(nearer_lo, alpha[lo], alpha[hi])
    t = ((ratio - grid[lo]) / (grid[hi] - grid[lo])).clamp(0, 1)
    return alpha[lo] + t * (alpha[hi] - alpha[lo])


def aggd_fit(x: torch.Tensor, exact: bool) -> tuple[torch.Tensor, ...]:
    """(..., M) samples -> AGGD shape, left and right scale, and whether each side had samples."""
    neg, pos = x < 0, x > 0
    has_left, has_right = neg.any(-1), pos.any(-1)
    both = has_left & has_right
    sq = x * x
    left_var = (sq * neg).sum(-1) / neg.sum(-1).clamp_min(1)
    right_var = (sq * pos).sum(-1) / pos.sum(-1).clamp_min(1)
    left_std = torch.where(has_left, left_var, 1).sqrt()
    right_std = torch.where(has_right, right_var, 1).sqrt()
    gamma = left_std / right_std
    r_hat = x.abs().mean(-1).pow(2) / torch.where(both, sq.mean(-1), 1)
    r_norm = r_hat * (gamma.pow(3) + 1) * (gamma + 1) / (gamma.pow(2) + 1).pow(2)
    alpha = torch.where(both, shape_from_ratio(r_norm, exact), _FIRST_SHAPE)
    scale = torch.exp(0.5 * (torch.lgamma(1 / alpha) - torch.lgamma(3 / alpha)))
    return alpha, left_std * scale, right_std * scale, has_left, has_right


def block_features(block: torch.Tensor, exact: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, K, P, P) MSCN blocks -> 18 features (N, K, 18) and their validity (N, K, 18)."""
    alpha, left, right, has_left, has_right = aggd_fit(block.flatten(-2), exact)
    feats = [torch.stack([alpha, (left + right) / 2], -1)]
    valid = [torch.stack([torch.ones_like(has_left), has_left & has_right], -1)]
    pairs = torch.stack([(block * block.roll(s, dims=(-2, -1))).flatten(-2) for s in _SHIFTS], -2)
    alpha, left, right, has_left, has_right = aggd_fit(pairs, exact)
    mean = (right - left) * torch.exp(torch.lgamma(2 / alpha) - torch.lgamma(1 / alpha))
    feats.append(torch.stack([alpha, mean, left, right], -1).flatten(-2))
    valid.append(torch.stack([torch.ones_like(has_left), has_left & has_right, has_left, has_right], -1).flatten(-2))
    return torch.cat(feats, -1), torch.cat(valid, -1)


def nss_features(images: torch.Tensor, exact: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(N, 3, H, W) in [0, 1] -> per-block features (N, K, 36), their validity, and block sharpness (N, K).

    Sharpness is the block's mean local deviation, which the pristine-model fit selects blocks by.
    """
    check_images(images, "niqe")
    h, w = images.shape[-2:]
    if h < BLOCK or w < BLOCK:
        raise AdvbenchError(f"niqe: images must be at least {BLOCK}x{BLOCK}, got {h}x{w}")
    grey = luma(images)[..., : h // BLOCK * BLOCK, : w // BLOCK * BLOCK]
    eps = 0.0 if exact else SIGMA_EPS
    coeffs, sigma = mscn(grey, eps)
    half, _ = mscn(halve(grey), eps)
    full_feats, full_valid = block_features(blocks(coeffs, BLOCK), exact)
    half_feats, half_valid = block_features(blocks(half, BLOCK // 2), exact)
    feats = torch.cat([full_feats, half_feats], -1)
    return feats, torch.cat([full_valid, half_valid], -1), blocks(sigma, BLOCK).mean((-2, -1))
