"""Stability score of a no-reference quality metric from rate-distortion curves (UAP paper §3.2).

Input is a long frame of RD points in the RD-record schema of `advbench.quality.stability.rd` (only the
columns `metric, video, amplitude, target_bitrate_kbps, real_bitrate_kbps, metric_score,
psnr` are used). One RD curve is (metric, video, amplitude); amplitude 0 is the curve
without perturbation.

Conventions, fixed by reproducing the paper's published per-video areas:

* x is the real bitrate on a *linear* scale (not log). The area of one curve is taken over
  the bitrate interval where both the perturbed and the unperturbed curve are defined,
  rescaled to [0, 1] (so an area is the mean height over the overlap), with the curves
  linear between measured points (trapezoid rule).
* Target scores are min/max-normalised per metric over all its N·(K+1) curves; PSNR over all
  M·N·(K+1) curves of every metric in the frame.
* gain = area(perturbed target) − area(clean target); loss = area(clean PSNR) −
  area(perturbed PSNR), so a loss is positive when the perturbation costs PSNR.
* The score is −100 × ∫ gain d(loss) along the mean gain-vs-loss polyline, over the loss
  interval shared by every metric: from the largest first point to the smallest last point
  (points in amplitude order), ends linearly interpolated.

For a metric with `higher_better=False` the normalised score is flipped (1 − s), so that a
positive gain always means "the metric thinks the video got better".
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from advbench.core.errors import AdvbenchError
from advbench.quality.stability.schema import CURVE_KEYS, RD_COLUMNS

PUBLISHED_BITRATES_KBPS = (200, 1000, 5000, 12000)


def clipped_trapezoid(x: np.ndarray, y: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Signed integral of the polylines (x, y) over [lo, hi], batched over leading axes.

    Each segment is clipped to [lo, hi] and its ends interpolated linearly, so the bounds
    need not be sample points. Segments are taken in the given order: a polyline that runs
    backwards in x contributes negative area, which is what the gain-vs-loss curve needs.
    """
    x, y = np.asarray(x, float), np.asarray(y, float)
    lo, hi = np.asarray(lo, float)[..., None], np.asarray(hi, float)[..., None]
    xa, xb, ya, yb = x[..., :-1], x[..., 1:], y[..., :-1], y[..., 1:]
    ca, cb = np.clip(xa, lo, hi), np.clip(xb, lo, hi)
    dx = xb - xa
    slope = np.divide(yb - ya, dx, out=np.zeros_like(dx), where=dx != 0)
    return (0.5 * (cb - ca) * (ya + slope * (ca - xa) + ya + slope * (cb - xa))).sum(-1)


def _normalise(values: np.ndarray) -> np.ndarray:
    """Min/max to [0, 1]; a constant array maps to 0 (nothing moved, nothing gained)."""
    lo, hi = np.nanmin(values), np.nanmax(values)
    return (values - lo) / (hi - lo) if hi > lo else np.zeros_like(values)


def _overlap_area_difference(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Area of curves 1..K minus area of curve 0 on their common x range, x rescaled to [0, 1].

    x, y: (..., K+1, B) sorted by x along the last axis. Returns (..., K).
    """
    x0, y0 = x[..., :1, :], y[..., :1, :]
    xk, yk = x[..., 1:, :], y[..., 1:, :]
    lo = np.maximum(x0[..., 0], xk[..., 0])
    hi = np.minimum(x0[..., -1], xk[..., -1])
    width = hi - lo
    if np.any(width <= 0):
        raise AdvbenchError(
            "RD curves with and without perturbation must overlap in bitrate; "
            f"found {int(np.sum(width <= 0))} pair(s) with no common bitrate range"
        )
    x0, y0 = np.broadcast_to(x0, xk.shape), np.broadcast_to(y0, yk.shape)
    return (clipped_trapezoid(xk, yk, lo, hi) - clipped_trapezoid(x0, y0, lo, hi)) / width


def _check_complete(rd: pd.DataFrame) -> None:
    """Every curve needs every bitrate and every (metric, video) an amplitude-0 curve."""
    missing = sorted(set(RD_COLUMNS) - set(rd.columns))
    if missing:
        raise AdvbenchError(f"RD records lack column(s) {missing}; expected {RD_COLUMNS}")
    if rd.empty:
        raise AdvbenchError("no RD records: expected rows for at least one metric and video")
    if rd[["metric_score", "psnr", "real_bitrate_kbps"]].isna().to_numpy().any():
        raise AdvbenchError("RD records contain NaN scores, PSNR or bitrates")
    _check_one_setting(rd)
    dup = rd.duplicated([*CURVE_KEYS, "target_bitrate_kbps"])
    if dup.any():
        m, v, a, b = rd.loc[dup, [*CURVE_KEYS, "target_bitrate_kbps"]].iloc[0]
        raise AdvbenchError(
            f"duplicate RD points for metric={m} video={v} amplitude={a} bitrate={b} kbps: "
            "expected one record per point (read one run's records at a time)"
        )
    n_rates = rd["target_bitrate_kbps"].nunique()
    sizes = rd.groupby(CURVE_KEYS).size()
    short = sizes[sizes != n_rates]
    if len(short):
        (m, v, a), n = short.index[0], short.iloc[0]
        raise AdvbenchError(
            f"incomplete RD curve metric={m} video={v} amplitude={a}: "
            f"expected {n_rates} bitrates, got {n} ({len(short)} curve(s) incomplete)"
        )
    per_video = rd.groupby(["metric", "video"])["amplitude"].agg(frozenset)
    per_metric = per_video.groupby(level="metric").agg(lambda s: frozenset().union(*s))
    for (metric, video), levels in per_video.items():
        expected = per_metric[metric]
        if 0.0 not in expected or len(expected) < 2:
            raise AdvbenchError(
                f"metric={metric} has amplitudes {sorted(expected)}; expected 0 (unperturbed) "
                "and at least one amplitude > 0"
            )
        if levels != expected:
            raise AdvbenchError(
                f"metric={metric} video={video} has amplitudes {sorted(levels)}; "
                f"expected {sorted(expected)} like its other videos"
            )


def _check_one_setting(rd: pd.DataFrame) -> None:
    """One PSNR kind for the whole frame, one settings key per (metric, video), where recorded.

    PSNR is normalised over every curve of every metric, so RGB and luma values must not mix;
    points of one video made with other settings (another UAP, csf, preset, ...) are stale.
    Records older than these columns had luma PSNR and no key.
    """
    if "psnr_kind" in rd.columns:
        kinds = sorted(rd["psnr_kind"].fillna("luma").unique())
        if len(kinds) > 1:
            raise AdvbenchError(
                f"RD records mix PSNR kinds {kinds}; expected one (rerun `advbench uap stability` "
                "with one psnr= setting for every metric)"
            )
    if "settings_key" in rd.columns:
        counts = rd.groupby(["metric", "video"])["settings_key"].nunique(dropna=False)
        mixed = counts[counts > 1]
        if len(mixed):
            (metric, video), n = mixed.index[0], mixed.iloc[0]
            raise AdvbenchError(
                f"RD records of metric={metric} video={video} come from {n} different settings "
                "(UAP, csf, preset, max_frames, psnr, metric or video); rerun `advbench uap stability` "
                "with one setting: it replaces the stale points"
            )


def rd_areas(rd: pd.DataFrame, higher_better: Mapping[str, bool] | None = None) -> pd.DataFrame:
    """Steps 1–5: per (metric, video, amplitude > 0) target gain and PSNR loss.

    Returns columns metric, video, amplitude, gain, loss.
    """
    _check_complete(rd)
    higher_better = dict(higher_better or {})
    rd = rd.sort_values([*CURVE_KEYS, "real_bitrate_kbps"])
    metrics = list(dict.fromkeys(rd["metric"]))
    psnr_all = rd["psnr"].to_numpy(float)
    psnr_lo, psnr_hi = psnr_all.min(), psnr_all.max()
    frames = []
    for metric in metrics:  # metrics differ in videos/amplitudes, so one array each
        sub = rd[rd["metric"] == metric]
        videos = list(dict.fromkeys(sub["video"]))
        amps = np.sort(sub["amplitude"].unique())
        shape = (len(videos), len(amps), -1)
        x = sub["real_bitrate_kbps"].to_numpy(float).reshape(shape)
        target = _normalise(sub["metric_score"].to_numpy(float)).reshape(shape)
        if not higher_better.get(metric, True):
            target = 1.0 - target
        psnr = sub["psnr"].to_numpy(float).reshape(shape)
        psnr = (psnr - psnr_lo) / (psnr_hi - psnr_lo) if psnr_hi > psnr_lo else psnr * 0.0
        gain = _overlap_area_difference(x, target)
        loss = -_overlap_area_difference(x, psnr)
        frames.append(
            pd.DataFrame(
                {
                    "metric": metric,
                    "video": np.repeat(videos, len(amps) - 1),
                    "amplitude": np.tile(amps[1:], len(videos)),
                    "gain": gain.ravel(),
                    "loss": loss.ravel(),
                }
            )
        )
    return pd.concat(frames, ignore_index=True)


def gain_vs_loss(areas: pd.DataFrame) -> pd.DataFrame:
    """Steps 6–7: mean gain and loss over videos, one point per (metric, amplitude)."""
    curves = areas.groupby(["metric", "amplitude"], sort=False, as_index=False)[["loss", "gain"]]
    return curves.mean().sort_values(["metric", "amplitude"], kind="stable", ignore_index=True)


def shared_loss_interval(curves: pd.DataFrame) -> tuple[float, float]:
    """Loss range where every metric's curve is defined: max of first points, min of last."""
    ordered = curves.sort_values(["metric", "amplitude"])
    unchanged = [str(m) for m, loss in ordered.groupby("metric")["loss"] if (loss == 0).all()]
    if unchanged:
        raise AdvbenchError(
            f"the perturbation of {', '.join(unchanged)} cost no PSNR at any amplitude: it changed no 8-bit frame "
            "(a UAP too weak for its amplitudes), so there is no gain-vs-loss curve; rerun `advbench uap stability` "
            "with a UAP trained longer or larger amplitudes"
        )
    ends = ordered.groupby("metric")["loss"].agg(["first", "last"])
    lo, hi = float(ends["first"].max()), float(ends["last"].min())
    if not hi > lo:
        raise AdvbenchError(
            "the gain-vs-loss curves share no loss interval "
            f"(largest first point {lo:.5g} >= smallest last point {hi:.5g}); "
            "expected at least two amplitudes with overlapping PSNR losses"
        )
    return lo, hi


def stability_scores(
    curves: pd.DataFrame, interval: tuple[float, float] | None = None
) -> pd.Series:
    """−100 × area under each metric's mean gain-vs-loss curve over the shared interval."""
    lo, hi = shared_loss_interval(curves) if interval is None else interval
    scores = {
        metric: -100.0 * float(clipped_trapezoid(pts["loss"].to_numpy(), pts["gain"].to_numpy(), lo, hi))
        for metric, pts in curves.sort_values("amplitude").groupby("metric", sort=False)
    }
    return pd.Series(scores, name="stability")


def stability_table(
    curves: pd.DataFrame,
    source: str,
    srcc: pd.DataFrame | None = None,
    interval: tuple[float, float] | None = None,
) -> pd.DataFrame:
    """Table 2: metric, stability, source, loss interval, then any SRCC columns, best first.

    `source` says where the areas came from ("stored areas", "recomputed", "rd records").
    `srcc` is a frame with a `metric` column and one column per benchmark (see `load_srcc`).
    """
    lo, hi = shared_loss_interval(curves) if interval is None else interval
    scores = stability_scores(curves, (lo, hi))
    table = pd.DataFrame(
        {"metric": scores.index, "stability": scores.to_numpy(), "source": source,
         "loss_lo": lo, "loss_hi": hi}
    )
    if srcc is not None:
        table = table.merge(srcc, on="metric", how="left")
    return table.sort_values("stability", ascending=False, kind="stable", ignore_index=True)


def load_srcc(path: str | Path) -> pd.DataFrame:
    """Read a user's CSV of SRCC values: a `metric` column plus one column per benchmark."""
    try:
        frame = pd.read_csv(path)
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise AdvbenchError(f"cannot read SRCC table '{path}': {exc}") from None
    if "metric" not in frame.columns:
        raise AdvbenchError(
            f"SRCC table '{path}' needs a 'metric' column; got columns {list(frame.columns)}"
        )
    return frame


def _amplitude(folder: str) -> float:
    """`a02` -> 0.02 (the published layout's amplitude folders)."""
    match = re.fullmatch(r"a(\d+)", folder)
    if not match:
        raise AdvbenchError(f"unexpected amplitude folder '{folder}': expected a00, a02, ...")
    return int(match.group(1)) / 100


def load_published(
    root: str | Path, target_bitrates_kbps: tuple[int, ...] = PUBLISHED_BITRATES_KBPS
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Read the UAP paper's published data layout into (RD records, stored areas).

    Layout: `scores/<amp>/<metric>/<video>.npy` (target score per bitrate),
    `<video>_psnr.npy` (PSNR per bitrate), `real_bitrates/<amp>/<metric>/<video>.npy` (Mbps)
    and `areas_under_rd_curves/<metric>/{<metric>,psnr}.npy` (videos × amplitudes > 0).
    The stored area arrays carry no video names, so their rows are labelled by position.
    """
    root = Path(root)
    amp_dirs = sorted((root / "scores").glob("a*")) if (root / "scores").is_dir() else []
    if not amp_dirs:
        raise AdvbenchError(f"no published RD data under '{root}': expected scores/a00/<metric>/")
    keys: list[tuple[str, str, float]] = []
    columns: list[np.ndarray] = []
    n_rates = len(target_bitrates_kbps)
    for amp_dir in amp_dirs:
        amplitude = _amplitude(amp_dir.name)
        for score_file in sorted(amp_dir.glob("*/*.npy")):
            if score_file.stem.endswith("_psnr"):
                continue
            metric, video = score_file.parent.name, score_file.stem
            rel = Path(amp_dir.name, metric)
            try:
                point = [
                    np.load(score_file).ravel(),
                    np.load(root / "scores" / rel / f"{video}_psnr.npy").ravel(),
                    np.load(root / "real_bitrates" / rel / f"{video}.npy").ravel() * 1000.0,
                ]
            except (OSError, ValueError) as exc:
                raise AdvbenchError(f"cannot read published RD data for {rel}/{video}: {exc}") from None
            if any(len(a) != n_rates for a in point):
                raise AdvbenchError(
                    f"{rel}/{video}: expected {n_rates} values in scores, PSNR and real bitrates; "
                    f"got {[len(a) for a in point]}"
                )
            keys.append((metric, video, amplitude))
            columns.append(np.stack(point, axis=1))
    values = np.concatenate(columns)
    records = pd.DataFrame(np.repeat(np.array(keys, dtype=object), n_rates, axis=0), columns=CURVE_KEYS)
    records["amplitude"] = records["amplitude"].astype(float)
    records["target_bitrate_kbps"] = np.tile(np.asarray(target_bitrates_kbps), len(keys))
    records["metric_score"], records["psnr"], records["real_bitrate_kbps"] = values.T
    amplitudes = sorted(a for a in records["amplitude"].unique() if a > 0)
    return records, _stored_areas(root, amplitudes)


def _stored_areas(root: Path, amplitudes: list[float]) -> pd.DataFrame:
    """The published areas under the RD curves, rows labelled by position (the arrays carry no video names)."""
    areas = []
    for metric_dir in sorted((root / "areas_under_rd_curves").glob("*")):
        metric = metric_dir.name
        gain = np.load(metric_dir / f"{metric}.npy")
        loss = np.load(metric_dir / "psnr.npy")
        if gain.shape != loss.shape or gain.shape[1] != len(amplitudes):
            raise AdvbenchError(
                f"stored areas for {metric}: expected two (videos, {len(amplitudes)}) arrays; "
                f"got {gain.shape} and {loss.shape}"
            )
        areas.append(
            pd.DataFrame(
                {"metric": metric,
                 "video": np.repeat([f"#{i}" for i in range(gain.shape[0])], len(amplitudes)),
                 "amplitude": np.tile(amplitudes, gain.shape[0]),
                 "gain": gain.ravel(), "loss": loss.ravel()}
            )
        )
    return pd.concat(areas, ignore_index=True) if areas else pd.DataFrame(
        columns=["metric", "video", "amplitude", "gain", "loss"]
    )
