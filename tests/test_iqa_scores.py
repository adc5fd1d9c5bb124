"""The MSU scores against values worked out by hand, SSIM/PSNR against scikit-image."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from skimage.metrics import peak_signal_noise_ratio, structural_similarity

from advbench.quality.iqa.fidelity import psnr, ssim
from advbench.quality.iqa.msu_scores import gain_by_iteration, msu_scores, per_image_scores, t_interval


def records(clean: list[float], attacked: list[float], higher_better: bool = True) -> pd.DataFrame:
    n = len(clean)
    return pd.DataFrame({"cell_key": "k", "metric": "m", "attack": "a", "eps": 0.01, "higher_better": higher_better,
                         "score_clean": clean, "score_attacked": attacked, "psnr": 40.0, "ssim": 0.99,
                         "score_trace": [[c + (a - c) / 2, a] for c, a in zip(clean, attacked)],
                         "image_id": range(n)})


def test_per_image_scores_by_hand() -> None:
    # clean 1, 2, 3 -> scaled 0, .5, 1; attacked 2, 2, 5 -> .5, .5, 2
    scores = per_image_scores(records([1, 2, 3], [2, 2, 5]))
    np.testing.assert_allclose(scores["s_c"], [0, 0.5, 1])
    np.testing.assert_allclose(scores["s_a"], [0.5, 0.5, 2])
    np.testing.assert_allclose(scores["abs_gain"], [0.5, 0, 1])
    np.testing.assert_allclose(scores["rel_gain"], [0.5, 0, 0.5])
    np.testing.assert_allclose(scores["classic_gain"], [1 / (1 + 1e-6), 0, 2 / (3 + 1e-6)])
    np.testing.assert_allclose(scores["robustness"], [math.log10(1 / (0.5 + 1e-6)), math.log10(0.5 / 1e-6),
                                                      math.log10(1 / (1 + 1e-6))])


def test_lower_better_metric_is_flipped_before_scaling() -> None:
    up = per_image_scores(records([1, 2, 3], [2, 2, 5]))
    down = per_image_scores(records([5, 4, 3], [4, 4, 1], higher_better=False))  # flipped: the same scaled values
    for col in ("s_c", "s_a", "abs_gain", "rel_gain", "robustness"):
        np.testing.assert_allclose(down[col], up[col])
    # raw classic gain: a lower score is a gain for a lower-better metric
    np.testing.assert_allclose(down["classic_gain"], [1 / (5 + 1e-6), 0, 2 / (3 + 1e-6)])


def test_cell_scores_intervals_and_distances_by_hand() -> None:
    row = msu_scores(records([1, 2, 3], [2, 2, 5])).iloc[0]
    assert row["n"] == 3 and row["abs_gain"] == pytest.approx(0.5)
    # sd of (.5, 0, 1) is .5; t(0.975, 2) = 4.302653
    assert row["abs_gain_ci"] == pytest.approx(4.302653 * 0.5 / math.sqrt(3), rel=1e-6)
    # W1 of {0, .5, 1} and {.5, .5, 2}: mean |sorted differences| = (.5 + 0 + 1) / 3
    assert row["wasserstein"] == pytest.approx(0.5)
    # energy: sqrt(2 E|X-Y| - E|X-X'| - E|Y-Y'|) = sqrt(2 * 6.5/9 - 4/9 - 6/9) = sqrt(1/3)
    assert row["energy"] == pytest.approx(math.sqrt(1 / 3))
    worse = msu_scores(records([1, 2, 3], [0, 1, 2])).iloc[0]
    assert worse["wasserstein"] == pytest.approx(-0.5) and worse["energy"] < 0


def test_t_interval_needs_two_values() -> None:
    assert t_interval(np.array([1.0, 2.0, 3.0])) == pytest.approx(4.302653 / math.sqrt(3), rel=1e-6)
    assert math.isnan(t_interval(np.array([1.0])))


def test_gain_by_iteration_reads_the_traces() -> None:
    curve = gain_by_iteration(records([1, 2, 3], [2, 2, 5]))
    assert curve["iteration"].tolist() == [1, 2]
    np.testing.assert_allclose(curve["abs_gain"], [0.25, 0.5])


def test_ssim_and_psnr_match_scikit_image() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.rand(3, 3, 40, 52, generator=g)
    y = (x + 0.05 * torch.randn(x.shape, generator=g)).clamp(0, 1)
    expected_ssim = [structural_similarity(y[i].numpy(), x[i].numpy(), gaussian_weights=True, sigma=1.5,
                                           use_sample_covariance=False, data_range=1, channel_axis=0)
                     for i in range(3)]
    expected_psnr = [peak_signal_noise_ratio(x[i].numpy(), y[i].numpy(), data_range=1) for i in range(3)]
    np.testing.assert_allclose(ssim(y, x).numpy(), expected_ssim, rtol=1e-4)
    np.testing.assert_allclose(psnr(y, x).numpy(), expected_psnr, rtol=1e-5)
