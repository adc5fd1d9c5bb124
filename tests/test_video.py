"""Video I/O, the H.264 round trip, and the resumable RD job on tiny synthetic clips."""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest
import torch

from advbench.core.errors import AdvbenchError
from advbench.core.records import read_records
from advbench.quality.metrics.metric_contract import QualityMetric
from advbench.quality.stability import video as V
from advbench.quality.stability.clips import make_synthetic_videos
from advbench.quality.stability.rd import Perturbation, RDRun, part_path, run_rd
from advbench.quality.stability.report import is_rd_records, render_stability

RD_COLUMNS = {"run_id", "metric", "higher_better", "video", "amplitude", "target_bitrate_kbps",
              "real_bitrate_kbps", "metric_score", "metric_scoring", "psnr", "psnr_kind", "n_frames",
              "codec_seconds", "metric_seconds", "settings", "settings_key", "created_at"}
M_PERTURB = -6  # glibc mallopt: fill new allocations with this byte


class Sharpness(QualityMetric):
    """Mean absolute horizontal gradient: rewards high-frequency energy, noise included."""

    score_range = (0.0, 1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x[..., 1:] - x[..., :-1]).abs().mean(dim=(1, 2, 3))


def tiled_noise(seed: int = 0) -> Perturbation:
    """A fixed 16x16 pattern tiled over the frame, scaled by the amplitude (a toy UAP)."""
    pattern = torch.rand(3, 16, 16, generator=torch.Generator().manual_seed(seed)) * 2 - 1

    def perturb(frames: torch.Tensor, amplitude: float) -> torch.Tensor:
        reps = (1, frames.shape[-2] // 16, frames.shape[-1] // 16)
        return frames + amplitude * pattern.to(frames.device).repeat(*reps)

    return perturb


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> list[Path]:
    return make_synthetic_videos(tmp_path_factory.mktemp("videos"), n=2, size=64, frames=12)


def test_synthetic_clips_move_and_read_back(clips) -> None:
    frames = V.read_video(clips[0])
    assert frames.shape == (12, 64, 64, 3) and frames.dtype == np.float32
    assert 0.0 <= frames.min() and frames.max() <= 1.0
    assert np.abs(np.diff(frames, axis=0)).mean() > 0.01  # the camera moves
    assert not np.allclose(frames, V.read_video(clips[1]))
    assert V.probe(clips[0]) == V.VideoInfo(64, 64, 25)
    chunks = list(V.iter_chunks(clips[0], chunk_frames=5))
    assert [len(c) for c in chunks] == [5, 5, 2] and np.array_equal(np.concatenate(chunks), frames)


def test_the_default_clip_set_films_every_photo_with_three_motions(tmp_path: Path) -> None:
    from advbench.quality.images import photo_names
    from advbench.quality.stability.clips import MOTIONS

    paths = make_synthetic_videos(tmp_path, n=None, size=(32, 48), frames=6)
    assert len(paths) == len(photo_names("all")) == 16
    assert {p.stem.split("_", 1)[1].rsplit("_", 1)[0] for p in paths} == set(photo_names("all"))
    assert [p.stem.rsplit("_", 1)[1] for p in paths[:6]] == [*MOTIONS, *MOTIONS]
    grey = V.read_video(next(p for p in paths if "_camera_" in p.name))
    assert np.abs(grey[..., 0] - grey[..., 2]).max() < 0.02  # a grey photo stays grey (up to chroma rounding)
    for path in paths[:3]:
        frames = V.read_video(path)
        assert frames.shape == (6, 32, 48, 3)
        assert np.abs(np.diff(frames, axis=0)).mean() > 0.005, path.name  # every motion moves the camera


def test_shake_rolls_the_camera_rigidly() -> None:
    from advbench.quality.stability.clips import _film

    image = np.zeros((200, 300), np.uint8)
    image[:, 150] = 255  # one vertical line through the centre
    frames = _film(image, (64, 96), 40, "shake", phase=0.3)
    tilts = []
    for frame in frames:
        rows = np.arange(10, 54)
        cols = frame[rows, :, 0].argmax(axis=1)
        tilts.append(np.polyfit(rows, cols, 1)[0])
    assert np.ptp(tilts) > 0.02  # the line leans one way, then the other
    with pytest.raises(AdvbenchError, match="unknown camera motion 'spin'; valid: pan, zoom, shake"):
        _film(image, (64, 96), 2, "spin", phase=0.0)


def test_round_trip_bitrate_and_psnr_follow_the_target(clips) -> None:
    source = V.read_video(clips[0])
    low, high = (V.transcode(source, 25, kbps) for kbps in (50, 1000))
    assert low.frames.shape == high.frames.shape == source.shape
    assert 0 < low.real_bitrate_kbps < high.real_bitrate_kbps
    assert low.real_bitrate_kbps < 3 * 50
    assert V.psnr(source, high.frames).mean() > V.psnr(source, low.frames).mean() + 3


def test_raw_yuv_needs_its_format_and_reads_with_it(tmp_path: Path) -> None:
    h, w, t = 32, 48, 3
    y = np.linspace(16, 235, h * w, dtype=np.float32).reshape(h, w)
    planes = [np.concatenate([np.rint(y + 5 * i).astype(np.uint8).ravel(),
                              np.full(h * w // 2, 128, np.uint8)]) for i in range(t)]
    raw = tmp_path / "gray.yuv"
    raw.write_bytes(b"".join(p.tobytes() for p in planes))
    with pytest.raises(AdvbenchError, match="needs width, height"):
        V.read_video(raw)
    frames = V.read_video(raw, V.RawFormat(width=w, height=h, fps=30))
    assert frames.shape == (t, h, w, 3)
    gray = frames.std(axis=-1).max()  # neutral chroma -> R = G = B
    assert gray < 2 / 255 and (np.diff(frames.mean(axis=(1, 2, 3))) > 0).all()
    assert V.probe(raw, V.RawFormat(width=w, height=h, fps=30)).fps == 30


def test_unreadable_or_odd_videos_are_one_line_errors(tmp_path: Path) -> None:
    junk = tmp_path / "junk.y4m"
    junk.write_bytes(b"this is not a video\n" * 10)
    with pytest.raises(AdvbenchError, match="cannot read video"):
        V.read_video(junk)
    with pytest.raises(AdvbenchError, match="does not exist"):
        V.read_video(tmp_path / "missing.y4m")
    with pytest.raises(AdvbenchError, match="even frame size"):
        V.H264Transcoder(65, 64, 25, 200)
    with pytest.raises(AdvbenchError, match="cannot read video"):
        run_rd([junk], Sharpness(), tiled_noise(), tmp_path / "rd", metric_name="s", perturbation_key="n0",
               progress=False)
    assert not (tmp_path / "rd").exists()


def test_psnr_known_values_rgb_and_luma() -> None:
    ref = np.full((2, 8, 8, 3), 0.5, np.float32)
    for kind in V.PSNR_KINDS:
        assert np.allclose(V.psnr(ref, ref, kind), V.PSNR_CAP_DB)
        assert np.allclose(V.psnr(ref, ref + 0.1, kind), 20.0, atol=1e-4)  # error 0.1 everywhere -> 20 dB
    chroma_only = ref + np.array([0.1, -0.1 * 0.299 / 0.587, 0.0], np.float32)
    assert np.allclose(V.psnr(ref, chroma_only, "luma"), V.PSNR_CAP_DB)
    mse = (0.1**2 + (0.1 * 0.299 / 0.587) ** 2) / 3  # RGB: mean over the three channels
    assert np.allclose(V.psnr(ref, chroma_only), 10 * np.log10(1 / mse), atol=1e-3)
    with pytest.raises(AdvbenchError, match="unknown PSNR kind 'y'; valid: rgb, luma"):
        V.psnr(ref, ref, "y")
    a, b = (np.random.default_rng(seed).integers(0, 256, (3, 8, 8, 3), dtype=np.uint8) for seed in (0, 1))
    for kind in V.PSNR_KINDS:  # 8-bit frames are value / 255, exactly
        assert np.allclose(V.psnr(a, b, kind), V.psnr(a / 255.0, b / 255.0, kind), rtol=1e-6)


class Failing(Sharpness):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise AdvbenchError("metric failed")


def test_a_metric_failing_in_the_scoring_thread_ends_the_run_with_its_error(tmp_path: Path) -> None:
    clips = make_synthetic_videos(tmp_path / "v", n=2, size=64, frames=3)
    with pytest.raises(AdvbenchError, match="metric failed"):
        run_rd(clips, Failing(), tiled_noise(), tmp_path / "rd", metric_name="f", perturbation_key="n0",
               amplitudes=[0.04, 0.08], bitrates_kbps=[100, 300], chunk_frames=1, progress=False)
    assert not list((tmp_path / "rd").rglob("*.parquet"))


def test_amplitude_outside_unit_interval_is_refused(clips, tmp_path: Path) -> None:
    for bad in (-0.02, 1.5, float("nan")):
        with pytest.raises(AdvbenchError, match="amplitude"):
            run_rd(clips, Sharpness(), tiled_noise(), tmp_path, metric_name="s", perturbation_key="n0",
                   amplitudes=[bad], progress=False)
    assert not any(tmp_path.iterdir())


def test_rd_job_end_to_end_resume_and_report(tmp_path: Path) -> None:
    clip = make_synthetic_videos(tmp_path / "v", n=1, size=64, frames=2)
    out = tmp_path / "rd"
    kwargs = dict(metric_name="sharp", perturbation_key="noise0", amplitudes=[0.04, 0.08],
                  bitrates_kbps=[60, 600], chunk_frames=1, progress=False)
    first = run_rd(clip, Sharpness(), tiled_noise(), out, **kwargs)
    assert len(first.written) == 3 * 2 and not first.skipped
    df = read_records([out])
    assert RD_COLUMNS <= set(df.columns) and is_rd_records(df) and len(df) == 6
    assert (df["n_frames"] == 2).all() and (df["real_bitrate_kbps"] > 0).all()
    assert set(df["amplitude"]) == {0.0, 0.04, 0.08}
    clean = df[df["amplitude"] == 0].set_index("target_bitrate_kbps")
    assert clean.loc[600, "psnr"] > clean.loc[60, "psnr"]
    # streamed PSNR (chunk of 1 frame, encoder look-ahead) equals the whole-clip round trip
    source = V.read_video(clip[0])
    whole = V.transcode(source, 25, 600)
    assert (df["psnr_kind"] == "rgb").all() and (df["metric_scoring"] == "frame mean").all()
    assert clean.loc[600, "psnr"] == pytest.approx(V.psnr(source, whole.frames).mean(), rel=1e-6)
    decoded = torch.from_numpy(whole.frames).permute(0, 3, 1, 2)
    assert clean.loc[600, "metric_score"] == pytest.approx(float(Sharpness()(decoded).mean()), rel=1e-5)
    loud = df[df["amplitude"] == 0.08].set_index("target_bitrate_kbps")
    assert loud.loc[600, "metric_score"] > clean.loc[600, "metric_score"]
    assert loud.loc[600, "psnr"] < clean.loc[600, "psnr"]

    stamp = {p: p.stat().st_mtime_ns for p in first.written}
    again = run_rd(clip, Sharpness(), tiled_noise(), out, **kwargs)
    assert not again.written and not again.stale and sorted(again.skipped) == sorted(first.written)
    assert {p: p.stat().st_mtime_ns for p in first.written} == stamp

    target = part_path(out, "sharp", clip[0].stem, 0.04, 60)
    target.unlink()
    healed = run_rd(clip, Sharpness(), tiled_noise(), out, **{**kwargs, "progress": True})
    assert healed.written == [target]
    forced = run_rd(clip, Sharpness(), tiled_noise(), out, force=True, **kwargs)
    assert len(forced.written) == 6 and not forced.stale

    luma = run_rd(clip, Sharpness(), tiled_noise(), out, **{**kwargs, "psnr_kind": "luma"})
    assert sorted(luma.stale) == sorted(luma.written) == sorted(first.written)
    df = read_records([out])
    assert (df["psnr_kind"] == "luma").all()
    clean = df[df["amplitude"] == 0].set_index("target_bitrate_kbps")
    assert clean.loc[600, "psnr"] == pytest.approx(V.psnr(source, whole.frames, "luma").mean(), rel=1e-6)

    paths = render_stability(read_records([out]), tmp_path / "report")
    assert {p.name for p in paths} == {"table2.md", "table2.csv", "gain_vs_loss.csv", "gain_vs_loss.png"}
    assert all(p.stat().st_size > 0 for p in paths)
    assert "sharp" in (tmp_path / "report" / "table2.md").read_text()


def test_frames_decoded_mid_stream_meet_their_own_source_frames(tmp_path: Path) -> None:
    """A clip longer than x264's look-ahead is decoded while chunks still go in: each bitrate's
    PSNR and score still pair every decoded frame with its own source frame."""
    clip = make_synthetic_videos(tmp_path / "v", n=1, size=64, frames=48)
    run = run_rd(clip, Sharpness(), tiled_noise(), tmp_path / "rd", metric_name="sharp", perturbation_key="n0",
                 amplitudes=[], bitrates_kbps=[100, 800], chunk_frames=8, progress=False)
    df = read_records([tmp_path / "rd"]).set_index("target_bitrate_kbps")
    source = V.read_video(clip[0])
    for kbps in (100, 800):
        whole = V.transcode(source, 25, kbps)
        assert df.loc[kbps, "n_frames"] == 48 and df.loc[kbps, "real_bitrate_kbps"] == whole.real_bitrate_kbps
        assert df.loc[kbps, "psnr"] == pytest.approx(V.psnr(source, whole.frames).mean(), rel=1e-9)
        decoded = torch.from_numpy(whole.frames).permute(0, 3, 1, 2)
        assert df.loc[kbps, "metric_score"] == pytest.approx(float(Sharpness()(decoded).mean()), rel=1e-6)
    assert len(run.written) == 2


@pytest.mark.filterwarnings("ignore::advbench.quality.metrics.common.RandomWeightsWarning")
@pytest.mark.parametrize("name", ["vsfa", "mdtvsfa"])
def test_video_metrics_score_each_decoded_clip_as_a_video(name: str, tmp_path: Path) -> None:
    """The GRU and temporal pooling act over the whole decoded clip, not over 1-frame videos.

    A fresh round trip of the same frames is the clip the job scored: encodes are reproducible.
    """
    from advbench.cli.metrics import build_metric

    torch.manual_seed(0)
    metric = build_metric(name, weights=None, backbone_weights=None, backbone="resnet18")
    clip = make_synthetic_videos(tmp_path / "v", n=1, size=64, frames=6)
    out = tmp_path / "rd"
    run_rd(clip, metric, tiled_noise(), out, metric_name=name, perturbation_key="noise0", amplitudes=[0.08],
           bitrates_kbps=[100, 1000], chunk_frames=4, batch_size=4, progress=False)
    df = read_records([out]).set_index(["amplitude", "target_bitrate_kbps"])
    assert (df["metric_scoring"] == "video").all() and (df["n_frames"] == 6).all()
    source = torch.from_numpy(V.read_video(clip[0])).permute(0, 3, 1, 2)
    for amplitude in (0.0, 0.08):
        sent = tiled_noise()(source, amplitude).clamp(0, 1) if amplitude else source
        for kbps in (100, 1000):
            decoded = V.transcode(sent.permute(0, 2, 3, 1).numpy(), 25, kbps).frames
            frames = torch.from_numpy(decoded).permute(0, 3, 1, 2)
            with torch.inference_mode():
                video, frame_mean = float(metric.score_video(frames)), float(metric(frames).mean())
            assert abs(video - frame_mean) > 1e-3  # the random head's temporal model matters
            assert df.loc[(amplitude, kbps), "metric_score"] == pytest.approx(video, rel=1e-4, abs=1e-6)


def test_encodes_do_not_depend_on_what_the_heap_held(tmp_path: Path) -> None:
    """The same frames give the same bitstream whatever freshly allocated memory contains.

    glibc's M_PERTURB fills every allocation with a given byte. x264's AVX-512 routines read
    memory they never wrote at a 64-px width, so without the AVX2 cap (`x264_params`) the two
    fillings below give different encodes on an AVX-512 CPU (on others the check is trivially met).
    """
    libc = ctypes.CDLL(None)
    if not hasattr(libc, "mallopt"):
        pytest.skip("needs glibc's mallopt")
    frames = V.read_video(make_synthetic_videos(tmp_path, n=1, size=64, frames=6)[0])
    encodes = []
    try:
        for byte in (0x55, 0xAA):
            libc.mallopt(M_PERTURB, byte)
            encodes.append(V.transcode(frames, 25, 100))
    finally:
        libc.mallopt(M_PERTURB, 0)
    assert encodes[0].real_bitrate_kbps == encodes[1].real_bitrate_kbps
    assert np.array_equal(encodes[0].frames, encodes[1].frames)


def _settings_run(tmp_path: Path, metric: QualityMetric | None = None, perturb: Perturbation | None = None,
                  clip_seed: int = 0, **changes) -> RDRun:
    """One tiny RD run into a shared folder; `changes` override run_rd's keyword settings."""
    clip_dir = tmp_path / f"v{clip_seed}"
    if not clip_dir.exists():  # same name, other content for clip_seed != 0
        frames = make_synthetic_videos(tmp_path / "src", n=2, size=64, frames=2)[clip_seed]
        clip_dir.mkdir()
        (clip_dir / "clip.y4m").write_bytes(frames.read_bytes())
    kwargs = {"metric_name": "sharp", "perturbation_key": "noise0", "amplitudes": [0.08], "bitrates_kbps": [300],
              "progress": False, **changes}
    return run_rd([clip_dir / "clip.y4m"], metric or Sharpness(), perturb or tiled_noise(), tmp_path / "rd", **kwargs)


class ScaledSharpness(Sharpness):
    """Sharpness with a learnt scale: a metric whose weights can change under one name."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.tensor(scale))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) * self.scale


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(dict(perturb=tiled_noise(1), perturbation_key="noise1"), id="perturbation"),
        pytest.param(dict(perturbation_key="noise0 csf=True"), id="csf"),
        pytest.param(dict(preset="ultrafast"), id="preset"),
        pytest.param(dict(max_frames=1), id="max_frames"),
        pytest.param(dict(psnr_kind="luma"), id="psnr_kind"),
        pytest.param(dict(metric=ScaledSharpness(2.0)), id="metric_weights"),
        pytest.param(dict(clip_seed=1), id="video_content"),
    ],
)
def test_changed_settings_recompute_instead_of_skipping(change: dict, tmp_path: Path) -> None:
    base = dict(metric=ScaledSharpness(1.0)) if "metric" in change else {}
    first = _settings_run(tmp_path, **base)
    assert len(first.written) == 2 and not first.skipped
    before = set(read_records([tmp_path / "rd"])["settings_key"])
    again = _settings_run(tmp_path, **base)
    assert not again.written and len(again.skipped) == 2
    changed = _settings_run(tmp_path, **change)
    assert sorted(changed.written) == sorted(first.written) == sorted(changed.stale) and not changed.skipped
    after = set(read_records([tmp_path / "rd"])["settings_key"])
    assert len(after) == 1 and not after & before
    assert not _settings_run(tmp_path, **change).written  # and the new settings are reused in turn


def test_unreadable_or_keyless_parts_are_recomputed(tmp_path: Path) -> None:
    first = _settings_run(tmp_path)
    broken, older = sorted(first.written)
    broken.write_bytes(b"not parquet")
    read_records([older]).drop(columns=["settings", "settings_key"]).to_parquet(older)  # an older run's part
    healed = _settings_run(tmp_path)
    assert sorted(healed.written) == sorted(healed.stale) == [broken, older] and not healed.skipped
    assert read_records([tmp_path / "rd"])["settings_key"].notna().all()


def test_image_metrics_score_a_video_as_the_mean_of_its_frames() -> None:
    videos = torch.rand(2, 5, 3, 16, 16)
    expected = Sharpness()(videos.flatten(0, 1)).view(2, 5).mean(1)
    torch.testing.assert_close(Sharpness().score_video(videos), expected)
    torch.testing.assert_close(Sharpness().score_video(videos[1]), expected[1:])
    with pytest.raises(AdvbenchError, match=r"Sharpness: expected a float tensor \(N, T, 3, H, W\)"):
        Sharpness().score_video(torch.rand(2, 0, 3, 16, 16))
