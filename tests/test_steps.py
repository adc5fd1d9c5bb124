"""Property tests of the shared projection / clipping / step primitives."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from advbench.core.steps import ascend, clip, lp_norm, project, rmsprop_step, unit_direction
from advbench.robustness.attacks.starts import random_start

NORMS = st.sampled_from(["linf", "l2"])


def _batch(seed: int, n: int = 4, shape: tuple[int, ...] = (1, 5, 5)) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.rand((n, *shape), generator=g)
    x_adv = x + (torch.rand((n, *shape), generator=g) - 0.5) * 4 * torch.rand(n, 1, 1, 1, generator=g)
    return x, x_adv


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), norm=NORMS, eps=st.lists(st.floats(0.0, 3.0), min_size=4, max_size=4))
def test_projection_lands_in_ball_and_is_idempotent(seed: int, norm: str, eps: list[float]) -> None:
    x, x_adv = _batch(seed)
    e = torch.tensor(eps)
    p = project(x_adv, x, e, norm)
    assert (lp_norm(p - x, norm) <= e * (1 + 1e-5) + 1e-6).all()
    assert torch.allclose(project(p, x, e, norm), p, atol=1e-6)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), norm=NORMS)
def test_projection_keeps_points_already_inside(seed: int, norm: str) -> None:
    x, x_adv = _batch(seed)
    radius = lp_norm(x_adv - x, norm) + 0.01
    assert torch.allclose(project(x_adv, x, radius, norm), x_adv, atol=1e-6)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), norm=NORMS, eps=st.floats(0.001, 2.0))
def test_clipping_never_increases_the_norm(seed: int, norm: str, eps: float) -> None:
    x, x_adv = _batch(seed)
    e = torch.full((4,), eps)
    inside = project(x_adv, x, e, norm)
    clipped = clip(inside, (0.0, 1.0))
    assert clipped.min() >= 0 and clipped.max() <= 1
    assert (lp_norm(clipped - x, norm) <= lp_norm(inside - x, norm) + 1e-6).all()


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), norm=NORMS, eps=st.floats(0.001, 1.0), alpha=st.floats(0.0, 2.0))
def test_ascend_respects_budget_and_bounds(seed: int, norm: str, eps: float, alpha: float) -> None:
    x, x_adv = _batch(seed)
    e = torch.full((4,), eps)
    start = clip(project(x_adv, x, e, norm), (0.0, 1.0))
    g = torch.randn(x.shape, generator=torch.Generator().manual_seed(seed + 1))
    out = ascend(start, x, unit_direction(g, norm), torch.full((4,), alpha), e, norm, (0.0, 1.0))
    assert out.min() >= 0 and out.max() <= 1
    assert (lp_norm(out - x, norm) <= e * (1 + 1e-5) + 1e-6).all()


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), norm=NORMS)
def test_unit_direction_has_unit_norm(seed: int, norm: str) -> None:
    g = torch.randn(3, 2, 4, 4, generator=torch.Generator().manual_seed(seed))
    n = lp_norm(unit_direction(g, norm), norm)
    assert torch.allclose(n, torch.ones(3), atol=1e-5)


def test_l2_random_start_fills_the_ball_not_the_sphere() -> None:
    x = torch.full((2000, 1, 2, 2), 0.5)
    e = torch.full((2000,), 0.3)
    start = random_start(x, e, "l2", (0.0, 1.0), seed=0, sample_id=torch.arange(2000))
    r = lp_norm(start - x, "l2")
    assert (r <= 0.3 + 1e-6).all()
    # uniform in a 4-d ball: P(r < 0.3·0.5^(1/4)) = 0.5
    assert abs(float((r < 0.3 * 0.5 ** 0.25).float().mean()) - 0.5) < 0.05


def test_linf_random_start_is_uniform_in_the_cube() -> None:
    x = torch.full((4000, 1, 1, 1), 0.5)
    start = random_start(x, torch.full((4000,), 0.2), "linf", (0.0, 1.0), seed=1, sample_id=torch.arange(4000))
    d = (start - x).flatten()
    assert d.abs().max() <= 0.2 + 1e-7
    assert math.isclose(float(d.mean()), 0.0, abs_tol=0.01)
    assert math.isclose(float(d.abs().mean()), 0.1, abs_tol=0.01)


def test_rmsprop_step_is_torchs_rmsprop_with_momentum() -> None:
    """From torch's zero state, three steps move like torch.optim.RMSprop; the step size is per sample."""
    g = torch.Generator().manual_seed(0)
    grads = [torch.randn(3, 2, 4, generator=g) for _ in range(3)]
    lr = torch.tensor([0.1, 0.05, 0.2])
    ours = torch.zeros(3, 2, 4)
    square_avg, buffer = torch.zeros_like(ours), torch.zeros_like(ours)
    theirs = [torch.zeros(2, 4, requires_grad=True) for _ in range(3)]
    opts = [torch.optim.RMSprop([p], lr=float(r), alpha=0.9, eps=1e-8, momentum=0.9) for p, r in zip(theirs, lr)]
    for grad in grads:
        ours -= rmsprop_step(grad, square_avg, buffer, lr, 0.9, 0.9)
        for row, (p, opt) in enumerate(zip(theirs, opts)):
            p.grad = grad[row].clone()
            opt.step()
    assert torch.allclose(ours, torch.stack([p.detach() for p in theirs]), rtol=1e-5, atol=1e-7)
