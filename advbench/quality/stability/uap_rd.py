"""The job of `advbench uap stability`: a UAP applied to videos before H.264, RD records out.

`advbench.quality.stability.rd` computes and records the RD points; this module chooses the
videos (a folder, one file, or synthetic clips of the sample photos) and the perturbation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
from rich.console import Console

from advbench.core.digests import tensor_digest
from advbench.core.errors import AdvbenchError
from advbench.core.paths import no_links
from advbench.core.resume import warn
from advbench.quality.metrics.metric_contract import QualityMetric
from advbench.quality.metrics.scoring import device_of
from advbench.quality.stability.clips import make_synthetic_videos
from advbench.quality.stability.rd import RDRun, run_rd
from advbench.quality.stability.video import RawFormat
from advbench.quality.uap.perturbation import CLAMP, apply_uap, check_amplitude, load_uap, uap_file

VIDEO_SUFFIXES = {".y4m", ".yuv", ".mp4", ".mkv", ".avi", ".mov", ".webm"}


@dataclass(frozen=True)
class SyntheticClips:
    """The synthetic clips filmed when no videos are given (`synthetic:`, `clips.make_synthetic_videos`):
    how many (None: one per shipped photo), their size (H, W, or one side), frames, and the camera motions."""

    n: int | None
    size: int | tuple[int, int]
    frames: int
    motions: tuple[str, ...]


@dataclass(frozen=True)
class RawSettings:
    """How headerless .yuv videos are read (`raw:`): width and height None when the videos are not raw."""

    width: int | None
    height: int | None
    pix_fmt: str
    fps: float

    def format(self) -> RawFormat | None:
        """The raw format, as the values came (the RD records' identity holds them); None: not raw."""
        return RawFormat(self.width, self.height, self.pix_fmt, self.fps) if self.width else None


@dataclass(frozen=True)
class StabilitySpec:
    """What `advbench uap stability` runs: the plain values of its config (`conf/uap_stability.yaml`)."""

    metric: str                    # the metric option's name: records and file names
    perturbation: str | None       # a UAP file; None: the newest `uap train` wrote under uap_dir
    uap_dir: str
    videos: str | None             # a folder of videos or one file; None: synthetic clips
    synthetic: SyntheticClips
    raw: RawSettings
    amplitudes: Sequence[float]
    bitrates_kbps: Sequence[float]
    preset: str
    psnr: str
    csf: bool
    max_frames: int | None
    batch_size: int
    device: str
    force: bool
    out_dir: str
    progress: bool

    def __post_init__(self) -> None:
        """Amplitudes checked, and normalised, before any metric is built."""
        object.__setattr__(self, "amplitudes", tuple(check_amplitude(a) for a in self.amplitudes))


def job_videos(spec: Any) -> list[Path]:
    """The videos to test: a folder's video files, one file, or synthetic clips when `spec.videos` is None."""
    if spec.videos is None:
        s = spec.synthetic
        out_dir = Path(spec.out_dir).expanduser()
        return make_synthetic_videos(no_links(out_dir / "videos", out_dir), n=s.n, size=s.size, frames=s.frames,
                                     motions=s.motions)
    source = Path(spec.videos).expanduser()
    if source.is_file():
        return [source]
    if not source.is_dir():
        raise AdvbenchError(f"videos '{source}' does not exist: expected a folder of videos or one video file")
    found = sorted(p for p in source.iterdir() if p.suffix.lower() in VIDEO_SUFFIXES)
    if not found:
        raise AdvbenchError(f"no videos in '{source}': expected files ending in {', '.join(sorted(VIDEO_SUFFIXES))}")
    return found


def stability_job(spec: StabilitySpec, metric: QualityMetric) -> RDRun:
    """Perturb, encode and score every video x amplitude x bitrate; RD records to parquet."""
    amplitudes = list(spec.amplitudes)
    name, device = spec.metric, device_of(spec.device)
    path = uap_file(spec.perturbation, spec.uap_dir, name)
    delta = load_uap(path).to(device)
    check_visible(delta, amplitudes, path)
    fmt = spec.raw.format()
    videos = job_videos(spec)

    def perturb(frames: torch.Tensor, amplitude: float) -> torch.Tensor:
        return apply_uap(frames, delta, amplitude, csf=spec.csf)

    perturbation_key = f"uap={tensor_digest(delta)} csf={bool(spec.csf)}"
    result = run_rd(videos, metric, perturb, Path(spec.out_dir).expanduser(), metric_name=name,
                    perturbation_key=perturbation_key, amplitudes=amplitudes,
                    bitrates_kbps=list(spec.bitrates_kbps), preset=spec.preset, psnr_kind=spec.psnr, raw=fmt,
                    max_frames=spec.max_frames, batch_size=spec.batch_size, device=device, force=spec.force,
                    progress=spec.progress)
    stale = f", {len(result.stale)} of them replacing points made with other settings" if result.stale else ""
    Console().print(f"{name}: {len(result.written)} RD points written{stale}, {len(result.skipped)} already there "
                    f"(run {result.run_id}); next: advbench plot {spec.out_dir}")
    return result


def check_visible(delta: torch.Tensor, amplitudes: Sequence[float], path: Path) -> None:
    """Every amplitude able to change an 8-bit frame, else one line saying which cannot and what to do.

    The videos are 8-bit and their perturbed frames are rounded back to 8 bits before encoding, so
    an amplitude whose largest pixel change (`apply_uap`: the UAP times amplitude / CLAMP, a CSF mask
    only lowering it) stays under half a level leaves every frame as it was: its RD points are the
    clean curve's, with no gain and no loss. With none left there is no stability curve to draw.
    """
    per_amplitude = float(delta.abs().max()) / CLAMP * 255   # levels added at amplitude 1
    dead = [a for a in amplitudes if per_amplitude * a < 0.5]
    if not dead:
        return
    top = max(dead)
    said = f"the UAP {path} adds at most {per_amplitude * top:.2f} of one 8-bit level at amplitude {top:g}"
    if len(dead) < len(amplitudes):
        warn(f"amplitudes {', '.join(f'{a:g}' for a in dead)} change no 8-bit frame ({said}, which rounds away): "
             "their RD points equal the clean curve's, with zero gain and zero loss")
        return
    least = 0.5 / per_amplitude if per_amplitude > 0 else math.inf
    need = f" or give amplitudes of at least {least:.3g}" if least <= 1 else ""
    raise AdvbenchError(f"{said}, which rounds away: it changes no frame at any amplitude, so the stability curve "
                        f"would be empty; train it longer (e.g. uap.epochs=5, not uap=quick){need}")
