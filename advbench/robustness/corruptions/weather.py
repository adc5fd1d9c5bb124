"""Weather: snow, frost and fog.

Constants: Hendrycks & Dietterich's `make_cifar_c.py` (32 px) and `make_imagenet_c.py` (224 px).
Frost overlays crops of six frost photographs that ImageNet-C ships and advbench does not, so it
is read from the released files only; generating it is refused.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from advbench.robustness.corruptions.families import CORRUPTIONS, clipped_zoom, gray, motion_blur, per_image

FROST_WHY = ("it overlays ImageNet-C's frost photographs, which advbench does not ship: "
             "read the released files (threat.released=FOLDER)")

CORRUPTIONS.register("frost", "weather", (), (), min_side=math.inf, why=FROST_WHY)(None)


@CORRUPTIONS.register("snow", "weather",
                      ((0.1, 0.2, 1, 0.6, 8, 3, 0.95), (0.1, 0.2, 1, 0.5, 10, 4, 0.9),
                       (0.15, 0.3, 1.75, 0.55, 10, 4, 0.9), (0.25, 0.3, 2.25, 0.6, 12, 6, 0.85),
                       (0.3, 0.3, 1.25, 0.65, 14, 12, 0.8)),
                      ((0.1, 0.3, 3, 0.5, 10, 4, 0.8), (0.2, 0.3, 2, 0.5, 12, 4, 0.7),
                       (0.55, 0.3, 4, 0.9, 12, 8, 0.7), (0.55, 0.3, 4.5, 0.85, 12, 8, 0.65),
                       (0.55, 0.3, 2.5, 0.85, 12, 12, 0.55)),
                      min_side=24, why="its flakes are streaked 8-14 px long, longer than the image")
def snow(x: torch.Tensor, c: tuple[float, ...], gens: Sequence[np.random.Generator]) -> torch.Tensor:
    """Falling snow: a thresholded, zoomed N(c[0], c[1]) layer streaked by a motion blur (radius c[4],
    σ c[5], angle in [-135°, -45°]), added twice (once turned 180°) to the image whitened by c[6]."""
    def fall(im: torch.Tensor, g: np.random.Generator) -> torch.Tensor:
        layer = torch.from_numpy(g.normal(loc=c[0], scale=c[1], size=im.shape[-2:])).to(im)[None, None]
        layer = clipped_zoom(layer, c[2])
        layer = torch.where(layer < c[3], torch.zeros_like(layer), layer).clamp(0, 1)
        layer = motion_blur(layer, int(c[4]), c[5], float(g.uniform(-135, -45)))
        lit = c[6] * im + (1 - c[6]) * torch.maximum(im, gray(im) * 1.5 + 0.5)
        return (lit + layer + torch.rot90(layer, 2, dims=(-2, -1))).clamp(0, 1)
    return per_image(x, gens, fall)


def plasma_fractal(mapsize: int, wibbledecay: float, g: np.random.Generator) -> np.ndarray:
    """Hendrycks' diamond-square height map, `mapsize` a power of two, normalised to [0, 1]."""
    grid = np.zeros((mapsize, mapsize))
    step, wibble = mapsize, 100.0

    def wibbled(a: np.ndarray) -> np.ndarray:
        return a / 4 + wibble * g.uniform(-wibble, wibble, a.shape)

    while step >= 2:
        half = step // 2
        corner = grid[0:mapsize:step, 0:mapsize:step]
        square = corner + np.roll(corner, -1, axis=0)
        square += np.roll(square, -1, axis=1)
        grid[half:mapsize:step, half:mapsize:step] = wibbled(square)
        dr, ul = grid[half:mapsize:step, half:mapsize:step], grid[0:mapsize:step, 0:mapsize:step]
        grid[0:mapsize:step, half:mapsize:step] = wibbled(dr + np.roll(dr, 1, axis=0) + ul + np.roll(ul, -1, axis=1))
        grid[half:mapsize:step, 0:mapsize:step] = wibbled(dr + np.roll(dr, 1, axis=1) + ul + np.roll(ul, -1, axis=0))
        step //= 2
        wibble /= wibbledecay
    grid -= grid.min()
    return grid / grid.max()


@CORRUPTIONS.register("fog", "weather", ((0.2, 3), (0.5, 3), (0.75, 2.5), (1, 2), (1.5, 1.75)),
                      ((1.5, 2), (2.0, 2), (2.5, 1.7), (2.5, 1.5), (3.0, 1.4)))
def fog(x: torch.Tensor, c: tuple[float, float], gens: Sequence[np.random.Generator]) -> torch.Tensor:
    """Fog: c[0] × a plasma fractal (wibble decay c[1]) added, the image rescaled to its old maximum."""
    h, w = x.shape[-2:]
    size = 1 << (max(h, w, 2) - 1).bit_length()  # the fractal's side: a power of two covering the image

    def haze(im: torch.Tensor, g: np.random.Generator) -> torch.Tensor:
        top = im.max()
        cloud = torch.from_numpy(plasma_fractal(size, c[1], g)[:h, :w]).to(im)
        return ((im + c[0] * cloud) * top / (top + c[0])).clamp(0, 1)
    return per_image(x, gens, haze)
