"""The 15 common corruptions of Hendrycks & Dietterich (ICLR 2019, arXiv 1903.12261) at severities 1-5.

Generated in process for any data set (one module per family: `noise`, `blur`, `weather`,
`digital`), or read from the released files (`released`). Generated images are rounded to 8 bits,
as the released files are, so a corrupted image gives the same records whichever way it came.

Images of any size get the pixelwise corruptions (noise, brightness, contrast, JPEG, pixelate)
and those whose constants scale with the image (defocus, glass and zoom blur, fog, elastic); motion
blur and snow need images of at least 24 px (their streaks are 8-20 px long), and frost is read
from the released files only (`base.Corruption.min_side`, `why_not_small`).
"""

from __future__ import annotations

import torch

from advbench.core.errors import AdvbenchError
from advbench.robustness.corruptions import blur, digital, noise, weather  # noqa: F401 (they register)
from advbench.robustness.corruptions.families import CORRUPTIONS, constants_name, generators

NAMES = ("gaussian_noise", "shot_noise", "impulse_noise", "defocus_blur", "glass_blur", "motion_blur", "zoom_blur",
         "snow", "frost", "fog", "brightness", "contrast", "elastic_transform", "pixelate", "jpeg_compression")
"""RobustBench's 15, in its order (noise, blur, weather, digital)."""

SEVERITIES = (1, 2, 3, 4, 5)

__all__ = ["CORRUPTIONS", "NAMES", "SEVERITIES", "constants_name", "corrupt", "why_not"]


def why_not(name: str, side: int) -> str | None:
    """Why corruption `name` cannot be generated for images of this side (None: it can)."""
    c = CORRUPTIONS.lookup(name)
    if c.fn is None:
        return f"{name} cannot be generated: {c.why_not_small}"
    if side < c.min_side:
        return f"{name} does not apply to {side}-px images: {c.why_not_small}"
    return None


def corrupt(x: torch.Tensor, sample_id: torch.Tensor, name: str, severity: int, seed: int) -> torch.Tensor:
    """`x` (N, C, H, W) in [0, 1] with corruption `name` at `severity`, rounded to 8 bits; each image's
    random draws a function of (seed, its sample id, the corruption) alone."""
    if severity not in SEVERITIES:
        raise AdvbenchError(f"corruption severity must be one of 1-5, got {severity}")
    side = min(x.shape[-2:])
    why = why_not(name, side)
    if why is not None:
        raise AdvbenchError(why)
    c = CORRUPTIONS[name]
    out = c.fn(x.float(), c.constant(side, severity), generators(seed, sample_id, NAMES.index(name)))
    return (out.clamp(0, 1) * 255).round().div(255).to(x.dtype)
