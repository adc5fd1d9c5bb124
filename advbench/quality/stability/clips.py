"""Synthetic video clips filmed from the scikit-image photos: the offline stand-in for a video set.

A virtual camera pans, zooms or shakes over a photo, so clips have real texture and motion for
the codec and the metrics while nothing is downloaded.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from advbench.core.errors import AdvbenchError
from advbench.quality.images import photo_names, skimage_photo, to_tensor
from advbench.quality.stability.video import write_y4m

SYNTHETIC_SOURCES = ("astronaut", "coffee", "chelsea", "rocket", "immunohistochemistry", "hubble_deep_field")


MOTIONS = ("pan", "zoom", "shake")
"""Camera paths of the synthetic clips: a pan across the photo, a zoom towards an off-centre
point, and a hand-held shake (jitter plus a slight roll). They give the codec different work:
uniform motion, scaling, and high-frequency motion with rotation."""


def _camera(motion: str, frames: int, s_max: float, phase: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per frame: crop height `s` (normalised), centre offsets (tx, ty) in units of the free margin, roll."""
    t = torch.linspace(0, 1, frames)
    wave = lambda f, p: torch.sin(2 * math.pi * (f * t + p))  # noqa: E731 - a local shorthand
    zeros = torch.zeros_like(t)
    if motion == "pan":
        direction = 1.0 if phase < 0.5 else -1.0
        return s_max * torch.full_like(t, 0.7), direction * (0.8 * t - 0.4), 0.3 * math.sin(2 * math.pi * phase) * (1 - 2 * t), zeros
    if motion == "zoom":
        angle = 2 * math.pi * phase
        return s_max * (0.95 - 0.45 * t), 0.5 * math.cos(angle) * t, 0.5 * math.sin(angle) * t, zeros
    if motion == "shake":
        tx = 0.25 * wave(3.1, phase) + 0.12 * wave(7.3, 2 * phase)
        ty = 0.25 * wave(2.7, phase + 0.25) + 0.12 * wave(6.1, 3 * phase)
        return s_max * torch.full_like(t, 0.75), tx, ty, 0.03 * wave(4.3, phase + 0.5)
    raise AdvbenchError(f"unknown camera motion '{motion}'; valid: {', '.join(MOTIONS)}")


def _film(image: np.ndarray, size: tuple[int, int], frames: int, motion: str, phase: float) -> np.ndarray:
    """Frames (T, H, W, 3) in [0, 1] of a virtual camera moving over one photo, in one grid_sample."""
    out_h, out_w = size
    img = to_tensor(image)[None]
    img_h, img_w = img.shape[-2:]
    s_max = min(1.0, img_w * out_h / (img_h * out_w))  # crop height (normalised) that fits
    s, tx, ty, roll = _camera(motion, frames, s_max, phase)
    pre = min(1.0, out_h / (float(s.min()) * img_h))  # anti-alias once for the closest zoom
    if pre < 1.0:
        img = F.interpolate(img, scale_factor=pre, mode="bilinear", antialias=True, align_corners=False)
    aspect = (out_w / out_h) * (img_h / img_w)
    sw = s * aspect
    # The roll is rigid in pixels: both rows carry the same pixel scale s * img_h / out_h.
    cos, sin = torch.cos(roll), torch.sin(roll)
    row_x = torch.stack([sw * cos, -sw * sin * (out_h / out_w), (1 - sw) * tx], -1)
    row_y = torch.stack([s * sin * (out_w / out_h), s * cos, (1 - s) * ty], -1)
    grid = F.affine_grid(torch.stack([row_x, row_y], 1), [frames, 3, out_h, out_w], align_corners=False)
    video = F.grid_sample(img.expand(frames, -1, -1, -1), grid, mode="bilinear", padding_mode="reflection",
                          align_corners=False)
    return video.clamp(0, 1).permute(0, 2, 3, 1).numpy()


def make_synthetic_videos(
    out_dir: str | Path, n: int | None = 2, size: int | tuple[int, int] = 64, frames: int = 8, fps: int = 25,
    motions: Sequence[str] = MOTIONS,
) -> list[Path]:
    """Y4M clips filmed by a moving camera over the photos scikit-image ships (no download).

    Clip i films photo i (every shipped photo when `n` is None, colour ones first) with
    motion i mod len(motions), so neighbouring clips differ in both content and motion.
    """
    height, width = (size, size) if isinstance(size, int) else size
    sources = SYNTHETIC_SOURCES + tuple(p for p in photo_names("all") if p not in SYNTHETIC_SOURCES)
    n = len(sources) if n is None else n
    if n < 1 or frames < 1 or height % 2 or width % 2 or min(height, width) < 16 or not motions:
        raise AdvbenchError(
            f"synthetic videos need n >= 1, frames >= 1, an even size >= 16 and a motion; got n={n}, "
            f"frames={frames}, size={height}x{width}, motions={list(motions)}"
        )
    paths = []
    for i in range(n):
        name, motion = sources[i % len(sources)], motions[i % len(motions)]
        clip = _film(skimage_photo(name)(), (height, width), frames, motion, phase=(i * 0.37) % 1)
        paths.append(write_y4m(Path(out_dir) / f"synthetic{i:02d}_{name}_{motion}.y4m", clip, fps))
    return paths
