"""The stability job: perturb raw videos, compress them with H.264, record RD points.

For each video × amplitude × bitrate the perturbation is applied to the raw frames *before*
encoding (as a preprocessing step would be), the clip goes through libx264 and back, and the
target metric (on decoded frames) and luma PSNR (decoded vs the *unperturbed* source) are
averaged over frames. One parquet part per (video, amplitude, bitrate) is written
atomically, so a killed run resumes where it stopped.

RD record columns: run_id, metric, higher_better, video, amplitude, target_bitrate_kbps,
real_bitrate_kbps, metric_score (mean over frames), psnr (mean luma PSNR over frames, dB),
n_frames, codec_seconds, metric_seconds, created_at (UTC). `higher_better` lets the
stability score treat lower-is-better metrics correctly.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from advbench.errors import AdvbenchError
from advbench.iqa.metrics.base import QualityMetric
from advbench.iqa.video import H264Transcoder, RawFormat, VideoInfo, iter_chunks, probe, psnr_y, write_y4m
from advbench.records import write_part

Perturbation = Callable[[torch.Tensor, float], torch.Tensor]
"""(frames NCHW in [0, 1], amplitude) -> perturbed frames in [0, 1], e.g.
`lambda f, a: apply_uap(f, uap, a)`."""

DEFAULT_AMPLITUDES = (0.02, 0.04, 0.06, 0.08)
DEFAULT_BITRATES_KBPS = (200, 1000, 5000, 12000)
SYNTHETIC_SOURCES = ("astronaut", "coffee", "chelsea", "rocket", "immunohistochemistry", "hubble_deep_field")


def check_amplitudes(amplitudes: Sequence[float]) -> list[float]:
    """0 (the unperturbed baseline, always included) plus the given levels, each in (0, 1]."""
    bad = [a for a in amplitudes if not (math.isfinite(a) and 0 <= a <= 1)]
    if bad:
        raise AdvbenchError(f"amplitude must be 0 (no perturbation) or in (0, 1]; got {bad[0]}")
    return sorted({0.0, *map(float, amplitudes)})


def _check_bitrates(bitrates_kbps: Sequence[float]) -> list[float]:
    bad = [b for b in bitrates_kbps if not (math.isfinite(b) and b > 0)]
    if bad or not bitrates_kbps:
        raise AdvbenchError(f"bitrates must be a non-empty list of positive kbps; got {list(bitrates_kbps)}")
    return sorted(set(map(float, bitrates_kbps)))


def part_path(out_dir: Path, metric: str, video: str, amplitude: float, bitrate_kbps: float) -> Path:
    """Where the record of one (video, amplitude, bitrate) point lives; its presence means done."""
    return out_dir / metric / video / f"a{amplitude:.4f}_b{bitrate_kbps:g}k.parquet"


def score_frames(
    metric: QualityMetric, frames: np.ndarray, batch_size: int, device: torch.device | str
) -> np.ndarray:
    """Metric score per frame of a float RGB (T, H, W, 3) array, in batches."""
    x = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2)
    with torch.inference_mode():
        scores = [metric(batch.to(device)).float().cpu() for batch in x.split(batch_size)]
    return torch.cat(scores).numpy()


@dataclass
class _Point:
    """One bitrate of one (video, amplitude): its transcoder and running sums."""

    bitrate_kbps: float
    codec: H264Transcoder
    reference: Iterator[np.ndarray]
    scores: list[np.ndarray] = field(default_factory=list)
    psnrs: list[np.ndarray] = field(default_factory=list)
    metric_seconds: float = 0.0
    _ref_buffer: np.ndarray | None = None

    def take_reference(self, n: int) -> np.ndarray:
        """Next n frames of the unperturbed source, read alongside the decoder's output."""
        parts, have = [], 0
        if self._ref_buffer is not None:
            parts, have = [self._ref_buffer], len(self._ref_buffer)
        while have < n:
            chunk = next(self.reference)
            parts.append(chunk)
            have += len(chunk)
        joined = np.concatenate(parts)
        self._ref_buffer = joined[n:]
        return joined[:n]


@dataclass(frozen=True)
class RDRun:
    """What a run did: the parts it wrote and the ones it found already done."""

    run_id: str
    written: list[Path]
    skipped: list[Path]


def run_rd(
    videos: Sequence[str | Path],
    metric: QualityMetric,
    perturb: Perturbation,
    out_dir: str | Path,
    *,
    metric_name: str,
    amplitudes: Sequence[float] = DEFAULT_AMPLITUDES,
    bitrates_kbps: Sequence[float] = DEFAULT_BITRATES_KBPS,
    preset: str = "medium",
    raw: RawFormat | None = None,
    max_frames: int | None = None,
    chunk_frames: int = 16,
    batch_size: int = 8,
    device: torch.device | str = "cpu",
    force: bool = False,
    run_id: str | None = None,
    progress: bool = True,
) -> RDRun:
    """Record RD points for every video × amplitude × bitrate; skip parts that exist unless force.

    Each (video, amplitude) is read and perturbed once and fed to one encoder per missing
    bitrate, so memory stays at a chunk plus the encoders' look-ahead.
    """
    levels = check_amplitudes(amplitudes)
    rates = _check_bitrates(bitrates_kbps)
    paths = [Path(v) for v in videos]
    if not paths:
        raise AdvbenchError("no videos given: expected at least one Y4M/.yuv/video file")
    stems = [p.stem for p in paths]
    if len(set(stems)) != len(stems):
        raise AdvbenchError(f"video names must be unique (records key on them); got {stems}")
    infos = {path: probe(path, raw) for path in paths}  # fail on a bad file before any work
    out = Path(out_dir)
    run_id = run_id or uuid.uuid4().hex[:12]
    job = _Job(metric.to(device).eval(), perturb, preset, raw, max_frames, chunk_frames, batch_size, device)

    def part(path: Path, amp: float, rate: float) -> Path:
        return part_path(out, metric_name, path.stem, amp, rate)

    todo = [
        (path, amp, [r for r in rates if force or not part(path, amp, r).exists()])
        for path in paths
        for amp in levels
    ]
    skipped = [part(path, amp, r) for path, amp, missing in todo for r in rates if r not in missing]
    written: list[Path] = []
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with Progress(*columns, disable=not progress) as bar:
        task = bar.add_task(f"RD {metric_name}", total=sum(len(m) for _, _, m in todo))
        for path, amp, missing in todo:
            if not missing:
                continue
            bar.update(task, description=f"RD {metric_name} {path.stem} a={amp:g}")
            for point in job.run(path, infos[path], amp, missing):
                record = _record(point, run_id, metric_name, metric, path.stem, amp)
                written.append(write_part(record, part(path, amp, point.bitrate_kbps)))
                bar.advance(task)
    return RDRun(run_id, written, skipped)


@dataclass(frozen=True)
class _Job:
    """The settings every (video, amplitude) of one run shares."""

    metric: QualityMetric
    perturb: Perturbation
    preset: str
    raw: RawFormat | None
    max_frames: int | None
    chunk_frames: int
    batch_size: int
    device: torch.device | str

    def chunks(self, path: Path) -> Iterator[np.ndarray]:
        return iter_chunks(path, self.chunk_frames, self.raw, self.max_frames)

    def _consume(self, point: _Point, decoded: np.ndarray) -> None:
        if not len(decoded):
            return
        start = time.perf_counter()
        point.scores.append(score_frames(self.metric, decoded, self.batch_size, self.device))
        point.metric_seconds += time.perf_counter() - start
        point.psnrs.append(psnr_y(point.take_reference(len(decoded)), decoded))

    def run(self, path: Path, info: VideoInfo, amplitude: float, bitrates: list[float]) -> list[_Point]:
        """Stream one (video, amplitude) through one transcoder per bitrate."""
        points = [
            _Point(r, H264Transcoder(info.width, info.height, info.fps, r, self.preset), self.chunks(path))
            for r in bitrates
        ]
        for chunk in self.chunks(path):
            if amplitude > 0:
                frames = torch.from_numpy(chunk).permute(0, 3, 1, 2).to(self.device)
                with torch.no_grad():
                    perturbed = self.perturb(frames, amplitude).clamp(0, 1)
                chunk = perturbed.permute(0, 2, 3, 1).float().cpu().contiguous().numpy()
            for point in points:
                self._consume(point, point.codec.push(chunk))
        for point in points:
            self._consume(point, point.codec.flush())
        return points


def _record(
    point: _Point, run_id: str, metric_name: str, metric: QualityMetric, video: str, amplitude: float
) -> pd.DataFrame:
    scores, psnrs = np.concatenate(point.scores), np.concatenate(point.psnrs)
    if not np.isfinite(scores).all():
        raise AdvbenchError(f"metric {metric_name} returned non-finite scores on {video} a={amplitude:g}")
    return pd.DataFrame(
        {
            "run_id": [run_id],
            "metric": metric_name,
            "higher_better": bool(metric.higher_better),
            "video": video,
            "amplitude": amplitude,
            "target_bitrate_kbps": point.bitrate_kbps,
            "real_bitrate_kbps": point.codec.real_bitrate_kbps,
            "metric_score": float(scores.mean()),
            "psnr": float(psnrs.mean()),
            "n_frames": len(scores),
            "codec_seconds": point.codec.seconds,
            "metric_seconds": point.metric_seconds,
            "created_at": pd.Timestamp.now(tz="UTC"),
        }
    )


def _pan_zoom(image: np.ndarray, size: tuple[int, int], frames: int, phase: float) -> np.ndarray:
    """A camera pan with a slow zoom-in across one photo, all frames in one grid_sample."""
    out_h, out_w = size
    img = torch.from_numpy(image).permute(2, 0, 1)[None].float() / 255.0
    img_h, img_w = img.shape[-2:]
    s_max = min(1.0, img_w * out_h / (img_h * out_w))  # crop height (normalised) that fits
    t = torch.linspace(0, 1, frames)
    s = s_max * (0.9 - 0.3 * t)
    pre = min(1.0, out_h / (float(s[-1]) * img_h))  # anti-alias once for the closest zoom
    if pre < 1.0:
        img = F.interpolate(img, scale_factor=pre, mode="bilinear", antialias=True, align_corners=False)
    sw = s * (out_w / out_h) * (img_h / img_w)
    direction = 1.0 if phase < 0.5 else -1.0
    tx = direction * (1 - sw) * (0.8 * t - 0.4)
    ty = (1 - s) * 0.3 * math.sin(2 * math.pi * phase) * (1 - 2 * t)
    zeros = torch.zeros_like(t)
    theta = torch.stack([torch.stack([sw, zeros, tx], -1), torch.stack([zeros, s, ty], -1)], 1)
    grid = F.affine_grid(theta, [frames, 3, out_h, out_w], align_corners=False)
    video = F.grid_sample(img.expand(frames, -1, -1, -1), grid, mode="bilinear", align_corners=False)
    return video.clamp(0, 1).permute(0, 2, 3, 1).numpy()


def make_synthetic_videos(
    out_dir: str | Path, n: int = 2, size: int | tuple[int, int] = 64, frames: int = 8, fps: int = 25
) -> list[Path]:
    """Short Y4M clips panning and zooming across the photos scikit-image ships (no download)."""
    from skimage import data

    height, width = (size, size) if isinstance(size, int) else size
    if n < 1 or frames < 1 or height % 2 or width % 2 or min(height, width) < 16:
        raise AdvbenchError(
            f"synthetic videos need n >= 1, frames >= 1 and an even size >= 16; got n={n}, "
            f"frames={frames}, size={height}x{width}"
        )
    paths = []
    for i in range(n):
        name = SYNTHETIC_SOURCES[i % len(SYNTHETIC_SOURCES)]
        clip = _pan_zoom(getattr(data, name)(), (height, width), frames, phase=(i * 0.37) % 1)
        paths.append(write_y4m(Path(out_dir) / f"synthetic{i:02d}_{name}.y4m", clip, fps))
    return paths
