"""How far an attacked image is from its original: PSNR, SSIM, ℓ∞ and ℓ2, batched.

SSIM is Wang et al.'s (2004) with an 11x11 Gaussian window of σ = 1.5, K1 = 0.01, K2 = 0.03 on
images in [0, 1], per channel, averaged over the window positions that fit inside the image
(skimage's `structural_similarity(gaussian_weights=True, use_sample_covariance=False)`,
which `tests/test_iqa_scores.py` checks it against).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from advbench.core.errors import AdvbenchError
from advbench.core.norms import L2_NORM, LINF

_C1, _C2 = 0.01 ** 2, 0.03 ** 2
SSIM_WINDOW = 11


def check_measurable(images: torch.Tensor) -> None:
    """Images at least as large as SSIM's window, else one line before any attack (not a conv error after it)."""
    if min(images.shape[-2:]) < SSIM_WINDOW:
        raise AdvbenchError(f"images must be at least {SSIM_WINDOW}x{SSIM_WINDOW} pixels (SSIM's window), got "
                            f"{images.shape[-2]}x{images.shape[-1]}")


def psnr(x_adv: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """(N,) PSNR in dB for peak 1; inf where the images are equal."""
    mse = (x_adv - x).pow(2).flatten(1).mean(1)
    return 10 * torch.log10(1 / mse)


def _gaussian_window(channels: int, like: torch.Tensor, size: int = SSIM_WINDOW, sigma: float = 1.5) -> torch.Tensor:
    ax = torch.arange(size, dtype=like.dtype, device=like.device) - (size - 1) / 2
    g = torch.exp(-ax ** 2 / (2 * sigma ** 2))
    g = g / g.sum()
    return (g[:, None] * g[None, :]).expand(channels, 1, size, size).contiguous()


def ssim(x_adv: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """(N,) mean SSIM over channels and window positions."""
    a, b = x_adv.double(), x.double()
    window = _gaussian_window(a.shape[1], a)

    def blur(v: torch.Tensor) -> torch.Tensor:
        return F.conv2d(v, window, groups=a.shape[1])

    mu_a, mu_b = blur(a), blur(b)
    var_a, var_b = blur(a * a) - mu_a ** 2, blur(b * b) - mu_b ** 2
    cov = blur(a * b) - mu_a * mu_b
    index = ((2 * mu_a * mu_b + _C1) * (2 * cov + _C2)) / ((mu_a ** 2 + mu_b ** 2 + _C1) * (var_a + var_b + _C2))
    return index.flatten(1).mean(1).to(x.dtype)


def fidelity(x_adv: torch.Tensor, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """The per-image columns of the records: psnr, ssim, linf and l2 of x_adv − x."""
    delta = x_adv - x
    return {"psnr": psnr(x_adv, x), "ssim": ssim(x_adv, x), "linf": LINF.size(delta), "l2": L2_NORM.size(delta)}
