"""The MSU benchmark's robustness scores (Antsiferova et al., AAAI 2024) as pure functions of `iqa run` records.

Per record (one image at one budget), with s the score scaled by MinMax fitted on the cell's
clean scores (after flipping lower-better metrics, so that higher always means "better"):

* absolute gain  s_a − s_c;
* relative gain  ((s_a + 1) − (s_c + 1)) / (s_c + 1);
* classic relative gain  (a − c) / (c + 1e-6) on raw scores (sign flipped for lower-better metrics);
* robustness score  log10(max(1 − s_c, s_c) / (|s_c − s_a| + 1e-6)): how many orders of magnitude
  the attack's change stays below the largest change the scale allows (higher: more robust).

Per (metric, attack, ε): the mean of each with a 95 % Student-t interval over images, and the
Wasserstein and energy distances between the clean and attacked scaled distributions
(`scipy.stats`), each signed by sign(mean s_a − mean s_c).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats

PER_IMAGE = ("abs_gain", "rel_gain", "classic_gain", "robustness")
CELL = ["metric", "attack", "eps"]


def _direction(frame: pd.DataFrame) -> np.ndarray:
    return np.where(frame["higher_better"].astype(bool), 1.0, -1.0)


def _scale(frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row: the sign making higher better, and the MinMax offset and width of its cell's clean scores."""
    sign = _direction(frame)
    keyed = pd.DataFrame({"key": frame["cell_key"].to_numpy(), "clean": sign * frame["score_clean"].to_numpy(float)})
    lo = keyed.groupby("key")["clean"].transform("min").to_numpy()
    hi = keyed.groupby("key")["clean"].transform("max").to_numpy()
    return sign, lo, np.where(hi > lo, hi - lo, 1.0)


def raw_gain(frame: pd.DataFrame) -> np.ndarray:
    """Per row: the attacked minus the clean raw score, towards the metric's better end, in its own units
    (unlike the scaled gains, independent of which images share the cell)."""
    return _direction(frame) * (frame["score_attacked"].to_numpy(float) - frame["score_clean"].to_numpy(float))


def clean_width(frame: pd.DataFrame) -> float:
    """The width the scaled scores of one cell's records divide by: the range of its clean scores (1 when they
    are all equal)."""
    return float(_scale(frame)[2][0])


def scaled(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` plus s_c and s_a: scores MinMax-scaled on each cell's clean scores, higher = better."""
    sign, lo, width = _scale(frame)
    return frame.assign(s_c=(sign * frame["score_clean"].to_numpy(float) - lo) / width,
                        s_a=(sign * frame["score_attacked"].to_numpy(float) - lo) / width)


def per_image_scores(frame: pd.DataFrame) -> pd.DataFrame:
    """`scaled(frame)` plus the four per-image scores of the module docstring."""
    out = scaled(frame)
    s_c, s_a = out["s_c"].to_numpy(), out["s_a"].to_numpy()
    clean, attacked = out["score_clean"].to_numpy(float), out["score_attacked"].to_numpy(float)
    return out.assign(
        abs_gain=s_a - s_c,
        rel_gain=((s_a + 1) - (s_c + 1)) / (s_c + 1),
        classic_gain=_direction(out) * (attacked - clean) / (clean + 1e-6),
        robustness=np.log10(np.maximum(1 - s_c, s_c) / (np.abs(s_c - s_a) + 1e-6)),
    )


def t_interval(values: np.ndarray, level: float = 0.95) -> float:
    """Half-width of the Student-t interval of the mean; NaN for fewer than two values."""
    values = np.asarray(values, dtype=float)
    if len(values) < 2:
        return float("nan")
    return float(stats.t.ppf(0.5 + level / 2, len(values) - 1) * values.std(ddof=1) / np.sqrt(len(values)))


def signed_distance(clean: np.ndarray, attacked: np.ndarray, distance: str) -> float:
    """scipy's 1-D `wasserstein` or `energy` distance between the two samples, signed by the mean shift."""
    measure = stats.wasserstein_distance if distance == "wasserstein" else stats.energy_distance
    return float(np.sign(np.mean(attacked) - np.mean(clean)) * measure(clean, attacked))


def msu_scores(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per (metric, attack, ε): n, each per-image score's mean and `_ci`, the two signed distances."""
    rows = []
    for (metric, attack, eps), cell in per_image_scores(frame).groupby(CELL, sort=True):
        row = {"metric": metric, "attack": attack, "eps": float(eps), "n": len(cell),
               "psnr": float(cell["psnr"].replace(np.inf, np.nan).mean()), "ssim": float(cell["ssim"].mean())}
        for name in PER_IMAGE:
            row[name] = float(cell[name].mean())
            row[f"{name}_ci"] = t_interval(cell[name].to_numpy())
        for distance in ("wasserstein", "energy"):
            row[distance] = signed_distance(cell["s_c"].to_numpy(), cell["s_a"].to_numpy(), distance)
        rows.append(row)
    return pd.DataFrame(rows)


def gain_by_iteration(frame: pd.DataFrame) -> pd.DataFrame:
    """Mean absolute gain (scaled) of the iterate after each iteration, per (metric, attack, ε), with its
    t-interval: the gain-vs-iterations curve of one run, read from every record's `score_trace`."""
    sign, lo, width = _scale(frame)
    s_c = (sign * frame["score_clean"].to_numpy(float) - lo) / width
    long = frame[CELL].assign(sign=sign, lo=lo, width=width, s_c=s_c,
                              raw=[np.asarray(t, dtype=float) for t in frame["score_trace"]]).explode("raw")
    long["iteration"] = long.groupby(level=0).cumcount() + 1
    long["gain"] = (long["sign"] * long["raw"].astype(float) - long["lo"]) / long["width"] - long["s_c"]
    grouped = long.groupby([*CELL, "iteration"])["gain"]
    return grouped.mean().rename("abs_gain").to_frame().join(grouped.agg(t_interval).rename("abs_gain_ci")).reset_index()
