"""UAP files, application, training and the MADC reference attack, on the seed's UAP and toy metrics."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from advbench.core.errors import AdvbenchError
from advbench.quality.metrics.metric_contract import QualityMetric
from advbench.quality.metrics.scoring import signed_gain
from advbench.quality.uap.ablation import ablation_figure, plot_ablation
from advbench.quality.uap.evaluation import evaluate_uap, madc_attack
from advbench.quality.uap.perturbation import apply_uap, csf_mask, load_uap, save_uap, tile_uap, uap_meta
from advbench.quality.uap.training import train_uap

SEED_PNG = Path(__file__).parent / "data" / "uap" / "pretrained_uap_paq2piq.png"


class Sharpness(QualityMetric):
    """Toy metric: 100 * tanh of the mean squared horizontal gradient, higher is better."""

    score_range = (0.0, 100.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 100 * torch.tanh(20 * (x[..., 1:] - x[..., :-1]).pow(2).mean((1, 2, 3)))


class Darkness(QualityMetric):
    """Toy lower-is-better metric in [0, 10]: mean red intensity."""

    higher_better = False
    score_range = (0.0, 10.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 10 * x[:, 0].mean((1, 2))


def smooth_images(n: int, size: int, seed: int) -> torch.Tensor:
    """Blurry random images (low toy sharpness, room to raise it), values well inside [0, 1]."""
    noise = torch.rand(n, 3, size // 8, size // 8, generator=torch.Generator().manual_seed(seed))
    return 0.2 + 0.6 * F.interpolate(noise, size=(size, size), mode="bilinear", align_corners=False)


@pytest.fixture(scope="module")
def seed_uap() -> torch.Tensor:
    return load_uap(SEED_PNG)


def test_seed_png_loads_in_range(seed_uap: torch.Tensor) -> None:
    assert seed_uap.shape == (3, 256, 256)
    assert seed_uap.min() >= -0.1 and seed_uap.max() <= 0.1
    assert seed_uap.abs().max().item() == pytest.approx(0.1, abs=1e-6)  # the trained UAP uses its full range


def test_png_and_pt_round_trips(tmp_path: Path, seed_uap: torch.Tensor) -> None:
    pt, png = save_uap(seed_uap, tmp_path / "copy", {"metric": "paq2piq"})
    assert torch.allclose(load_uap(png), seed_uap, atol=1e-6)
    assert torch.equal(load_uap(pt), seed_uap)
    assert uap_meta(pt) == {"metric": "paq2piq"}
    smooth = (torch.rand(3, 32, 32, generator=torch.Generator().manual_seed(0)) - 0.5) * 0.2
    _, png = save_uap(smooth, tmp_path / "smooth")
    assert (load_uap(png) - smooth).abs().max() <= 0.5 / 255 + 1e-6


def test_out_of_range_or_malformed_uaps_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(AdvbenchError, match="must lie in"):
        save_uap(torch.full((3, 8, 8), 0.3), tmp_path / "big")
    torch.save({"uap": torch.full((3, 8, 8), -0.5)}, tmp_path / "bad.pt")
    with pytest.raises(AdvbenchError, match="must lie in"):
        load_uap(tmp_path / "bad.pt")
    with pytest.raises(AdvbenchError, match="no UAP at"):
        load_uap(tmp_path / "missing.png")


@pytest.mark.parametrize("amplitude", [0.02, 0.06, 0.1])
def test_amplitude_bounds_the_pixel_change(seed_uap: torch.Tensor, amplitude: float) -> None:
    frames = torch.full((2, 3, 256, 256), 0.5)
    change = apply_uap(frames, seed_uap, amplitude) - frames
    assert change.abs().max().item() == pytest.approx(amplitude, abs=1e-6)
    assert torch.allclose(change, seed_uap * 10 * amplitude, atol=1e-6)


def test_application_clips_to_the_image_range(seed_uap: torch.Tensor) -> None:
    out = apply_uap(torch.ones(1, 3, 256, 256), seed_uap, 0.6)
    assert out.max().item() == 1.0 and out.min().item() == pytest.approx(0.4, abs=1e-6)


def test_tiles_to_full_hd(seed_uap: torch.Tensor) -> None:
    frame = torch.full((1, 3, 1080, 1920), 0.5)
    delta = apply_uap(frame, seed_uap, 0.1) - frame
    assert delta.shape == (1, 3, 1080, 1920)
    assert torch.allclose(delta[0, :, :256, :256], seed_uap, atol=1e-6)
    assert torch.allclose(delta[0, :, 768:1024, 1792:1920], seed_uap[:, :, :128], atol=1e-6)
    assert torch.allclose(delta[0, :, 1024:, :256], seed_uap[:, :56], atol=1e-6)
    assert torch.equal(tile_uap(seed_uap, 1080, 1920)[:, 256:512], tile_uap(seed_uap, 1080, 1920)[:, :256])


@pytest.mark.parametrize("amplitude", [0.0, -0.02, 1.5, math.nan, math.inf])
def test_amplitude_outside_unit_interval_is_an_error(seed_uap: torch.Tensor, amplitude: float) -> None:
    with pytest.raises(AdvbenchError, match=r"amplitude must be in \(0, 1\]"):
        apply_uap(torch.rand(1, 3, 64, 64), seed_uap, amplitude)


def test_csf_mask_follows_local_contrast(seed_uap: torch.Tensor) -> None:
    frame = torch.full((1, 3, 256, 256), 0.5)
    frame[..., 128:] = torch.rand(1, 3, 256, 128, generator=torch.Generator().manual_seed(0))
    mask = csf_mask(frame)
    assert mask.shape == (1, 1, 256, 256) and mask.min() >= 0 and mask.max() <= 1
    assert mask[..., 160:224].mean() > 5 * mask[..., 32:96].mean()
    masked = apply_uap(frame, seed_uap, 0.1, csf=True) - frame
    plain = apply_uap(frame, seed_uap, 0.1) - frame
    assert masked[..., 32:96].abs().mean() < 0.2 * plain[..., 32:96].abs().mean()
    assert (masked.abs() <= plain.abs() + 1e-6).all()


def test_training_raises_a_toy_metric_on_unseen_images() -> None:
    metric = Sharpness()
    uap = train_uap(metric, smooth_images(32, 32, 0), size=32, lr=5e-3, epochs=3, batch_size=8, progress=False)
    assert uap.shape == (3, 32, 32) and uap.abs().max() <= 0.1 + 1e-7
    test = smooth_images(16, 32, 1)
    clean, attacked, _ = evaluate_uap(metric, test, uap, [0.1])
    assert (attacked[0] > clean).all()


def test_training_lowers_a_lower_is_better_metric() -> None:
    metric = Darkness()
    uap = train_uap(metric, smooth_images(16, 32, 0), size=32, lr=5e-3, epochs=2, batch_size=8, progress=False)
    assert (uap[0] < 0).float().mean() > 0.99  # the red channel is pushed down everywhere
    clean, attacked, _ = evaluate_uap(metric, smooth_images(8, 32, 2), uap, [0.1])
    assert (attacked[0] < clean).all() and (signed_gain(metric, clean, attacked[0]) > 0).all()


def test_training_checks_image_size() -> None:
    with pytest.raises(AdvbenchError, match=r"\(3, 256, 256\)"):
        train_uap(Sharpness(), torch.rand(4, 3, 32, 32), progress=False)


@pytest.mark.parametrize("mse_power", [1.0, 2.0])
def test_madc_raises_the_metric_within_the_mse_budget(mse_power: float) -> None:
    metric = Sharpness()
    images = smooth_images(6, 32, 3)
    amplitude = 0.05
    adv, seconds = madc_attack(metric, images, amplitude, steps=15, mse_power=mse_power, batch_size=4, progress=False)
    assert seconds > 0 and adv.min() >= 0 and adv.max() <= 1
    mse = (adv - images).pow(2).mean((1, 2, 3))
    assert (mse <= amplitude ** mse_power * (1 + 1e-4)).all()
    with torch.no_grad():
        assert (metric(adv) > metric(images)).all()


def test_madc_never_makes_a_rough_metric_worse() -> None:
    class Rough(QualityMetric):
        score_range = (0.0, 1.0)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (torch.sin(400 * x).mean((1, 2, 3)) + x.mean((1, 2, 3)))

    metric, images = Rough(), smooth_images(4, 16, 4)
    adv, _ = madc_attack(metric, images, 0.1, steps=10, progress=False)
    with torch.no_grad():
        assert (metric(adv) >= metric(images)).all()


def test_plot_ablation_draws_one_figure(tmp_path: Path) -> None:
    gen = torch.Generator().manual_seed(0)
    rows = [{"metric": "toy", "seed": s, "n_train": n, "epochs": 5, "amplitude": a, "image": i,
             "gain": float(torch.randn(1, generator=gen)) + n / 10}
            for s in (0, 1) for n in (8, 16) for a in (0.02, 0.1) for i in range(5)]
    out = plot_ablation(pd.DataFrame(rows), tmp_path / "ablation.png")
    assert out.is_file() and out.stat().st_size > 1000
    with pytest.raises(AdvbenchError, match="no ablation records at amplitude"):
        plot_ablation(pd.DataFrame(rows), tmp_path / "x.png", amplitude=0.5)
    with pytest.raises(AdvbenchError, match="missing"):
        plot_ablation(pd.DataFrame(rows).drop(columns="epochs"), tmp_path / "x.png")


def test_ablation_figure_ticks_whole_numbers_defines_whiskers_and_wraps_panels() -> None:
    gen = torch.Generator().manual_seed(0)
    rows = [{"metric": "toy", "seed": s, "n_train": n, "epochs": e, "amplitude": 0.1, "image": i,
             "gain": float(torch.randn(1, generator=gen))}
            for s, n, e in [(0, 64, 5), (1, 64, 5), (2, 64, 5), (0, 16, 5), (0, 64, 1)] for i in range(6)]
    table1 = {"metric": "toy", "seed": None, "n_train": None, "epochs": None, "amplitude": 0.1, "image": 0, "gain": 9.0}
    frame = pd.DataFrame([*rows, table1])  # Table-1 rows leave NaN in the training keys: floats
    assert frame["seed"].dtype == float
    fig = ablation_figure(frame)
    fig.canvas.draw()
    panels = {ax.get_xlabel(): ax for ax in fig.axes}
    assert set(panels) == {"training seed", "training images", "epochs"}
    assert [t.get_text() for t in panels["training seed"].get_xticklabels()] == ["0", "1", "2"]
    assert [t.get_text() for t in panels["training images"].get_xticklabels()] == ["16", "64"]
    assert [t.get_text() for t in panels["epochs"].get_xticklabels()] == ["1", "5"]
    assert len({round(ax.get_position().y0, 3) for ax in fig.axes}) == 2, "three panels: two rows, not one"
    legend = " ".join(t.get_text() for t in fig.legends[0].get_texts())
    assert "min–max (whiskers)" in legend and "quartiles" in legend
    seed0 = frame[(frame["seed"] == 0) & (frame["n_train"] == 64) & (frame["epochs"] == 5)]["gain"]
    ends = {round(y, 6) for line in panels["training seed"].get_lines() for y in line.get_ydata()}
    assert {round(seed0.min(), 6), round(seed0.max(), 6)} <= ends, "whiskers reach the extreme gains"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_the_quality_jobs_resolve_devices_by_the_benchmarks_rule() -> None:
    from advbench.core.errors import AdvbenchError
    from advbench.quality.metrics.scoring import device_of

    assert device_of(None) == device_of("auto") == torch.device("cpu")
    with pytest.raises(AdvbenchError, match="no CUDA device is available; use device=cpu"):
        device_of("cuda")
