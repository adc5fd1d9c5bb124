"""The two offline metrics: they rank distortions sensibly on photos they never saw, and have gradients."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from advbench.cli.metrics import build_metric
from advbench.core.errors import AdvbenchError
from advbench.quality.images import photo_crops, sample_photos
from advbench.quality.metrics.learned import CNNQA, save_weights, train_cnnqa
from advbench.quality.metrics.niqe import NIQE
from advbench.quality.metrics.niqe_features import aggd_fit
from advbench.quality.metrics.niqe_pristine import MODEL_FILE, fit_pristine_model, save_pristine_model


def gaussian_blur(x: torch.Tensor, sigma: float) -> torch.Tensor:
    radius = int(3 * sigma)
    ax = torch.arange(-radius, radius + 1, dtype=x.dtype)
    k = torch.exp(-(ax ** 2) / (2 * sigma ** 2))
    k = k / k.sum()
    x = F.conv2d(F.pad(x, (radius, radius, 0, 0), mode="reflect"), k.view(1, 1, 1, -1).repeat(3, 1, 1, 1), groups=3)
    return F.conv2d(F.pad(x, (0, 0, radius, radius), mode="reflect"), k.view(1, 1, -1, 1).repeat(3, 1, 1, 1), groups=3)


def noised(x: torch.Tensor, std: float, seed: int = 0) -> torch.Tensor:
    return (x + std * torch.randn(x.shape, generator=torch.Generator().manual_seed(seed))).clamp(0, 1)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("advbench-cache")


@pytest.fixture(scope="module")
def niqe(cache: Path) -> NIQE:
    return NIQE(pristine="fitted", cache_dir=str(cache))


@pytest.fixture(scope="module")
def cnnqa(tmp_path_factory: pytest.TempPathFactory) -> CNNQA:
    """A shortened training run (the default is 200 steps); ranking emerges within 60."""
    net = train_cnnqa(steps=60, progress=False)
    return CNNQA(weights=str(save_weights(net, tmp_path_factory.mktemp("cnnqa") / "w.pt")))


@pytest.fixture(scope="module")
def held_out() -> list[torch.Tensor]:
    return [p[None] for p in sample_photos("test")]


@pytest.mark.parametrize("exact", [True, False])
def test_aggd_shape_recovered_from_samples(exact: bool) -> None:
    g = torch.Generator().manual_seed(0)
    gauss = torch.randn(200_000, generator=g, dtype=torch.float64)
    laplace = torch.distributions.Laplace(0.0, 1.0).sample((200_000,)).double()
    shapes = aggd_fit(torch.stack([gauss, laplace]), exact)[0].tolist()
    assert shapes == pytest.approx([2.0, 1.0], abs=0.05)


@pytest.mark.parametrize("exact", [True, False])
def test_aggd_recovers_an_asymmetric_gaussian(exact: bool) -> None:
    g = torch.Generator().manual_seed(1)
    z = torch.randn(200_000, generator=g).abs()
    left = torch.rand(200_000, generator=g) < 1 / 3  # AGGD side mass is proportional to its scale (1 vs 2)
    skewed = torch.where(left, -z, 2 * z)
    alpha, left, right, has_left, has_right = (t.item() for t in aggd_fit(skewed, exact))
    assert alpha == pytest.approx(2.0, abs=0.1)
    assert right == pytest.approx(2 * left, rel=0.05) and has_left and has_right


@pytest.mark.parametrize("name", ["niqe", "cnnqa"])
def test_clean_photo_ranked_above_its_noised_and_blurred_versions(name: str, request: pytest.FixtureRequest,
                                                                   held_out: list[torch.Tensor]) -> None:
    metric = request.getfixturevalue(name)
    sign = 1 if metric.higher_better else -1
    with torch.no_grad():
        for photo in held_out:
            clean = sign * metric(photo)
            assert clean > sign * metric(noised(photo, 0.05))
            assert clean > sign * metric(gaussian_blur(photo, 2.0))


def test_cnnqa_orders_distortion_strength(cnnqa: CNNQA) -> None:
    crops = photo_crops("test")[::4]
    with torch.no_grad():
        scores = torch.stack([cnnqa(crops), cnnqa(noised(crops, 0.03)), cnnqa(noised(crops, 0.1))])
    assert ((scores[:-1] - scores[1:]) > 0).float().mean() > 0.9
    assert scores.min() >= 0 and scores.max() <= 100


@pytest.mark.parametrize("name", ["niqe", "cnnqa"])
def test_backward_gives_finite_nonzero_gradients(name: str, request: pytest.FixtureRequest) -> None:
    metric = request.getfixturevalue(name)
    x = photo_crops("test")[:2].clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(metric(x).sum(), x)
    assert torch.isfinite(grad).all()
    assert (grad.flatten(1).abs().sum(1) > 0).all()


def test_niqe_pristine_model_is_cached_and_reused(cache: Path, niqe: NIQE) -> None:
    file = cache / MODEL_FILE
    assert file.is_file()
    stamp = file.stat().st_mtime_ns
    again = NIQE(pristine="fitted", cache_dir=str(cache))
    assert file.stat().st_mtime_ns == stamp
    assert torch.equal(again.mu, niqe.mu)


def test_niqe_uses_an_explicit_model_file(tmp_path: Path, held_out: list[torch.Tensor]) -> None:
    other = save_pristine_model(fit_pristine_model(sample_photos("train")[:6]), tmp_path / "p.pt")
    metric = NIQE(pristine=str(other))
    assert torch.isfinite(metric(held_out[0])).all()


def test_missing_weight_files_are_one_line_errors(tmp_path: Path) -> None:
    for build in (lambda: NIQE(pristine=str(tmp_path / "nope.pt")), lambda: CNNQA(weights=str(tmp_path / "nope.pt"))):
        with pytest.raises(AdvbenchError) as info:
            build()
        assert "nope.pt" in str(info.value) and "\n" not in str(info.value)


def test_small_images_are_rejected_by_niqe(niqe: NIQE) -> None:
    with pytest.raises(AdvbenchError, match="at least 96x96"):
        niqe(torch.rand(1, 3, 64, 200))


def test_registry_builds_both_from_their_yaml(cache: Path, niqe: NIQE) -> None:
    built = build_metric("niqe_fitted", cache_dir=str(cache))
    assert isinstance(built, NIQE) and not built.higher_better
    assert torch.equal(built.mu, niqe.mu)
    with pytest.raises(AdvbenchError, match="not found"):
        build_metric("cnnqa", weights=str(cache / "missing.pt"))
