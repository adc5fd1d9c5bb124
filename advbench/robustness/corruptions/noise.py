"""Noise: Gaussian, shot (Poisson) and impulse (salt and pepper), pixel by pixel, so they apply at any size.

Constants: Hendrycks & Dietterich's `make_cifar_c.py` (32 px) and `make_imagenet_c.py` (224 px).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from advbench.robustness.corruptions.families import CORRUPTIONS, per_image


def _numpy(x: torch.Tensor) -> np.ndarray:
    return x.detach().cpu().double().numpy()


def _back(values: np.ndarray, like: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(np.clip(values, 0, 1)).to(like)


@CORRUPTIONS.register("gaussian_noise", "noise", (0.04, 0.06, 0.08, 0.09, 0.10), (0.08, 0.12, 0.18, 0.26, 0.38))
def gaussian_noise(x: torch.Tensor, scale: float, gens: Sequence[np.random.Generator]) -> torch.Tensor:
    """x + N(0, scale²) per value."""
    return per_image(x, gens, lambda im, g: _back(_numpy(im) + g.normal(size=im.shape, scale=scale), im))


@CORRUPTIONS.register("shot_noise", "noise", (500, 250, 100, 75, 50), (60, 25, 12, 5, 3))
def shot_noise(x: torch.Tensor, photons: float, gens: Sequence[np.random.Generator]) -> torch.Tensor:
    """Poisson(x · photons) / photons per value: fewer photons, more noise."""
    return per_image(x, gens, lambda im, g: _back(g.poisson(_numpy(im) * photons) / photons, im))


@CORRUPTIONS.register("impulse_noise", "noise", (0.01, 0.02, 0.03, 0.05, 0.07), (0.03, 0.06, 0.09, 0.17, 0.27))
def impulse_noise(x: torch.Tensor, amount: float, gens: Sequence[np.random.Generator]) -> torch.Tensor:
    """scikit-image's `random_noise(mode='s&p')`: each value, with probability `amount`, set to 0 or 1 alike."""
    def salt_and_pepper(im: torch.Tensor, g: np.random.Generator) -> torch.Tensor:
        out = _numpy(im)
        flipped = g.random(out.shape) <= amount
        salted = g.random(out.shape) < 0.5
        out[flipped & salted], out[flipped & ~salted] = 1.0, 0.0
        return _back(out, im)
    return per_image(x, gens, salt_and_pepper)
