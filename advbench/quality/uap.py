"""Universal adversarial perturbations (UAPs) against no-reference quality metrics (seed, section 3.1).

A UAP is one 256x256 RGB tensor delta in [-0.1, 0.1], trained like network weights (Adam,
lr 1e-3, 5 epochs, batch 8) so that `metric(image + delta)` rises for every training image,
then applied to any frame at amplitude a as `clip(frame + tile(delta) * 10 * a, 0, 1)`: at
a = 0.1 the frame gets delta itself, and in general no pixel moves by more than a.

The loss is the seed's equation (1), `loss = 1 - metric(batch + p) / a`, with a the width of
the metric's score range. Written with the metric's *goodness* g = (s - lo) / a (for
higher-better metrics, identical to the seed's s / a when lo = 0) the loss is `1 - g`; a
lower-better metric such as NIQE has g = (hi - s) / a instead, i.e. the sign of the score
flips, so minimising the same loss always pushes the metric towards "better quality".

Files: `save_uap` writes a `.pt` (tensor + metadata) and a `.png` in the seed's convention,
pixel = round((delta + 0.5) * 255) (so delta in [-0.1, 0.1] maps to 102..153); `load_uap`
reads either, so the seed's published PNG loads directly.

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
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from advbench.core.download import open_no_follow
from advbench.core.errors import AdvbenchError
from advbench.core.paths import refuse_link
from advbench.core.torchfile import read_torch_file
from advbench.quality.images import read_image
from advbench.quality.metrics.base import QualityMetric

CLAMP = 0.1  # the seed's perturbation bound; apply_uap scales by amplitude / CLAMP (= 10 a)
SIZE = 256
_PNG_TOLERANCE = 1e-6
_LUMA = (0.299, 0.587, 0.114)
PIXELS_PER_DEGREE = 60.0


def device_of(name: str | torch.device | None) -> torch.device:
    """`auto`/None -> CUDA when present, else CPU; anything else as given."""
    if name in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def sync_device(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def goodness(metric: QualityMetric, scores: torch.Tensor) -> torch.Tensor:
    """Scores mapped so that 1 means the best end of the metric's range and 0 the worst."""
    lo, hi = metric.score_range
    width = metric.range_width
    return (scores - lo) / width if metric.higher_better else (hi - scores) / width


def signed_gain(metric: QualityMetric, before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
    """after - before in the metric's units, sign flipped for lower-better metrics (positive = "better")."""
    diff = after - before
    return diff if metric.higher_better else -diff


def uap_loss(metric: QualityMetric, images: torch.Tensor) -> torch.Tensor:
    """The seed's loss 1 - metric(batch + p) / a, in goodness form (see the module docstring)."""
    return 1 - goodness(metric, metric(images)).mean()


def _loader(images: torch.Tensor | Dataset, batch_size: int, seed: int, shuffle: bool) -> DataLoader:
    return DataLoader(images, batch_size=batch_size, shuffle=shuffle,
                      generator=torch.Generator().manual_seed(seed))


def _check_images(images: torch.Tensor | Dataset, size: int) -> None:
    if len(images) == 0:
        raise AdvbenchError("no training images: expected at least one image")
    shape = tuple(images[0].shape)
    if shape != (3, size, size):
        raise AdvbenchError(f"UAP images must be (3, {size}, {size}), got {shape}")


def train_uap(metric: QualityMetric, images: torch.Tensor | Dataset, *, size: int = SIZE, clamp: float = CLAMP,
              lr: float = 1e-3, epochs: int = 5, batch_size: int = 8, seed: int = 0,
              device: str | torch.device | None = None, progress: bool = True) -> torch.Tensor:
    """Train a size x size UAP on `images` ((N, 3, size, size) tensor or a data set of such).

    Adam on p (zero start), loss 1 - goodness(metric(clip(batch + p))), p clamped to
    [-clamp, clamp] after every step, images shuffled each epoch with `seed`. Returns p on CPU.
    """
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    if epochs < 1 or batch_size < 1 or not clamp > 0:
        raise AdvbenchError(f"UAP training needs epochs >= 1, batch_size >= 1, clamp > 0; "
                            f"got {epochs}, {batch_size}, {clamp}")
    _check_images(images, size)
    dev = device_of(device)
    metric = metric.to(dev).eval()
    torch.manual_seed(seed)
    p = torch.zeros(3, size, size, device=dev, requires_grad=True)
    opt = torch.optim.Adam([p], lr=lr)
    loader = _loader(images, batch_size, seed, shuffle=True)
    columns = (TextColumn("UAP epoch {task.fields[epoch]}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("loss {task.fields[loss]:.4f}"), TimeRemainingColumn())
    with Progress(*columns, disable=not progress) as bar:
        task = bar.add_task("uap", total=epochs * len(loader), epoch=1, loss=float("nan"))
        for epoch in range(epochs):
            for batch in loader:
                loss = uap_loss(metric, (batch.to(dev, non_blocking=True) + p).clamp(0, 1))
                (p.grad,) = torch.autograd.grad(loss, p)
                opt.step()
                with torch.no_grad():
                    p.clamp_(-clamp, clamp)
                bar.update(task, advance=1, epoch=epoch + 1, loss=loss.item())
    return p.detach().cpu()


def metric_throughput(metric: QualityMetric, batch: torch.Tensor, repeats: int = 3,
                      device: str | torch.device | None = None) -> float:
    """Images per second of the metric's own forward + backward (w.r.t. the input) on `batch`.

    The upper bound for UAP training speed: one UAP step is exactly one such pass plus Adam.
    """
    dev = device_of(device)
    metric = metric.to(dev).eval()
    x = batch.to(dev).requires_grad_(True)
    torch.autograd.grad(metric(x).sum(), x)  # warm-up (allocator, cuDNN autotune)
    sync_device(dev)
    start = time.perf_counter()
    for _ in range(repeats):
        torch.autograd.grad(metric(x).sum(), x)
    sync_device(dev)
    return repeats * len(batch) / (time.perf_counter() - start)


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


@torch.no_grad()
def score(metric: QualityMetric, images: torch.Tensor, batch_size: int = 8,
          device: str | torch.device | None = None) -> torch.Tensor:
    """Metric scores of (N, 3, H, W) images in batches, on CPU."""
    dev = device_of(device)
    metric = metric.to(dev).eval()
    return torch.cat([metric(b.to(dev)).float().cpu() for b in images.split(batch_size)])


def evaluate_uap(metric: QualityMetric, images: torch.Tensor, uap: torch.Tensor, amplitudes: Sequence[float], *,
                 csf: bool = False, batch_size: int = 8,
                 device: str | torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Clean scores (N,), attacked scores (A, N) and the seconds spent applying the UAP (not scoring)."""
    dev = device_of(device)
    levels = [check_amplitude(a) for a in amplitudes]
    clean = score(metric, images, batch_size, dev)
    attacked, seconds = [], 0.0
    for a in levels:
        outs = []
        for batch in images.split(batch_size):
            batch = batch.to(dev)
            sync_device(dev)
            start = time.perf_counter()
            adv = apply_uap(batch, uap, a, csf)
            sync_device(dev)
            seconds += time.perf_counter() - start
            outs.append(score(metric, adv, batch_size, dev))
        attacked.append(torch.cat(outs))
    return clean, torch.stack(attacked), seconds


ABLATION_FACTORS = {"seed": "training seed", "n_train": "training images", "epochs": "epochs", "data": "training data"}
ABLATION_COLUMNS = 2
"""Panels per row of the ablation figure, as in the robustness figures."""


def ablation_figure(records: pd.DataFrame, amplitude: float | None = None) -> Any:
    """One panel per ablation factor that varies: the spread of per-image gains.

    `records` are the `*.parquet` files `advbench uap train` writes (columns metric, seed,
    n_train, epochs, amplitude, gain; optionally data). Sweeps vary one factor at a time, so
    each panel keeps the runs whose other factors sit at their most common value (the
    reference run) and shows one box of per-image gains per level of its factor (quartiles,
    median, whiskers from the smallest to the largest gain, as the legend says), with the
    runs' means as dots, at `amplitude` (default: the largest).
    """
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    needed = {"metric", "seed", "n_train", "epochs", "amplitude", "gain"}
    if needed - set(records.columns):
        raise AdvbenchError(f"ablation records need columns {sorted(needed)}, missing {sorted(needed - set(records.columns))}")
    # `uap eval` writes its Table-1 records into the same folder; they carry no training keys.
    records = records.dropna(subset=["seed", "n_train", "epochs"])
    if records.empty:
        raise AdvbenchError("no `advbench uap train` records among the files given")
    # Seeds and counts are whole numbers; the NaNs of Table-1 rows had made them floats.
    records = records.astype({"seed": "int64", "n_train": "int64", "epochs": "int64"})
    amp = float(records["amplitude"].max()) if amplitude is None else float(amplitude)
    df = records[np.isclose(records["amplitude"], amp)]
    if df.empty:
        raise AdvbenchError(f"no ablation records at amplitude {amp}; have {sorted(records['amplitude'].unique())}")
    factors = [f for f in ABLATION_FACTORS if f in df and df[f].nunique() > 1] or ["seed"]
    run_keys = [c for c in ("metric", "data", "seed", "n_train", "epochs") if c in df]
    runs = df.groupby(run_keys)["gain"].mean().reset_index()
    baseline = {f: runs[f].mode().iloc[0] for f in factors}
    ncols = min(len(factors), ABLATION_COLUMNS)
    nrows = -(-len(factors) // ncols)
    fig = Figure(figsize=(4.2 * ncols, 3.4 * nrows + 0.9), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for ax in axes[len(factors):]:
        fig.delaxes(ax)
    for ax, factor in zip(axes, factors):
        others = [f for f in factors if f != factor]
        rows = df[(df[others] == pd.Series(baseline)[others]).all(axis=1)] if others else df
        panel_runs = runs[(runs[others] == pd.Series(baseline)[others]).all(axis=1)] if others else runs
        levels = sorted(rows[factor].unique())
        ax.boxplot([rows.loc[rows[factor] == v, "gain"].to_numpy() for v in levels], whis=(0, 100),
                   medianprops={"color": "C1"})
        pos = panel_runs[factor].map({v: i + 1 for i, v in enumerate(levels)})
        ax.scatter(pos, panel_runs["gain"], color="C3", s=14, zorder=3)
        ax.set_xticks(range(1, len(levels) + 1), [str(v) for v in levels])
        ax.set_xlabel(ABLATION_FACTORS[factor])
        ax.set_ylabel("metric gain per image")
        ax.axhline(0, color="0.6", lw=0.8)
    legend = [Patch(facecolor="none", edgecolor="black", label="images: quartiles (box), median (line), min–max (whiskers)"),
              Line2D([], [], color="C3", marker="o", linestyle="none", markersize=4, label="mean of one training run")]
    fig.legend(handles=legend, loc="outside lower center", ncols=1, frameon=False, fontsize="small")
    fig.suptitle(f"UAP ablation, {', '.join(sorted(df['metric'].unique()))}, amplitude {amp:g}")
    return fig


def plot_ablation(records: pd.DataFrame, out: str | Path, amplitude: float | None = None) -> Path:
    """Save :func:`ablation_figure` of `records` at `out` (PNG, 150 dpi)."""
    fig = ablation_figure(records, amplitude)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=150)
    return out
