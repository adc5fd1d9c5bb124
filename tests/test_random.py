"""The per-sample counter-based generator: range, distribution, and batch independence."""

from __future__ import annotations

import pytest
import torch

from advbench.core.sample_draws import normal, uniform

IDS = torch.arange(2000)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64])
def test_uniform_lies_in_the_unit_interval(dtype: torch.dtype) -> None:
    u = uniform(3, IDS, (4, 8), stream=0, dtype=dtype)
    assert u.shape == (2000, 4, 8) and u.dtype == dtype
    assert (u >= 0).all() and (u < 1).all()


def test_uniform_moments_and_histogram() -> None:
    u = uniform(0, IDS, (50,), stream=7, dtype=torch.float64)
    assert abs(u.mean().item() - 0.5) < 0.005
    assert abs(u.var().item() - 1 / 12) < 0.002
    counts = torch.histc(u, bins=20, min=0, max=1)
    expected = u.numel() / 20
    chi2 = (((counts - expected) ** 2) / expected).sum().item()
    assert chi2 < 50, "19 degrees of freedom: 50 is far beyond the 99.9% quantile"


def test_draws_are_uncorrelated_across_elements_samples_and_streams() -> None:
    u = uniform(0, IDS, (64,), stream=0, dtype=torch.float64) - 0.5
    v = uniform(0, IDS, (64,), stream=1, dtype=torch.float64) - 0.5
    corr = lambda a, b: ((a * b).mean() / (a.std() * b.std())).item()  # noqa: E731
    assert abs(corr(u[:, :-1], u[:, 1:])) < 0.02      # neighbouring elements
    assert abs(corr(u[:-1], u[1:])) < 0.02            # neighbouring sample ids
    assert abs(corr(u, v)) < 0.02                     # two streams of one sample


def test_normal_moments() -> None:
    z = normal(1, IDS, (3, 10), stream=0, dtype=torch.float64)
    assert torch.isfinite(z).all()
    assert abs(z.mean().item()) < 0.02
    assert abs(z.std().item() - 1) < 0.02
    assert abs((z ** 3).mean().item()) < 0.06
    assert abs((z ** 4).mean().item() - 3) < 0.15


@pytest.mark.parametrize("draw", [uniform, normal])
def test_a_sample_draws_the_same_numbers_in_any_batch(draw) -> None:
    big = draw(5, IDS[:64], (3, 4, 4), stream=2)
    perm = torch.randperm(64, generator=torch.Generator().manual_seed(0))[:7]
    small = draw(5, IDS[perm], (3, 4, 4), stream=2)
    assert torch.equal(small, big[perm])
    assert torch.equal(draw(5, IDS[perm[:1]], (3, 4, 4), stream=2), big[perm[:1]])


@pytest.mark.parametrize("draw", [uniform, normal])
def test_seed_stream_and_sample_change_the_numbers(draw) -> None:
    base = draw(0, IDS[:8], (16,), stream=0)
    assert not torch.equal(base, draw(1, IDS[:8], (16,), stream=0))
    assert not torch.equal(base, draw(0, IDS[:8], (16,), stream=1))
    assert not torch.equal(base, draw(0, IDS[8:16], (16,), stream=0))
    assert torch.equal(base, draw(0, IDS[:8], (16,), stream=0))
    assert len(torch.unique(base)) == base.numel()


def test_uniform_and_normal_are_separate_domains() -> None:
    u = uniform(0, IDS[:100], (32,), stream=0, dtype=torch.float64)
    z = normal(0, IDS[:100], (32,), stream=0, dtype=torch.float64)
    phi = 0.5 * (1 + torch.erf(z / 2 ** 0.5))
    assert abs(torch.corrcoef(torch.stack([u.flatten(), phi.flatten()]))[0, 1].item()) < 0.05
