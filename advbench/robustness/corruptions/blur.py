"""Blur: defocus (a disk), glass (local pixel shuffling between two Gaussian blurs), motion and zoom.

Constants: Hendrycks & Dietterich's `make_cifar_c.py` (32 px) and `make_imagenet_c.py` (224 px).
Motion blur follows `imagecorruptions`' re-implementation of ImageMagick's motion blur (the
released files used ImageMagick through Wand), so generated images are close to, not the same as,
the released ones; read the released files for RobustBench's exact numbers.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from advbench.robustness.corruptions.families import (
    CORRUPTIONS,
    clipped_zoom,
    filter2d,
    gaussian,
    gaussian_kernel,
    motion_blur,
    per_image,
)

_MOTION_WHY = "its 10-20 px motion streak is longer than the image"


def disk(radius: float, alias_blur: float) -> torch.Tensor:
    """Hendrycks' `disk`: the pixels within `radius`, normalised, smoothed by a 3×3 (5×5 past a
    radius of 8) Gaussian of σ = `alias_blur` (OpenCV's `GaussianBlur`)."""
    span = 8 if radius <= 8 else int(np.ceil(radius))
    taps = torch.arange(-span, span + 1, dtype=torch.float64)
    inside = ((taps.view(-1, 1) ** 2 + taps.view(1, -1) ** 2) <= radius ** 2).double()
    k = gaussian_kernel(alias_blur, truncate=(1 if radius <= 8 else 2) / alias_blur)
    smooth = filter2d(filter2d((inside / inside.sum())[None, None], k.view(1, -1)), k.view(-1, 1))[0, 0]
    return smooth


@CORRUPTIONS.register("defocus_blur", "blur", ((0.3, 0.4), (0.4, 0.5), (0.5, 0.6), (1, 0.2), (1.5, 0.1)),
                      ((3, 0.1), (4, 0.5), (6, 0.5), (8, 0.5), (10, 0.5)))
def defocus_blur(x: torch.Tensor, c: tuple[float, float], gens: Sequence[np.random.Generator]) -> torch.Tensor:  # noqa: ARG001
    """The image seen through a defocused lens: convolved with a disk of radius c[0]."""
    return filter2d(x, disk(*c)).clamp(0, 1)


@CORRUPTIONS.register("glass_blur", "blur", ((0.05, 1, 1), (0.25, 1, 1), (0.4, 1, 1), (0.25, 1, 2), (0.4, 1, 2)),
                      ((0.7, 1, 2), (0.9, 2, 1), (1, 2, 3), (1.1, 3, 2), (1.5, 4, 2)))
def glass_blur(x: torch.Tensor, c: tuple[float, int, int], gens: Sequence[np.random.Generator]) -> torch.Tensor:
    """Frosted glass: a Gaussian blur of σ = c[0], then c[2] passes that swap each pixel with one up
    to c[1] pixels away (Hendrycks' loop, bottom-right to top-left), then the blur again."""
    sigma, delta, passes = c

    def shuffle(im: torch.Tensor, g: np.random.Generator) -> torch.Tensor:
        out = gaussian(im, sigma)[0].permute(1, 2, 0).cpu().numpy().copy()
        h, w = out.shape[:2]
        for _ in range(passes):
            for row in range(h - delta, delta, -1):
                for col in range(w - delta, delta, -1):
                    dx, dy = g.integers(-delta, delta, size=2)
                    r2, c2 = row + dy, col + dx
                    out[[row, r2], [col, c2]] = out[[r2, row], [c2, col]]
        return gaussian(torch.from_numpy(out).permute(2, 0, 1)[None].to(im), sigma)
    return per_image(x, gens, shuffle).clamp(0, 1)


@CORRUPTIONS.register("motion_blur", "blur", ((10, 1), (10, 1.5), (10, 2), (10, 2.5), (12, 3)),
                      ((10, 3), (15, 5), (15, 8), (15, 12), (20, 15)), min_side=24, why=_MOTION_WHY)
def motion_blur_(x: torch.Tensor, c: tuple[int, float], gens: Sequence[np.random.Generator]) -> torch.Tensor:
    """The camera moving during the exposure: a one-sided streak of radius c[0], σ = c[1], at an
    angle drawn uniformly in [-45°, 45°] per image."""
    return per_image(x, gens, lambda im, g: motion_blur(im, c[0], c[1], float(g.uniform(-45, 45)))).clamp(0, 1)


def _zooms(stop: float, step: float) -> tuple[float, ...]:
    """`np.arange(1, stop, step)` as Hendrycks wrote the zoom factors."""
    return tuple(float(z) for z in np.arange(1, stop, step))


@CORRUPTIONS.register("zoom_blur", "blur",
                      tuple(_zooms(s, 0.01) for s in (1.06, 1.11, 1.16, 1.21, 1.26)),
                      (_zooms(1.11, 0.01), _zooms(1.16, 0.01), _zooms(1.21, 0.02), _zooms(1.26, 0.02),
                       _zooms(1.31, 0.03)))
def zoom_blur(x: torch.Tensor, zooms: tuple[float, ...], gens: Sequence[np.random.Generator]) -> torch.Tensor:  # noqa: ARG001
    """Zooming in during the exposure: the mean of the image and its centre zoomed by each factor."""
    total = x.clone()
    for z in zooms:
        total = total + clipped_zoom(x, z)
    return (total / (len(zooms) + 1)).clamp(0, 1)
