"""Input transformations both halves put in front of a model, and the gradients attacks take through them.

The robustness half deploys them in front of a classifier (`robustness/defenses/wrappers.py`), the
quality half in front of an image-quality metric (`quality/metrics/defended.py`): one implementation
of each transform, so a JPEG or a bit-depth defense means the same thing in both halves' records.

Every transform maps a batch (N, C, H, W) in [0, 1] to a batch, with no loop over images.
`straight_through` is BPDA with the identity as the approximation (Athalye et al. 2018): the
forward value is the transformed input, the backward pass hands the gradient to the input unchanged,
which is how an adaptive attack differentiates a transform that has no useful gradient
(rounding, a median); `bpda` also takes a differentiable approximation of the transform as its
backward pass (`jpeg_approx.differentiable_jpeg` for JPEG). `eot_mean` is EOT (expectation over transformation):
the mean of a function over several random draws, whose gradient is the mean of the draws' gradients.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Callable

import torch
import torch.nn.functional as F

from advbench.core import sample_draws
from advbench.core.errors import AdvbenchError
from advbench.core.hyperparameters import Range, Real, Whole

PARAMETERS: dict[str, dict[str, Range]] = {
    "jpeg": {"quality": Whole(1, high=100)},
    "bit_depth": {"bits": Whole(1, high=16)},
    "median": {"k": Whole(1, odd=True, high=15)},
    "blur": {"sigma": Real(0, 10, open_low=True)},
    "resize": {"factor": Real(1, 16)},
    "crop_flip": {"crop": Real(0, 1, open_low=True)},
}
"""Each transform's parameters and their valid values, declared once for both halves' defenses: a
classifier's wrapper (`defense.wrapper.*`) and a metric's defense (`defense.params.*`) check them alike."""


def check_parameters(transform: str, arguments: Mapping[str, Any], key: str) -> dict[str, Any]:
    """The `arguments` of `transform` that it declares, each checked; a bad one is one line naming it by the
    option's key (`key.<name>`: `defense.wrapper.quality`, `defense.params.quality`)."""
    return {name: valid.check("", f"{key}.{name}", arguments[name])
            for name, valid in PARAMETERS[transform].items() if name in arguments}


class _StraightThrough(torch.autograd.Function):
    """Forward: the transformed input `t`; backward: the gradient passed to `x` unchanged."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:  # noqa: ARG004
        return t.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # noqa: ARG004
        return grad, None


def straight_through(x: torch.Tensor, transformed: torch.Tensor) -> torch.Tensor:
    """`transformed`'s values with `x`'s gradient path: BPDA's identity backward pass."""
    return _StraightThrough.apply(x, transformed.detach())


def bpda(transform: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor,
         approx: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
    """`transform(x)` forward (run without autograd); backward through `approx(x)`, a differentiable
    function close to `transform`, or the identity when there is none (BPDA, Athalye et al. 2018)."""
    with torch.no_grad():
        t = transform(x.detach())
    if approx is None:
        return straight_through(x, t)
    surrogate = approx(x)
    return surrogate + (t - surrogate).detach()


def eot_mean(fn: Callable[[int], torch.Tensor], samples: int) -> torch.Tensor:
    """The mean of `fn(k)` over draws k = 0..samples-1: EOT's estimate of an expectation, gradient included."""
    return torch.stack([fn(k) for k in range(samples)]).mean(dim=0)


def jpeg_roundtrip(x: torch.Tensor, quality: int) -> torch.Tensor:
    """x in [0, 1] (N, C, H, W), C ∈ {1, 3}, encoded and decoded as JPEG at `quality`.

    libjpeg through torchvision.io, one batched call each way; inputs are quantised to uint8 first,
    as any JPEG file is, and CUDA inputs round-trip through the CPU codec so that results match on
    every device. No gradient flows (use `bpda`)."""
    from torchvision.io import ImageReadMode, decode_jpeg, encode_jpeg

    if x.shape[1] not in (1, 3):
        raise AdvbenchError(f"JPEG needs 1 or 3 channels, got {x.shape[1]}")
    images = (x.detach().clamp(0, 1) * 255).round().to(torch.uint8).cpu()
    data = encode_jpeg(list(images), quality=quality)
    decoded = decode_jpeg(data, mode=ImageReadMode.GRAY if x.shape[1] == 1 else ImageReadMode.RGB)
    return torch.stack(decoded).to(device=x.device, dtype=x.dtype) / 255


def bit_depth(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Each value rounded to the nearest of 2**bits evenly spaced levels in [0, 1] (Xu et al. 2018)."""
    levels = 2 ** bits - 1
    return torch.round(x.clamp(0, 1) * levels) / levels


def gaussian_blur(x: torch.Tensor, sigma: float) -> torch.Tensor:
    """A Gaussian blur of std `sigma` pixels: a separable kernel of 2⌈3σ⌉+1 taps, reflected borders
    (torchvision's `gaussian_blur` with that kernel size). Differentiable."""
    radius = math.ceil(3 * sigma)
    taps = torch.arange(-radius, radius + 1, device=x.device, dtype=x.dtype)
    kernel = torch.exp(-0.5 * (taps / sigma) ** 2)
    kernel = kernel / kernel.sum()
    c = x.shape[1]
    out = F.pad(x, (radius, radius, radius, radius), mode="reflect")
    out = F.conv2d(out, kernel.view(1, 1, 1, -1).expand(c, 1, 1, -1), groups=c)
    return F.conv2d(out, kernel.view(1, 1, -1, 1).expand(c, 1, -1, 1), groups=c)


def median_filter(x: torch.Tensor, k: int) -> torch.Tensor:
    """Each pixel the median of its k×k window per channel (k odd), mirrored borders
    (`scipy.ndimage.median_filter(mode="mirror")`)."""
    r = k // 2
    n, c, h, w = x.shape
    padded = F.pad(x, (r, r, r, r), mode="reflect")
    windows = F.unfold(padded.reshape(n * c, 1, h + 2 * r, w + 2 * r), k)   # (n*c, k*k, h*w)
    return windows.median(dim=1).values.view(n, c, h, w)


def resize_down_up(x: torch.Tensor, factor: float) -> torch.Tensor:
    """Shrink by `factor` (bilinear, antialiased), then back to the input's size (bilinear). Differentiable."""
    h, w = x.shape[-2:]
    small = (max(1, round(h / factor)), max(1, round(w / factor)))
    down = F.interpolate(x, size=small, mode="bilinear", align_corners=False, antialias=True)
    return F.interpolate(down, size=(h, w), mode="bilinear", align_corners=False)


def crop_flip(x: torch.Tensor, crop: float, seed: int, keys: torch.Tensor, stream: int) -> torch.Tensor:
    """A random crop of ⌊crop·side⌋ pixels each way at a uniform offset, mirrored left-right with
    probability one half; row i's draw is a function of (seed, keys[i], stream). Differentiable
    (an indexing of the input)."""
    n, c, h, w = x.shape
    ch, cw = max(1, int(crop * h)), max(1, int(crop * w))
    u = sample_draws.uniform(seed, keys, (3,), stream, device=x.device, dtype=torch.float64)
    top = (u[:, 0] * (h - ch + 1)).long().clamp(max=h - ch)
    left = (u[:, 1] * (w - cw + 1)).long().clamp(max=w - cw)
    cols = torch.arange(cw, device=x.device)
    cols = torch.where((u[:, 2] < 0.5)[:, None], cw - 1 - cols, cols) + left[:, None]       # (n, cw)
    rows = top[:, None] + torch.arange(ch, device=x.device)                                 # (n, ch)
    index = torch.arange(n, device=x.device)[:, None, None, None]
    channel = torch.arange(c, device=x.device)[None, :, None, None]
    return x[index, channel, rows[:, None, :, None], cols[:, None, None, :]]
