"""Stability score: the UAP paper's published Table 2 and properties of the pure functions."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from advbench.core.errors import AdvbenchError
from advbench.quality.stability import scores as S
from advbench.quality.stability.report import published_table2, stability_from_records

FIXTURE = Path(__file__).parent / "data" / "seed_stability"
# Table 2 of the paper, as reproduced to two decimals by the published areas (fixture README).
PUBLISHED = {"paq2piq": -5.31, "linearity": -4.18, "vsfa": -3.80, "mdtvsfa": -4.83,
             "koncept": -0.31, "spaq": 2.55, "nima": -0.12}
PUBLISHED_INTERVAL = (0.10414, 0.36146)


@pytest.fixture(scope="module")
def published() -> tuple[pd.DataFrame, pd.DataFrame]:
    return S.load_published(FIXTURE)


def test_stored_areas_reproduce_table2(published) -> None:
    curves = S.gain_vs_loss(published[1])
    lo, hi = S.shared_loss_interval(curves)
    assert (lo, hi) == pytest.approx(PUBLISHED_INTERVAL, abs=1e-5)
    scores = S.stability_scores(curves)
    assert set(scores.index) == set(PUBLISHED)
    for metric, value in PUBLISHED.items():
        assert scores[metric] == pytest.approx(value, abs=0.01), metric


def test_recomputation_from_scores_keeps_published_ranking(published) -> None:
    table, curves = stability_from_records(published[0], source="recomputed")
    recomputed = table.set_index("metric")["stability"]
    assert list(recomputed.sort_values().index) == sorted(PUBLISHED, key=PUBLISHED.get)
    expected = pd.Series(PUBLISHED)[recomputed.index]
    assert (np.sign(recomputed) == np.sign(expected)).all()
    assert (recomputed.abs() <= expected.abs() + 0.01).all()  # README: smaller magnitudes
    assert set(curves["amplitude"]) == {0.02, 0.04, 0.06, 0.08}


def test_recomputed_gains_match_stored_gains_per_amplitude(published) -> None:
    """The stored target gains come from the same conventions (linear bitrate, overlap area)."""
    records, stored = published
    mine = S.gain_vs_loss(S.rd_areas(records)).set_index(["metric", "amplitude"])["gain"]
    theirs = S.gain_vs_loss(stored).set_index(["metric", "amplitude"])["gain"]
    assert np.abs(mine - theirs[mine.index]).max() < 0.005


def test_published_table_lists_both_sources_with_srcc(tmp_path: Path) -> None:
    srcc_csv = tmp_path / "srcc.csv"
    pd.DataFrame({"metric": ["paq2piq", "spaq"], "srcc_msu": [0.89, None]}).to_csv(srcc_csv, index=False)
    table, curves = published_table2(FIXTURE, S.load_srcc(srcc_csv))
    assert set(table["source"]) == {"stored areas", "recomputed"}
    assert len(table) == 14 and set(curves["source"]) == {"stored areas", "recomputed"}
    paq = table[(table["metric"] == "paq2piq")]
    assert (paq["srcc_msu"] == 0.89).all()
    stored = table[table["source"] == "stored areas"]
    assert stored["stability"].is_monotonic_decreasing


def synthetic_rd(
    gain_per_amp: dict[str, float],
    n_videos: int = 3,
    amplitudes: tuple[float, ...] = (0.0, 0.02, 0.04, 0.06, 0.08),
    bitrates: tuple[float, ...] = (200, 1000, 5000, 12000),
    seed: int = 0,
) -> pd.DataFrame:
    """RD records where PSNR falls with amplitude and each metric moves by gain·amplitude."""
    rows = []
    for metric, slope in gain_per_amp.items():
        for v in range(n_videos):
            rng = np.random.default_rng([seed, v])  # the same videos for every metric
            base = rng.uniform(20, 60) + 10 * np.log(np.asarray(bitrates))
            rates = np.asarray(bitrates) * rng.uniform(0.8, 1.1, len(bitrates))
            for a in amplitudes:
                rows.append(pd.DataFrame({
                    "metric": metric, "video": f"v{v}", "amplitude": a,
                    "target_bitrate_kbps": bitrates, "real_bitrate_kbps": rates,
                    "metric_score": base + slope * a * 100,
                    "psnr": 30 + 2 * np.log(rates) - 60 * a,
                }))
    return pd.concat(rows, ignore_index=True)


def test_unmoved_metric_scores_zero_rising_negative_falling_positive() -> None:
    table, curves = stability_from_records(synthetic_rd({"flat": 0.0, "up": 1.0, "down": -1.0}))
    score = table.set_index("metric")["stability"]
    assert score["flat"] == pytest.approx(0.0, abs=1e-6)  # a float sum of zeros: exact here, last bits elsewhere
    assert score["up"] < -1.0
    assert score["down"] == pytest.approx(-score["up"])
    flat = curves[curves["metric"] == "flat"]
    assert np.allclose(flat["gain"], 0.0) and (np.diff(flat["loss"]) > 0).all()


def test_lower_is_better_metric_flips_the_sign() -> None:
    rd = synthetic_rd({"up": 1.0, "ref": 1.0})
    rd["higher_better"] = rd["metric"] != "up"
    score = stability_from_records(rd)[0].set_index("metric")["stability"]
    assert score["up"] == pytest.approx(-score["ref"]) and score["up"] > 0


@settings(max_examples=25, deadline=None)
@given(scale=st.floats(0.01, 100), shift=st.floats(-1e3, 1e3), seed=st.integers(0, 10_000))
def test_score_is_invariant_to_affine_rescaling_of_the_metric(scale: float, shift: float, seed: int) -> None:
    rd = synthetic_rd({"m": 0.7, "other": -0.3}, seed=seed)
    moved = rd.assign(metric_score=np.where(rd["metric"] == "m", rd["metric_score"] * scale + shift,
                                            rd["metric_score"]))
    a = stability_from_records(rd)[0].set_index("metric")["stability"]
    b = stability_from_records(moved)[0].set_index("metric")["stability"]
    assert np.allclose(a.sort_index(), b.sort_index(), atol=1e-9)


@settings(max_examples=50, deadline=None)
@given(
    ys=st.lists(st.floats(-5, 5), min_size=2, max_size=7),
    steps=st.lists(st.floats(0.01, 2), min_size=6, max_size=6),
    bounds=st.tuples(st.floats(0, 1), st.floats(0, 1)),
)
def test_clipped_trapezoid_matches_dense_integration(ys, steps, bounds) -> None:
    y = np.asarray(ys)
    x = np.concatenate([[0.0], np.cumsum(steps[: len(y) - 1])])
    lo, hi = sorted(b * x[-1] for b in bounds)
    grid = np.linspace(lo, hi, 20001)
    dense = np.trapezoid(np.interp(grid, x, y), grid)
    assert S.clipped_trapezoid(x, y, lo, hi) == pytest.approx(dense, abs=1e-4 * (1 + np.abs(y).max()))
    # running the same polyline backwards flips the sign
    assert S.clipped_trapezoid(x[::-1], y[::-1], lo, hi) == pytest.approx(-S.clipped_trapezoid(x, y, lo, hi))


def test_incomplete_or_baseline_free_records_are_refused() -> None:
    rd = synthetic_rd({"m": 1.0})
    with pytest.raises(AdvbenchError, match="incomplete RD curve"):
        S.rd_areas(rd.iloc[1:])
    with pytest.raises(AdvbenchError, match="amplitude > 0|unperturbed"):
        S.rd_areas(rd[rd["amplitude"] > 0])
    with pytest.raises(AdvbenchError, match="duplicate"):
        S.rd_areas(pd.concat([rd, rd.iloc[:1]]))
    with pytest.raises(AdvbenchError, match="lack column"):
        S.rd_areas(rd.drop(columns="psnr"))


def test_mixed_psnr_kinds_or_stale_settings_are_refused() -> None:
    rd = synthetic_rd({"m": 1.0, "n": 0.5}).assign(psnr_kind="rgb", settings_key="k0")
    S.rd_areas(rd)
    luma = rd.assign(psnr_kind=np.where(rd["metric"] == "n", "luma", "rgb"))
    with pytest.raises(AdvbenchError, match=r"mix PSNR kinds \['luma', 'rgb'\]"):
        S.rd_areas(luma)
    older = pd.concat([rd[rd["metric"] == "m"], rd[rd["metric"] == "n"].drop(columns="psnr_kind")])
    with pytest.raises(AdvbenchError, match="mix PSNR kinds"):  # records without the column were luma
        S.rd_areas(older)
    stale = rd.assign(settings_key=np.where(rd["amplitude"] > 0.05, "k1", "k0"))
    with pytest.raises(AdvbenchError, match="metric=m video=v0 come from 2 different settings"):
        S.rd_areas(stale)
    S.rd_areas(rd.assign(settings_key=rd["video"]))  # each video has its own key (its bytes)


def test_disjoint_loss_ranges_have_no_shared_interval() -> None:
    curves = pd.DataFrame({"metric": ["a", "a", "b", "b"], "amplitude": [0.02, 0.04] * 2,
                           "loss": [0.1, 0.2, 0.3, 0.4], "gain": [0.0, 0.1, 0.0, 0.1]})
    with pytest.raises(AdvbenchError, match="share no loss interval"):
        S.stability_scores(curves)


def test_bad_published_root_and_srcc_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(AdvbenchError, match="no published RD data"):
        S.load_published(tmp_path)
    bad = tmp_path / "srcc.csv"
    bad.write_text("name,srcc\nx,0.5\n")
    with pytest.raises(AdvbenchError, match="'metric' column"):
        S.load_srcc(bad)
