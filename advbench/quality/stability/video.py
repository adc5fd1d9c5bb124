"""Raw video in, real H.264 (libx264 via PyAV) round trip out, and PSNR against the source.

Frames travel as float32 arrays (T, H, W, 3), RGB in [0, 1], or, inside the RD job, as the
8-bit RGB the codec sees (`iter_rgb24`), so nothing is converted twice. Videos are read in
chunks so a FullHD clip never has to sit in memory whole; `H264Transcoder` takes yuv420p
frames (`yuv_frames`, converted once and shared by the encoders of every bitrate) and
returns the decoded 8-bit RGB frames as the encoder releases them (x264 holds a look-ahead
of frames back).

Encodes are reproducible: each encoder runs on one x264 thread (libx264's default is one
slice per core, so the bitstream, and every RD number, changed with the machine's core
count), and on CPUs with AVX-512 x264's SIMD is capped at AVX2 (`x264_params`).

PSNR (`psnr`) is computed per frame, peak 1, then averaged over frames by the caller. The
default, `kind="rgb"`, takes the mean squared error over all three RGB channels, as the seed
authors' notebook does; `kind="luma"` takes it on Y' = 0.299 R + 0.587 G + 0.114 B (BT.601
weights, full range) of the RGB frames, the usual video-coding convention. Both are computed
from RGB, so the source and the decoded video are treated identically.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from pathlib import Path

import av
import numpy as np

from advbench.core.download import open_no_follow
from advbench.core.errors import AdvbenchError
from advbench.core.paths import refuse_link

LUMA = np.array([0.299, 0.587, 0.114], dtype=np.float32)
PSNR_CAP_DB = 100.0
PSNR_KINDS = ("rgb", "luma")


@lru_cache(maxsize=None)
def _has_avx512() -> bool:
    """Whether the CPU (as Linux reports it) has AVX-512F, which x264 would use."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    return any("avx512f" in line.split() for line in text.splitlines() if line.startswith("flags"))


def x264_params() -> dict[str, str]:
    """libx264 options beyond the preset that make an encode depend only on its input.

    x264's AVX-512 routines read memory they never wrote at some frame widths (64, 96, 160,
    224 px here; not 128 or 384), so two encodes of the same frames could differ with whatever
    the heap held before (shown by `MALLOC_PERTURB_`). Capped at AVX2 (which every AVX-512 CPU
    has), the output is bit-identical to x264's plain C code and the encoder is no slower.
    """
    return {"threads": "1", **({"x264-params": "asm=AVX2"} if _has_avx512() else {})}


@dataclass(frozen=True)
class RawFormat:
    """How to read headerless .yuv: size, pixel format and frame rate are not in the file."""

    width: int
    height: int
    pix_fmt: str = "yuv420p"
    fps: float = 25.0


@dataclass(frozen=True)
class VideoInfo:
    """What the job needs to know before decoding: frame size and rate."""

    width: int
    height: int
    fps: Fraction


def _open(path: Path, raw: RawFormat | None) -> av.container.InputContainer:
    """Open with PyAV; a .yuv file needs `raw`. Every failure is an AdvbenchError."""
    if not path.is_file():
        raise AdvbenchError(
            f"video '{path}' does not exist: expected a Y4M, raw .yuv or any file FFmpeg reads"
        )
    if raw is None and path.suffix.lower() == ".yuv":
        raise AdvbenchError(f"raw video '{path}' needs width, height, pix_fmt and fps; got none")
    options = (
        {"video_size": f"{raw.width}x{raw.height}", "pixel_format": raw.pix_fmt,
         "framerate": str(raw.fps)}
        if raw is not None
        else {}
    )
    try:
        container = av.open(str(path), format="rawvideo" if raw else None, options=options)
    except (av.FFmpegError, ValueError) as exc:
        raise AdvbenchError(f"cannot read video '{path}': {exc}") from None
    if not container.streams.video:
        container.close()
        raise AdvbenchError(f"'{path}' has no video stream: expected a video file")
    return container


def probe(path: str | Path, raw: RawFormat | None = None) -> VideoInfo:
    """Frame size and rate of a video (rate from `raw` for .yuv, else from the file)."""
    with _open(Path(path), raw) as container:
        stream = container.streams.video[0]
        rate = stream.average_rate or stream.guessed_rate
        if raw is not None:
            rate = Fraction(raw.fps).limit_denominator(1001)
        if not rate:
            raise AdvbenchError(f"video '{path}' has no frame rate: pass one with a RawFormat")
        return VideoInfo(stream.codec_context.width, stream.codec_context.height, Fraction(rate))


def iter_chunks(
    path: str | Path,
    chunk_frames: int = 16,
    raw: RawFormat | None = None,
    max_frames: int | None = None,
) -> Iterator[np.ndarray]:
    """Yield the video as float RGB chunks (≤ chunk_frames, H, W, 3) in [0, 1]."""
    return (_to_float(chunk) for chunk in iter_rgb24(path, chunk_frames, raw, max_frames))


def iter_rgb24(
    path: str | Path,
    chunk_frames: int = 16,
    raw: RawFormat | None = None,
    max_frames: int | None = None,
) -> Iterator[np.ndarray]:
    """Yield the video as 8-bit RGB chunks (≤ chunk_frames, H, W, 3), as FFmpeg converts them."""
    path = Path(path)
    buffer: list[np.ndarray] = []
    count = 0
    with _open(path, raw) as container:
        try:
            for frame in container.decode(video=0):
                if max_frames is not None and count >= max_frames:
                    break
                buffer.append(frame.to_ndarray(format="rgb24"))
                count += 1
                if len(buffer) == chunk_frames:
                    yield np.stack(buffer)
                    buffer = []
        except av.FFmpegError as exc:
            raise AdvbenchError(f"cannot decode video '{path}' after {count} frames: {exc}") from None
    if buffer:
        yield np.stack(buffer)
    if count == 0:
        raise AdvbenchError(f"video '{path}' has no decodable frames")


def read_video(
    path: str | Path, raw: RawFormat | None = None, max_frames: int | None = None
) -> np.ndarray:
    """The whole video as one float RGB array (T, H, W, 3); use `iter_chunks` for long clips."""
    return np.concatenate(list(iter_chunks(path, 64, raw, max_frames)))


def _to_float(frames: np.ndarray) -> np.ndarray:
    return frames.astype(np.float32) / 255.0


def _to_uint8(frames: np.ndarray) -> np.ndarray:
    return np.clip(np.rint(np.asarray(frames, np.float32) * 255.0), 0, 255).astype(np.uint8)


def yuv_frames(images: np.ndarray, first: int, fps: Fraction | float) -> list[av.VideoFrame]:
    """8-bit RGB (T, H, W, 3) as yuv420p frames numbered from `first`, ready for any number of encoders."""
    time_base = 1 / Fraction(fps).limit_denominator(1001)
    frames = []
    for i, image in enumerate(images):
        frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="rgb24").reformat(format="yuv420p")
        frame.pts, frame.time_base = first + i, time_base
        frames.append(frame)
    return frames


X264_PRESETS = ("ultrafast", "superfast", "veryfast", "faster", "fast", "medium", "slow", "slower", "veryslow",
                "placebo")
"""libx264's speed presets; any other name makes the encoder refuse to open."""


class H264Transcoder:
    """Encode yuv420p frames with libx264 at a target bitrate and decode them right back.

    `push` returns whatever decoded 8-bit RGB frames the encoder has released so far, `flush`
    the rest, in display order. The frames pushed may be shared with other transcoders (each
    encoder copies them). `real_bitrate_kbps` counts the encoded H.264 payload bytes (no
    container) over the clip's duration frames/fps; `seconds` is the time spent in the codec.
    Encoder and decoder run on one thread each (see `x264_params`); encode and decode release
    the GIL, so transcoders of several bitrates run side by side in threads.
    """

    def __init__(
        self, width: int, height: int, fps: Fraction | float, bitrate_kbps: float, preset: str = "medium"
    ) -> None:
        if width % 2 or height % 2:
            raise AdvbenchError(f"H.264 yuv420p needs an even frame size; got {width}x{height}")
        if not bitrate_kbps > 0:
            raise AdvbenchError(f"bitrate must be > 0 kbps; got {bitrate_kbps}")
        self.fps = Fraction(fps).limit_denominator(1001)
        self.encoder = av.CodecContext.create("libx264", "w")
        self.encoder.width, self.encoder.height = width, height
        self.encoder.pix_fmt = "yuv420p"
        self.encoder.time_base = 1 / self.fps
        self.encoder.framerate = self.fps
        self.encoder.bit_rate = int(bitrate_kbps * 1000)
        self.encoder.options = {"preset": preset, **x264_params()}
        try:  # opened here, not at the first frame, so that a setting x264 refuses is said before any work
            self.encoder.open()
        except av.FFmpegError as exc:
            raise AdvbenchError(f"libx264 refused preset={preset!r} at {bitrate_kbps:g} kbps for {width}x{height} "
                                f"at {float(self.fps):g} fps: {exc}") from None
        self.decoder = av.CodecContext.create("h264", "r")
        self.decoder.thread_count = 1
        self.bytes = 0
        self.frames_in = 0
        self.seconds = 0.0

    def _drain(self, packets: list[av.Packet]) -> list[np.ndarray]:
        decoded = []
        for packet in packets:
            self.bytes += packet.size
            decoded.extend(f.to_ndarray(format="rgb24") for f in self.decoder.decode(packet))
        return decoded

    def _timed(self, work: Sequence[av.VideoFrame] | None) -> np.ndarray:
        """Encode `work` (None flushes) and decode every packet that comes out."""
        start = time.perf_counter()
        decoded: list[np.ndarray] = []
        if work is None:
            decoded += self._drain(list(self.encoder.encode(None)))
            decoded += [f.to_ndarray(format="rgb24") for f in self.decoder.decode(None)]
        else:
            for frame in work:
                decoded += self._drain(list(self.encoder.encode(frame)))
            self.frames_in += len(work)
        self.seconds += time.perf_counter() - start
        if not decoded:
            return np.empty((0, self.encoder.height, self.encoder.width, 3), np.uint8)
        return np.stack(decoded)

    def push(self, frames: Sequence[av.VideoFrame]) -> np.ndarray:
        """Encode yuv420p frames (`yuv_frames`); return the decoded frames available so far."""
        size = (self.encoder.width, self.encoder.height)
        wrong = [(f.width, f.height, f.format.name) for f in frames if (f.width, f.height, f.format.name) != (*size, "yuv420p")]
        if wrong:
            raise AdvbenchError(f"expected yuv420p frames of {size[0]}x{size[1]}; got {wrong[0]}")
        return self._timed(frames)

    def flush(self) -> np.ndarray:
        """Finish the stream and return the frames the encoder still held."""
        return self._timed(None)

    @property
    def real_bitrate_kbps(self) -> float:
        return float(self.bytes * 8 / (self.frames_in / self.fps) / 1000) if self.frames_in else 0.0


@dataclass(frozen=True)
class Transcoded:
    frames: np.ndarray
    real_bitrate_kbps: float
    seconds: float


def transcode(
    frames: np.ndarray, fps: Fraction | float, bitrate_kbps: float, preset: str = "medium"
) -> Transcoded:
    """In-memory round trip of a whole float clip through H.264 (for short clips and tests)."""
    if frames.ndim != 4 or frames.shape[-1] != 3:
        raise AdvbenchError(f"expected frames (T, H, W, 3); got {frames.shape}")
    codec = H264Transcoder(frames.shape[2], frames.shape[1], fps, bitrate_kbps, preset)
    decoded = np.concatenate([codec.push(yuv_frames(_to_uint8(frames), 0, fps)), codec.flush()])
    return Transcoded(_to_float(decoded), codec.real_bitrate_kbps, codec.seconds)


def psnr(reference: np.ndarray, test: np.ndarray, kind: str = "rgb") -> np.ndarray:
    """Per-frame PSNR in dB (peak 1) of (T, H, W, 3) RGB arrays over RGB or luma; identical frames cap at 100.

    Float frames are in [0, 1]; two 8-bit arrays are taken as value / 255, their difference
    computed exactly in integers.
    """
    if kind not in PSNR_KINDS:
        raise AdvbenchError(f"unknown PSNR kind '{kind}'; valid: {', '.join(PSNR_KINDS)}")
    if reference.shape != test.shape:
        raise AdvbenchError(f"PSNR needs frames of one shape; got {reference.shape} and {test.shape}")
    if reference.dtype == test.dtype == np.uint8:
        diff, peak = reference.astype(np.int16) - test.astype(np.int16), 255.0
    else:
        diff, peak = np.asarray(reference, np.float32) - np.asarray(test, np.float32), 1.0
    if kind == "luma":
        diff = diff @ LUMA
    flat = diff.reshape(len(diff), -1)
    exact = np.issubdtype(flat.dtype, np.integer)
    squares = np.einsum("ij,ij->i", flat, flat, dtype=np.int64 if exact else np.float64)
    mse = squares / (flat.shape[1] * peak**2)
    return np.minimum(10.0 * np.log10(1.0 / np.maximum(mse, 1e-30)), PSNR_CAP_DB)


def write_y4m(path: str | Path, frames: np.ndarray, fps: int | Fraction = 25) -> Path:
    """Write float RGB frames as a yuv420p Y4M file (the raw format Xiph videos come in).

    The file is opened without following a link: a link planted at `path` is an error, never
    a way to overwrite the file it points to.
    """
    path = refuse_link(Path(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    with os.fdopen(open_no_follow(path, append=False), "wb") as out, \
            av.open(out, "w", format="yuv4mpegpipe") as container:
        stream = container.add_stream("rawvideo", rate=Fraction(fps))
        stream.width, stream.height, stream.pix_fmt = frames.shape[2], frames.shape[1], "yuv420p"
        for image in _to_uint8(frames):
            container.mux(stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")))
        container.mux(stream.encode(None))
    return path
