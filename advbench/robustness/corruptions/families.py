"""The corruption registry and the pieces several families share (filters, shifts, per-sample generators).

Constants come in two sets, as Hendrycks & Dietterich (ICLR 2019, arXiv 1903.12261) released
them: `make_cifar_c.py`'s for 32-px images (CIFAR-10-C, CIFAR-100-C) and `make_imagenet_c.py`'s
for 224-px ones (ImageNet-C). Their severities are calibrated on those sizes, so an image uses the
set of the size it is nearest: up to `SMALL_SIDE` pixels CIFAR-10-C's, above ImageNet-C's.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from advbench.core.registry import Registry

SMALL_SIDE = 64
"""The largest image side that gets CIFAR-10-C's constants; larger images get ImageNet-C's."""

Function = Callable[[torch.Tensor, Any, Sequence[np.random.Generator]], torch.Tensor]


@dataclass(frozen=True)
class Corruption:
    """One corruption: `fn(x, constant, generators)` on (N, C, H, W) in [0, 1], its five constants per
    set (`cifar`, `imagenet`), its family, and the smallest image side its constants make sense on."""

    name: str
    fn: Function
    family: str
    cifar: tuple[Any, ...]
    imagenet: tuple[Any, ...]
    min_side: int = 1
    why_not_small: str = ""

    def constant(self, side: int, severity: int) -> Any:
        return (self.cifar if side <= SMALL_SIDE else self.imagenet)[severity - 1]


CORRUPTIONS: Registry[Corruption] = Registry(
    "corruption", lambda name, fn, family, cifar, imagenet, min_side=1, why="":
    Corruption(name, fn, family, tuple(cifar), tuple(imagenet), min_side, why))


def constants_name(side: int) -> str:
    """Which constants an image of this side gets, as the records name them."""
    return "cifar10-c" if side <= SMALL_SIDE else "imagenet-c"


def generators(seed: int, sample_id: torch.Tensor, stream: int) -> list[np.random.Generator]:
    """One generator per sample, a pure function of (seed, sample id, stream): a sample's corruption
    does not depend on its batch. NumPy's rather than `core.sample_draws`' counters because the corruptions
    need Poisson, integer and plasma-fractal draws; `stream` is the corruption's, the same at every
    severity, so the severities of a sample share their noise and differ only by the constant."""
    return [np.random.default_rng([seed, int(i), stream]) for i in sample_id.tolist()]


def filter2d(x: torch.Tensor, kernel: torch.Tensor, mode: str = "reflect") -> torch.Tensor:
    """`kernel` (kh, kw) applied to every channel (cross-correlation, OpenCV's `filter2D`); borders padded
    by `mode` (`reflect` is OpenCV's BORDER_REFLECT_101), the kernel first trimmed of zero rows and
    columns so that small images can be padded."""
    nonzero = kernel.abs() > 0
    rows, cols = nonzero.any(1).nonzero().flatten(), nonzero.any(0).nonzero().flatten()
    r = min(int(rows[0]), kernel.shape[0] - 1 - int(rows[-1]), int(cols[0]), kernel.shape[1] - 1 - int(cols[-1]))
    kernel = kernel[r:kernel.shape[0] - r, r:kernel.shape[1] - r].to(x)
    ph, pw = kernel.shape[0] // 2, kernel.shape[1] // 2
    c = x.shape[1]
    padded = F.pad(x, (pw, pw, ph, ph), mode=mode if min(x.shape[-2:]) > max(ph, pw) else "replicate")
    return F.conv2d(padded, kernel.expand(c, 1, *kernel.shape), groups=c)


def gaussian_kernel(sigma: float, truncate: float = 4.0) -> torch.Tensor:
    """scikit-image's `gaussian` kernel (scipy's: radius ⌊truncate·σ + 0.5⌋), normalised."""
    radius = int(truncate * sigma + 0.5)
    taps = torch.arange(-radius, radius + 1, dtype=torch.float64)
    k = torch.exp(-0.5 * (taps / sigma) ** 2)
    return k / k.sum()


def gaussian(x: torch.Tensor, sigma: float, mode: str = "replicate", truncate: float = 4.0) -> torch.Tensor:
    """scikit-image's `gaussian(x, sigma)` per channel; `replicate` is its default `nearest` border."""
    if sigma <= 0:
        return x
    k = gaussian_kernel(sigma, truncate)
    return filter2d(filter2d(x, k.view(1, -1), mode), k.view(-1, 1), mode)


def shifted(x: torch.Tensor, dy: int, dx: int) -> torch.Tensor:
    """The image moved by (dy, dx) pixels, the edge row and column repeated into the gap
    (ImageNet-C's `shift` behind its motion blur)."""
    h, w = x.shape[-2:]
    rows = (torch.arange(h, device=x.device) - dy).clamp(0, h - 1)
    cols = (torch.arange(w, device=x.device) - dx).clamp(0, w - 1)
    return x[..., rows, :][..., cols]


def motion_blur(x: torch.Tensor, radius: int, sigma: float, angle: float) -> torch.Tensor:
    """ImageNet-C's motion blur (ImageMagick's `-motion-blur radius x sigma + angle` as
    `imagecorruptions` re-implements it): a one-sided Gaussian of 2·radius + 1 taps along `angle`
    degrees, stopped where the motion leaves the image."""
    width = 2 * radius + 1
    taps = torch.arange(width, dtype=torch.float64)
    kernel = torch.exp(-taps ** 2 / (2 * sigma ** 2))
    kernel = (kernel / kernel.sum()).tolist()
    py, px = width * math.sin(math.radians(angle)), width * math.cos(math.radians(angle))
    hypot = math.hypot(py, px)
    out = torch.zeros_like(x)
    for i, weight in enumerate(kernel):
        dy, dx = -math.ceil(i * py / hypot - 0.5), -math.ceil(i * px / hypot - 0.5)
        if abs(dy) >= x.shape[-2] or abs(dx) >= x.shape[-1]:
            break
        out = out + weight * shifted(x, dy, dx)
    return out


def clipped_zoom(x: torch.Tensor, factor: float) -> torch.Tensor:
    """The centre 1/`factor` of the image, zoomed back to its size (linear, corners aligned, as
    scipy's `zoom(order=1)` in Hendrycks' `clipped_zoom`), then trimmed to the input's size."""
    h, w = x.shape[-2:]
    ch, cw = math.ceil(h / factor), math.ceil(w / factor)
    top, left = (h - ch) // 2, (w - cw) // 2
    crop = x[..., top:top + ch, left:left + cw]
    size = (max(h, round(ch * factor)), max(w, round(cw * factor)))
    zoomed = F.interpolate(crop, size=size, mode="bilinear", align_corners=True)
    return zoomed[..., :h, :w]


def per_image(x: torch.Tensor, generators_: Sequence[np.random.Generator],
              fn: Callable[[torch.Tensor, np.random.Generator], torch.Tensor]) -> torch.Tensor:
    """`fn(image (1, C, H, W), its generator)` for each image of the batch."""
    return torch.cat([fn(x[i:i + 1], g) for i, g in enumerate(generators_)])


def gray(x: torch.Tensor) -> torch.Tensor:
    """Luma as PIL's `convert('L')` computes it (ITU-R 601-2); a one-channel image is its own."""
    if x.shape[1] == 1:
        return x
    weights = torch.tensor([0.299, 0.587, 0.114], dtype=x.dtype, device=x.device).view(1, 3, 1, 1)
    return (x * weights).sum(1, keepdim=True)
