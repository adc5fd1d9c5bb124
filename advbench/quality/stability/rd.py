"""The stability job: perturb raw videos, compress them with H.264, record RD points.

For each video × amplitude × bitrate the perturbation is applied to the raw frames *before*
encoding (as a preprocessing step would be), the clip goes through libx264 and back, and the
target metric scores the decoded clip: a video metric (VSFA, MDTVSFA) scores it as one
video, its temporal model acting over all frames (`QualityMetric.score_video`, computed as
per-frame features streamed in chunks, then one pooling over the clip, all bitrates of a
(video, amplitude) in one batch); an image metric's frame scores are averaged. PSNR of the
decoded vs the *unperturbed* source frames, over RGB by default (the seed authors' choice)
or luma, is averaged over frames. One parquet part per (video, amplitude, bitrate) is
written atomically, so a killed run resumes where it stopped.

RD record columns: run_id, metric, higher_better, video, amplitude, target_bitrate_kbps,
real_bitrate_kbps, metric_score, metric_scoring ("video" or "frame mean"), psnr (mean over
frames, dB), psnr_kind ("rgb" or "luma"), n_frames, codec_seconds (this bitrate's encode and
decode), metric_seconds, settings (JSON of everything the numbers depend on), settings_key
(its hash; a part is reused only when it matches), created_at (UTC). `higher_better` lets the
stability score treat lower-is-better metrics correctly.

Work is spread over threads (libx264, FFmpeg's decoder and torch release the GIL): the main
thread reads, perturbs and converts each chunk once; one thread per bitrate encodes,
decodes and computes PSNR; one scoring thread computes the metric. So the metric of one
(video, amplitude) runs while the codecs already work on the next, and on a CPU the job is
as fast as its codec.
"""

from __future__ import annotations

import math
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
)

from advbench.core.digests import module_digest
from advbench.core.errors import AdvbenchError
from advbench.core.keys import content_key, file_digest
from advbench.core.names import file_name
from advbench.core.paths import no_links
from advbench.core.records import write_part
from advbench.quality.metrics.metric_contract import QualityMetric
from advbench.quality.stability.schema import rd_record
from advbench.quality.stability.video import PSNR_KINDS, H264Transcoder, RawFormat, VideoInfo, iter_rgb24, probe, psnr, yuv_frames
from advbench.quality.uap.perturbation import check_amplitude

Perturbation = Callable[[torch.Tensor, float], torch.Tensor]
"""(frames NCHW in [0, 1], amplitude) -> perturbed frames in [0, 1], e.g.
`lambda f, a: apply_uap(f, uap, a)`."""


DEFAULT_AMPLITUDES = (0.02, 0.04, 0.06, 0.08)


DEFAULT_BITRATES_KBPS = (200, 1000, 5000, 12000)


# Bump when the way RD numbers are computed changes, so older parts are recomputed.
# 3: one x264 thread per encoder (no longer one slice per core) and SIMD capped at AVX2.
SETTINGS_VERSION = 3


KEY_LENGTH = 16


def check_amplitudes(amplitudes: Sequence[float]) -> list[float]:
    """0 (the unperturbed baseline, always included) plus the given levels, each in (0, 1]."""
    return sorted({0.0, *(check_amplitude(a, "amplitude", baseline=True) for a in amplitudes)})


def _check_bitrates(bitrates_kbps: Sequence[float]) -> list[float]:
    bad = [b for b in bitrates_kbps if not (math.isfinite(b) and b > 0)]
    if bad or not bitrates_kbps:
        raise AdvbenchError(f"bitrates must be a non-empty list of positive kbps; got {list(bitrates_kbps)}")
    return sorted(set(map(float, bitrates_kbps)))


def part_path(out_dir: Path, metric: str, video: str, amplitude: float, bitrate_kbps: float) -> Path:
    """Where the record of one (video, amplitude, bitrate) point lives.

    `video` is the clip's file stem, data rather than an option: it names its folder through
    `file_name`, so a stem such as `..` cannot lead out of `<out_dir>/<metric>/`.
    """
    return out_dir / metric / file_name(video) / f"a{amplitude:.4f}_b{bitrate_kbps:g}k.parquet"


def _settings_key_of(path: Path) -> str | None:
    """The settings key stored in an existing part; None when it is missing, unreadable or keyless."""
    try:
        keys = pq.read_table(path, columns=["settings_key"]).column(0).to_pylist()
    except (OSError, pa.ArrowException):
        return None
    return keys[0] if len(keys) == 1 else None


@dataclass
class _Point:
    """One bitrate of one (video, amplitude): its transcoder, frame features and PSNRs so far."""

    bitrate_kbps: float
    codec: H264Transcoder
    decoded: int = 0
    features: list[torch.Tensor] = field(default_factory=list)
    psnrs: list[np.ndarray] = field(default_factory=list)
    score: float = math.nan
    metric_seconds: float = 0.0


class _Source:
    """The unperturbed 8-bit frames of one clip, kept until every bitrate's decoder has passed them."""

    def __init__(self) -> None:
        self.chunks: list[np.ndarray] = []
        self.start = 0  # index of the first frame kept

    def add(self, chunk: np.ndarray) -> None:
        self.chunks.append(chunk)

    def frames(self, first: int, n: int) -> np.ndarray:
        """Frames first .. first + n - 1 of the clip, copying only the chunks that hold them."""
        parts, start = [], self.start
        for chunk in self.chunks:
            if start < first + n and first < start + len(chunk):
                parts.append(chunk[max(first - start, 0):first + n - start])
            start += len(chunk)
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def drop_before(self, index: int) -> None:
        while self.chunks and self.start + len(self.chunks[0]) <= index:
            self.start += len(self.chunks.pop(0))


@dataclass(frozen=True)
class RDRun:
    """What a run did: the parts it wrote, the ones it found done, and the stale ones it replaced.

    `stale` (a subset of `written`) are parts that existed but were made with other settings.
    """

    run_id: str
    written: list[Path]
    skipped: list[Path]
    stale: list[Path]


def run_rd(
    videos: Sequence[str | Path],
    metric: QualityMetric,
    perturb: Perturbation,
    out_dir: str | Path,
    *,
    metric_name: str,
    perturbation_key: str,
    amplitudes: Sequence[float] = DEFAULT_AMPLITUDES,
    bitrates_kbps: Sequence[float] = DEFAULT_BITRATES_KBPS,
    preset: str = "medium",
    psnr_kind: str = "rgb",
    raw: RawFormat | None = None,
    max_frames: int | None = None,
    chunk_frames: int = 16,
    batch_size: int = 8,
    device: torch.device | str = "cpu",
    force: bool = False,
    run_id: str | None = None,
    progress: bool = True,
) -> RDRun:
    """Record RD points for every video × amplitude × bitrate; skip parts that are done unless force.

    `perturbation_key` must identify what `perturb` does (the UAP's content hash and how it is
    applied, e.g. the CSF switch). A part counts as done only if its `settings_key` equals this
    run's: a hash of that key, the video's bytes, the metric (`module_digest`), the codec
    preset, the frame limit, the raw format and the PSNR kind. Parts made with other settings,
    or unreadable ones, are recomputed. Each (video, amplitude) is read, perturbed and
    converted once and fed to one encoder per missing bitrate, so memory stays at a few chunks
    plus the encoders' look-ahead (and per-frame features of video metrics).
    """
    levels, rates = check_amplitudes(amplitudes), _check_bitrates(bitrates_kbps)
    if psnr_kind not in PSNR_KINDS:
        raise AdvbenchError(f"unknown PSNR kind '{psnr_kind}'; valid: {', '.join(PSNR_KINDS)}")
    infos = _probe_videos(videos, raw)
    paths, out, run_id = list(infos), Path(out_dir), run_id or uuid.uuid4().hex[:12]
    shared = {"version": SETTINGS_VERSION, "metric": module_digest(metric), "perturbation": perturbation_key,
              "preset": preset, "max_frames": max_frames, "psnr_kind": psnr_kind,
              "raw": None if raw is None else asdict(raw)}
    identity = {path: {**shared, "video": file_digest(path)} for path in paths}
    keys = {path: content_key(value, KEY_LENGTH) for path, value in identity.items()}
    job = _Job(metric.to(device).eval(), perturb, preset, psnr_kind, raw, max_frames, chunk_frames, batch_size, device)

    def part(path: Path, amp: float, rate: float) -> Path:
        return no_links(part_path(out, metric_name, path.stem, amp, rate), out)

    units, skipped, stale = _plan(paths, levels, rates, part, keys, force)
    written: list[Path] = []
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with Progress(*columns, disable=not progress) as bar, job.threads(len(rates)):
        task = bar.add_task(f"RD {metric_name}", total=sum(len(m) for _, _, m in units))
        for (path, amp, _), points in job.run(units, infos):
            bar.update(task, description=f"RD {metric_name} {path.stem} a={amp:g}")
            for point in points:
                record = rd_record(point, run_id, metric_name, metric, path.stem, amp, psnr_kind, identity[path], keys[path])
                written.append(write_part(record, part(path, amp, point.bitrate_kbps)))
                bar.advance(task)
    return RDRun(run_id, written, skipped, stale)


Unit = tuple[Path, float, list[float]]
"""(video, amplitude, bitrates still missing): what one pass of the perturbed clip produces."""


def _probe_videos(videos: Sequence[Path | str], raw: RawFormat | None) -> dict[Path, Any]:
    """Each video's stream info, probed before any work so that a bad file fails first."""
    paths = [Path(v) for v in videos]
    if not paths:
        raise AdvbenchError("no videos given: expected at least one Y4M/.yuv/video file")
    stems = [p.stem for p in paths]
    if len(set(stems)) != len(stems) or len({file_name(s) for s in stems}) != len(stems):
        raise AdvbenchError(f"video names must be unique (records key on them); got {stems}")
    return {path: probe(path, raw) for path in paths}


def _plan(paths: list[Path], levels: list[float], rates: list[float], part: Callable[[Path, float, float], Path],
          keys: dict[Path, str], force: bool) -> tuple[list[Unit], list[Path], list[Path]]:
    """The units still to compute, and the parts skipped (made with these settings) or stale (other settings)."""
    found = {
        (path, amp, r): _settings_key_of(part(path, amp, r)) for path in paths for amp in levels for r in rates
    }
    done = {point for point, key in found.items() if not force and key == keys[point[0]]}
    todo = [(path, amp, [r for r in rates if (path, amp, r) not in done]) for path in paths for amp in levels]
    skipped = [part(*point) for point in done]
    stale = [part(*point) for point, key in found.items() if key != keys[point[0]] and part(*point).exists()]
    return [(path, amp, missing) for path, amp, missing in todo if missing], skipped, stale


@dataclass
class _Job:
    """The settings every (video, amplitude) of one run shares, and the threads that do the work."""

    metric: QualityMetric
    perturb: Perturbation
    preset: str
    psnr_kind: str
    raw: RawFormat | None
    max_frames: int | None
    chunk_frames: int
    batch_size: int
    device: torch.device | str
    _codecs: ThreadPoolExecutor | None = field(default=None, init=False, repr=False)
    _scoring: ThreadPoolExecutor | None = field(default=None, init=False, repr=False)
    _slots: threading.Semaphore | None = field(default=None, init=False, repr=False)

    @contextmanager
    def threads(self, bitrates: int) -> Iterator[None]:
        """One codec thread per bitrate and one scoring thread, for the duration of the block.

        torch gets the cores the codecs leave (at least one): a thread team larger than the
        free cores waits for them at every op, which made NIQE 6-9x slower on a loaded 2-core
        machine.
        """
        self._codecs = ThreadPoolExecutor(bitrates, thread_name_prefix="rd-codec")
        self._scoring = ThreadPoolExecutor(1, thread_name_prefix="rd-scoring")
        # Decoded chunks waiting for the metric: bounded, so a slow metric holds back the codecs.
        self._slots = threading.Semaphore(2 * bitrates)
        torch_threads = torch.get_num_threads()
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        torch.set_num_threads(max(1, cores - bitrates))
        try:
            yield
        finally:
            for pool in (self._codecs, self._scoring):
                pool.shutdown(wait=True, cancel_futures=True)
            self._codecs = self._scoring = self._slots = None
            torch.set_num_threads(torch_threads)

    def run(self, units: Sequence[Unit], infos: dict[Path, VideoInfo]) -> Iterator[tuple[Unit, list[_Point]]]:
        """Every unit's scored points, in order; a unit is scored while the codecs work on the next."""
        scoring: tuple[Unit, Future[list[_Point]]] | None = None
        for unit in units:
            scored = self._encode(unit, infos[unit[0]])
            if scoring is not None:
                yield scoring[0], scoring[1].result()
            scoring = (unit, scored)
        if scoring is not None:
            yield scoring[0], scoring[1].result()

    def _sent(self, chunk: np.ndarray, amplitude: float, first: int, fps: Fraction) -> list[av.VideoFrame]:
        """The frames the encoders get: the chunk perturbed, rounded to 8 bits, as yuv420p."""
        if amplitude > 0:
            frames = torch.from_numpy(chunk).to(self.device).permute(0, 3, 1, 2).float() / 255
            with torch.no_grad():
                perturbed = self.perturb(frames, amplitude).clamp(0, 1)
            chunk = (perturbed * 255).round().to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()
        return yuv_frames(chunk, first, fps)

    def _encode(self, unit: Unit, info: VideoInfo) -> Future[list[_Point]]:
        """Stream one (video, amplitude) through one transcoder per bitrate; hand frames to scoring."""
        assert self._codecs is not None and self._scoring is not None and self._slots is not None
        path, amplitude, bitrates = unit
        points = [_Point(r, H264Transcoder(info.width, info.height, info.fps, r, self.preset)) for r in bitrates]
        source = _Source()
        features: list[Future[None]] = []
        running: list[Future[np.ndarray]] = []

        def hand_over() -> None:
            for point, future in zip(points, running):
                decoded = future.result()
                if len(decoded):
                    self._slots.acquire()
                    features.append(self._scoring.submit(self._features, point, decoded))
            source.drop_before(min(p.decoded for p in points))

        first = 0
        for chunk in iter_rgb24(path, self.chunk_frames, self.raw, self.max_frames):
            sent = self._sent(chunk, amplitude, first, info.fps)  # while the codecs finish the last chunk
            hand_over()
            source.add(chunk)
            running = [self._codecs.submit(self._transcode, p, sent, source) for p in points]
            first += len(chunk)
        hand_over()
        running = [self._codecs.submit(self._transcode, p, None, source) for p in points]
        hand_over()
        return self._scoring.submit(self._pool, points, features)

    def _transcode(self, point: _Point, frames: list[av.VideoFrame] | None, source: _Source) -> np.ndarray:
        """Codec thread: encode (None: flush), decode, and the PSNR of what came out."""
        decoded = point.codec.flush() if frames is None else point.codec.push(frames)
        if len(decoded):
            point.psnrs.append(psnr(source.frames(point.decoded, len(decoded)), decoded, self.psnr_kind))
            point.decoded += len(decoded)
        return decoded

    def _features(self, point: _Point, decoded: np.ndarray) -> None:
        """Scoring thread: per-frame metric features of decoded 8-bit frames, in batches."""
        assert self._slots is not None
        try:
            start = time.perf_counter()
            frames = torch.from_numpy(decoded).permute(0, 3, 1, 2)
            with torch.inference_mode():
                point.features += [self.metric.frame_features(b.to(self.device).float() / 255).float()
                                   for b in frames.split(self.batch_size)]
            point.metric_seconds += time.perf_counter() - start
        finally:
            self._slots.release()

    def _pool(self, points: list[_Point], features: list[Future[None]]) -> list[_Point]:
        """Scoring thread: score every bitrate's decoded clip as one video, all bitrates in one batch."""
        for done in features:
            done.result()  # a failed batch fails the unit
        lengths = {sum(len(f) for f in p.features) for p in points}
        if len(lengths) != 1:
            raise AdvbenchError(f"decoded clips differ in length across bitrates ({sorted(lengths)} frames)")
        start = time.perf_counter()
        with torch.inference_mode():
            scores = self.metric.pool_video(torch.stack([torch.cat(p.features) for p in points])).float().cpu()
        share = (time.perf_counter() - start) / len(points)
        for point, value in zip(points, scores.tolist()):
            point.score, point.metric_seconds = value, point.metric_seconds + share
            point.features = []
        return points
