"""Universal adversarial perturbations (UAPs) against no-reference quality metrics (seed, section 3.1): the files.

A UAP is one 256x256 RGB tensor delta in [-0.1, 0.1] (trained in `advbench.quality.uap.training`),
applied to any frame at amplitude a as `clip(frame + tile(delta) * 10 * a, 0, 1)`: at a = 0.1 the
frame gets delta itself, and in general no pixel moves by more than a.

Files: `save_uap` writes a `.pt` (tensor + metadata) and a `.png` in the seed's convention,
pixel = round((delta + 0.5) * 255) (so delta in [-0.1, 0.1] maps to 102..153); `load_uap`
reads either, so the seed's published PNG loads directly; `trained_uap` finds the newest one
`advbench uap train` wrote for a metric.

CSF masking (seed, Figure 4): `apply_uap(..., csf=True)` scales the perturbation per pixel by
a contrast mask, so it is strong where the frame is busy (masking hides it) and faint on
flat areas. The mask is the local energy of the frame's luma filtered with the
Mannos-Sakrison contrast-sensitivity function (viewing at 60 pixels per degree, about three
picture heights for 1080p), smoothed with a Gaussian of 0.25 degree, divided by twice its
frame mean and clipped to [0, 1].
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Mapping

import torch
from PIL import Image

from advbench.core.download import open_no_follow
from advbench.core.errors import AdvbenchError
from advbench.core.paths import refuse_link
from advbench.core.torchfile import read_torch_file
from advbench.quality.images import read_image

CLAMP = 0.1  # the seed's perturbation bound; apply_uap scales by amplitude / CLAMP (= 10 a)
SIZE = 256
_PNG_TOLERANCE = 1e-6
_LUMA = (0.299, 0.587, 0.114)
PIXELS_PER_DEGREE = 60.0


def save_uap(uap: torch.Tensor, path: str | Path, meta: Mapping[str, Any] | None = None) -> tuple[Path, Path]:
    """Write `<path>.pt` (tensor + JSON-able metadata) and `<path>.png` (seed convention).

    Each file is opened without following a link, and a link at any of the three names
    (`.pt`, its `.pt.tmp` and `.png`) is refused before anything is written: the UAP never
    overwrites a file elsewhere. The `.pt` is written to its `.pt.tmp` and renamed; a write that
    fails (a full disk) removes the temporary file, or the half-written `.png`, and lets the
    OSError go on to the command's one line.
    """
    check_uap(uap, "uap")
    base = Path(path).expanduser()
    pt, png = base.with_suffix(".pt"), base.with_suffix(".png")
    tmp = pt.with_suffix(".pt.tmp")
    for file in (pt, tmp, png):
        refuse_link(file)
    base.parent.mkdir(parents=True, exist_ok=True)
    try:
        with os.fdopen(open_no_follow(tmp, append=False), "wb") as out:
            torch.save({"uap": uap.detach().cpu().float(), "meta": json.dumps(dict(meta or {}))}, out)
        tmp.replace(pt)
    finally:
        tmp.unlink(missing_ok=True)
    pixels = ((uap.detach().cpu().float() + 0.5) * 255).round().clamp(0, 255).byte()
    try:
        with os.fdopen(open_no_follow(png, append=False), "wb") as out:
            Image.fromarray(pixels.permute(1, 2, 0).numpy()).save(out, format="PNG")
    except OSError:
        png.unlink(missing_ok=True)
        raise
    return pt, png


def check_uap(uap: torch.Tensor, source: str, clamp: float = CLAMP) -> torch.Tensor:
    """A (3, H, W) float tensor within [-clamp, clamp], else a one-line error naming `source`."""
    if uap.dim() != 3 or uap.shape[0] != 3 or uap.numel() == 0:
        raise AdvbenchError(f"{source}: expected a UAP of shape (3, H, W) with H, W >= 1, got {tuple(uap.shape)}")
    peak = float(uap.abs().max())
    if not math.isfinite(peak) or peak > clamp + _PNG_TOLERANCE:
        raise AdvbenchError(f"{source}: UAP values must lie in [-{clamp}, {clamp}] (PNG pixels "
                            f"{round((0.5 - clamp) * 255)}..{round((0.5 + clamp) * 255)}), got max |delta| = {peak:.4f}")
    return uap


def load_uap(path: str | Path) -> torch.Tensor:
    """A UAP from `.pt` (save_uap) or `.png` (pixel p -> delta = p / 255 - 0.5, the seed's file)."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise AdvbenchError(f"no UAP at '{file}': expected a .pt or .png written by `advbench uap train`")
    suffix = file.suffix.lower()
    if suffix == ".png":
        uap = read_image(file) - 0.5  # one reader for every image file: its decompression-bomb and format checks
    elif suffix in (".pt", ".pth"):
        obj = read_torch_file(file, "UAP")
        uap = obj.get("uap") if isinstance(obj, dict) else obj
        if not isinstance(uap, torch.Tensor):
            raise AdvbenchError(f"'{file}' holds no UAP tensor (expected key 'uap')")
    else:
        raise AdvbenchError(f"UAP file '{file}' must end in .pt or .png, got '{file.suffix}'")
    return check_uap(uap.float().contiguous(), str(file)).clamp(-CLAMP, CLAMP)


def uap_meta(path: str | Path) -> dict[str, Any]:
    """The metadata saved next to a `.pt` UAP (empty for PNGs)."""
    file = Path(path).expanduser()
    if file.suffix.lower() not in (".pt", ".pth"):
        return {}
    obj = torch.load(file, map_location="cpu", weights_only=True)
    return json.loads(obj.get("meta", "{}")) if isinstance(obj, dict) else {}


def trained_uap(out_dir: str | Path, name: str) -> Path:
    """The newest UAP `uap train` wrote for a metric, or a one-line error saying what to do."""
    folder = Path(out_dir).expanduser() / name
    found = sorted(folder.glob("*.pt"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise AdvbenchError(f"no trained UAP for '{name}' in '{folder}'; run `advbench uap train metric={name}` "
                            "or pass perturbation=PATH (.pt or .png)")
    return found[-1]


def uap_file(perturbation: str | None, uap_dir: str, name: str) -> Path:
    """The UAP a job applies: the file given, else the newest `uap train` wrote for the metric."""
    return Path(perturbation).expanduser() if perturbation else trained_uap(uap_dir, name)


def tile_uap(uap: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Repeat the UAP square to cover height x width (e.g. 256 -> 1920x1080), cropping the rest."""
    h, w = uap.shape[-2:]
    return uap.repeat(1, math.ceil(height / h), math.ceil(width / w))[:, :height, :width]


def check_amplitude(amplitude: Any, key: str = "UAP amplitude", *, baseline: bool = False) -> float:
    """An amplitude is the largest pixel change, in (0, 1]; `baseline`: 0 (the unperturbed level) too.

    The one check of every amplitude a user gives (options, UAP files, RD levels), so all say the same.
    """
    number = isinstance(amplitude, (int, float)) and not isinstance(amplitude, bool)
    a = float(amplitude) if number else math.nan
    if not (math.isfinite(a) and (0 < a <= 1 or (baseline and a == 0))):
        extra = " (0, the unperturbed level, is allowed too)" if baseline else ""
        raise AdvbenchError(f"{key} must be in (0, 1], got {amplitude!r}{extra}")
    return a


def csf_mask(frames: torch.Tensor, pixels_per_degree: float = PIXELS_PER_DEGREE) -> torch.Tensor:
    """(N, 3, H, W) in [0, 1] -> (N, 1, H, W) in [0, 1]: where the frame masks a perturbation.

    Luma is filtered with the Mannos-Sakrison CSF A(f) = 2.6 (0.0192 + 0.114 f) exp(-(0.114 f)^1.1)
    (f in cycles/degree, peak normalised to 1), squared, smoothed with a 0.25-degree Gaussian
    (both in the Fourier domain, so edges wrap), square-rooted, then divided by twice its
    frame mean and clipped to 1.
    """
    h, w = frames.shape[-2:]
    luma = (frames * frames.new_tensor(_LUMA).view(1, 3, 1, 1)).sum(1)
    fy = torch.fft.fftfreq(h, device=frames.device).view(-1, 1)
    fx = torch.fft.rfftfreq(w, device=frames.device).view(1, -1)
    radius = (fy ** 2 + fx ** 2).sqrt()  # cycles per pixel
    f = radius * pixels_per_degree
    csf = 2.6 * (0.0192 + 0.114 * f) * torch.exp(-(0.114 * f) ** 1.1)
    csf = csf / csf.max()
    band = torch.fft.irfft2(torch.fft.rfft2(luma - luma.mean((-2, -1), keepdim=True)) * csf, s=(h, w))
    sigma = 0.25 * pixels_per_degree  # pixels
    smooth = torch.exp(-2 * (math.pi * sigma * radius) ** 2)
    energy = torch.fft.irfft2(torch.fft.rfft2(band ** 2) * smooth, s=(h, w)).clamp_min(0).sqrt()
    scale = 2 * energy.mean((-2, -1), keepdim=True) + 1e-8
    return (energy / scale).clamp(0, 1).unsqueeze(1)


def apply_uap(frames: torch.Tensor, uap: torch.Tensor, amplitude: float, csf: bool = False) -> torch.Tensor:
    """clip(frames + tile(uap) * amplitude / 0.1 [* CSF mask], 0, 1) for (N, 3, H, W) frames in [0, 1]."""
    a = check_amplitude(amplitude)
    if frames.dim() != 4 or frames.shape[1] != 3:
        raise AdvbenchError(f"frames must be (N, 3, H, W) in [0, 1], got shape {tuple(frames.shape)}")
    delta = tile_uap(uap.to(frames), *frames.shape[-2:]) * (a / CLAMP)
    if csf:
        delta = delta * csf_mask(frames)
    return (frames + delta).clamp(0, 1)
