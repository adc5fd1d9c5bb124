"""Digital: brightness, contrast, elastic transform, pixelate and JPEG.

Constants: Hendrycks & Dietterich's `make_cifar_c.py` (32 px) and `make_imagenet_c.py` (224 px);
the elastic transform's are fractions of the image side, as both scripts write them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from advbench.core.transforms import jpeg_roundtrip
from advbench.robustness.corruptions.families import CORRUPTIONS, gaussian, per_image


@CORRUPTIONS.register("brightness", "digital", (0.05, 0.1, 0.15, 0.2, 0.3), (0.1, 0.2, 0.3, 0.4, 0.5))
def brightness(x: torch.Tensor, c: float, gens: Sequence[np.random.Generator]) -> torch.Tensor:  # noqa: ARG001
    """HSV's value raised by c and clipped, hue and saturation kept: every channel scaled by V'/V."""
    value = x.amax(1, keepdim=True)
    lifted = (value + c).clamp(0, 1)
    return torch.where(value > 0, x * lifted / value.clamp_min(1e-12), lifted.expand_as(x)).clamp(0, 1)


@CORRUPTIONS.register("contrast", "digital", (0.75, 0.5, 0.4, 0.3, 0.15), (0.4, 0.3, 0.2, 0.1, 0.05))
def contrast(x: torch.Tensor, c: float, gens: Sequence[np.random.Generator]) -> torch.Tensor:  # noqa: ARG001
    """Each channel pulled towards its mean by the factor c."""
    mean = x.mean(dim=(-2, -1), keepdim=True)
    return ((x - mean) * c + mean).clamp(0, 1)


@CORRUPTIONS.register("elastic_transform", "digital",
                      ((0, 0, 0.08), (0.05, 0.2, 0.07), (0.08, 0.06, 0.06), (0.1, 0.04, 0.05), (0.1, 0.03, 0.03)),
                      ((2, 0.7, 0.1), (2, 0.08, 0.2), (0.05, 0.01, 0.02), (0.07, 0.01, 0.02), (0.12, 0.01, 0.02)))
def elastic_transform(x: torch.Tensor, c: tuple[float, float, float], gens: Sequence[np.random.Generator]) -> torch.Tensor:
    """Hendrycks' elastic transform, constants × the image side: a random affine warp (three points
    moved up to c[2]), then a displacement field of U(-1, 1) smoothed by σ = c[1] (truncated at 3σ)
    times c[0], sampled bilinearly with reflected borders."""
    h, w = x.shape[-2:]
    alpha, sigma, shift = (v * min(h, w) for v in c)

    def warp(im: torch.Tensor, g: np.random.Generator) -> torch.Tensor:
        centre, square = np.array([h, w], dtype=np.float64) // 2, min(h, w) // 3
        src = np.array([centre + square, [centre[0] + square, centre[1] - square], centre - square])
        dst = src + g.uniform(-shift, shift, size=src.shape)
        forward = np.linalg.solve(np.c_[src, np.ones(3)], dst).T                 # dst = A [src; 1]
        inverse = np.linalg.inv(np.r_[forward, [[0, 0, 1]]])[:2]
        field = [gaussian(torch.from_numpy(g.uniform(-1, 1, size=(h, w)))[None, None], sigma, "reflect", 3)[0, 0]
                 * alpha for _ in range(2)]
        rows, cols = torch.meshgrid(torch.arange(h, dtype=torch.float64), torch.arange(w, dtype=torch.float64),
                                    indexing="ij")
        ys, xs = rows + field[0], cols + field[1]
        # OpenCV's points are (x, y); the inverse affine maps output positions to the input's.
        sx = inverse[0, 0] * xs + inverse[0, 1] * ys + inverse[0, 2]
        sy = inverse[1, 0] * xs + inverse[1, 1] * ys + inverse[1, 2]
        grid = torch.stack([sx / max(w - 1, 1) * 2 - 1, sy / max(h - 1, 1) * 2 - 1], -1)[None].to(im)
        return F.grid_sample(im, grid, mode="bilinear", padding_mode="reflection", align_corners=True)
    return per_image(x, gens, warp).clamp(0, 1)


@CORRUPTIONS.register("pixelate", "digital", (0.95, 0.9, 0.85, 0.75, 0.65), (0.6, 0.5, 0.4, 0.3, 0.25))
def pixelate(x: torch.Tensor, c: float, gens: Sequence[np.random.Generator]) -> torch.Tensor:  # noqa: ARG001
    """Shrunk to c × the side by box averaging, then enlarged back by repeating pixels (PIL's BOX both ways)."""
    h, w = x.shape[-2:]
    small = F.interpolate(x, size=(max(1, int(h * c)), max(1, int(w * c))), mode="area")
    return F.interpolate(small, size=(h, w), mode="nearest").clamp(0, 1)


@CORRUPTIONS.register("jpeg_compression", "digital", (80, 65, 58, 50, 40), (25, 18, 15, 10, 7))
def jpeg_compression(x: torch.Tensor, quality: int, gens: Sequence[np.random.Generator]) -> torch.Tensor:  # noqa: ARG001
    """Saved as a JPEG at this quality and read back (libjpeg)."""
    return jpeg_roundtrip(x, quality)
