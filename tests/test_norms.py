"""The norm objects: projections into the ball and the box, distances, duals, the registry's refusals,
and that no module outside core/norms.py compares a norm's name."""

from __future__ import annotations

import ast
import itertools
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.optimize import minimize

from advbench.core.errors import AdvbenchError
from advbench.core.norms import names, norm
from advbench.core.steps import project
from advbench.robustness.threat import ThreatModel

PACKAGE = Path(__file__).resolve().parents[1] / "advbench"
BOUNDS = (0.0, 1.0)


def _batch(seed: int, n: int = 6, d: int = 12, spread: float = 0.8) -> tuple[torch.Tensor, torch.Tensor]:
    """Clean points with some pixels at the box's faces, and perturbed points far outside the box."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 1, d, generator=g, dtype=torch.float64)
    x[:, :, :3] = torch.tensor([0.0, 1.0, 0.999], dtype=torch.float64)
    return x, x + spread * torch.randn(n, 1, d, generator=g, dtype=torch.float64)


@pytest.mark.parametrize("name", names())
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_projection_lands_in_the_ball_and_the_box_and_is_idempotent(name: str, seed: int) -> None:
    ball = norm(name)
    x, x_adv = _batch(seed)
    eps = torch.tensor([0.01, 0.1, 0.5, 1.0, 3.0, 50.0], dtype=torch.float64)
    p = ball.project(x_adv, x, eps, BOUNDS)
    assert (ball.distance(p, x) <= eps * (1 + 1e-9)).all()
    assert p.min() >= 0 and p.max() <= 1
    torch.testing.assert_close(ball.project(p, x, eps, BOUNDS), p, rtol=0, atol=1e-12)


def _l1_reference(y: np.ndarray, x0: np.ndarray, eps: float) -> np.ndarray:
    """argmin ‖z − y‖² over ‖z − x0‖₁ ≤ ε, 0 ≤ z ≤ 1 by a general solver: z = x0 + p − q, p, q ≥ 0."""
    d = y.size

    def objective(v: np.ndarray) -> float:
        return float(((x0 + v[:d] - v[d:] - y) ** 2).sum())

    constraints = [{"type": "ineq", "fun": lambda v: eps - v.sum()},
                   {"type": "ineq", "fun": lambda v: x0 + v[:d] - v[d:]},
                   {"type": "ineq", "fun": lambda v: 1 - (x0 + v[:d] - v[d:])}]
    res = minimize(objective, np.zeros(2 * d), bounds=[(0, None)] * (2 * d), constraints=constraints,
                   method="SLSQP", options={"ftol": 1e-15, "maxiter": 1000})
    return x0 + res.x[:d] - res.x[d:]


@pytest.mark.parametrize("seed", range(4))
def test_l1_projection_is_the_euclidean_projection_onto_ball_and_box(seed: int) -> None:
    x, x_adv = _batch(seed, n=4, d=6)
    eps = torch.tensor([0.2, 0.7, 1.5, 40.0], dtype=torch.float64)
    got = norm("l1").project(x_adv, x, eps, BOUNDS)
    for i in range(4):
        y, x0 = x_adv[i].flatten().numpy(), x[i].flatten().numpy()
        want = _l1_reference(y, x0, float(eps[i]))
        assert ((got[i].flatten().numpy() - y) ** 2).sum() <= ((want - y) ** 2).sum() + 1e-8
        np.testing.assert_allclose(got[i].flatten().numpy(), want, atol=1e-4)
    saturated = (got == 0) | (got == 1)
    assert bool(saturated[:, :, :2].any()), "the box must bind on some coordinates for the case to test it"


def test_l1_ball_projection_is_exact_not_a_rescaling() -> None:
    """steps.project took 'l1' and rescaled δ onto the sphere, which is not the nearest point of the ball."""
    x = torch.zeros(1, 3, dtype=torch.float64)
    x_adv = torch.tensor([[3.0, 1.0, 0.5]], dtype=torch.float64)
    got = project(x_adv, x, torch.tensor([1.0], dtype=torch.float64), "l1")
    torch.testing.assert_close(got, torch.tensor([[1.0, 0.0, 0.0]], dtype=torch.float64))


@pytest.mark.parametrize("name", ["linf", "l2", "l1"])
def test_distance_is_torch_linalg_norm(name: str) -> None:
    ball = norm(name)
    x, x_adv = _batch(3)
    want = torch.linalg.vector_norm((x_adv - x).flatten(1), ord=ball.p, dim=1)
    torch.testing.assert_close(ball.distance(x_adv, x), want)


@pytest.mark.parametrize(("name", "dual"), [("linf", "l1"), ("l2", "l2"), ("l1", "linf")])
def test_dual_norms_and_hoelder(name: str, dual: str) -> None:
    ball = norm(name)
    assert ball.dual is norm(dual) and ball.dual.dual is ball
    g, delta = _batch(4)
    bound = ball.dual.size(g) * ball.size(delta)
    assert ((g * delta).flatten(1).sum(1).abs() <= bound * (1 + 1e-12)).all()


@pytest.mark.parametrize("name", ["linf", "l2", "l1"])
def test_steepest_ascent_direction_attains_the_dual_norm(name: str) -> None:
    ball = norm(name)
    g, _ = _batch(5)
    d = ball.direction(g)
    torch.testing.assert_close(ball.size(d), torch.ones(g.shape[0], dtype=g.dtype))
    torch.testing.assert_close((g * d).flatten(1).sum(1), ball.dual.size(g))


def test_l1_sparse_direction_moves_the_largest_coordinates_by_equal_shares() -> None:
    g = torch.tensor([[0.1, -4.0, 2.0, -0.5, 3.0, 0.0, 1.0, -2.5, 0.2, 0.3]])
    for share, moved in ((0.0, [1]), (0.25, [1, 4, 7]), (0.45, [1, 2, 4, 6, 7])):
        d = norm("l1").sparse_direction(g, torch.tensor([share]))
        want = torch.zeros_like(g)
        want[0, moved] = g[0, moved].sign() / len(moved)
        torch.testing.assert_close(d, want)
    everything = norm("l1").sparse_direction(g, torch.tensor([1.0]))   # the zero coordinate cannot move
    assert int((everything != 0).sum()) == 9 and float(everything.abs().sum()) == pytest.approx(1.0)


@pytest.mark.parametrize("name", ["linf", "l2"])
def test_dense_norms_take_no_sparse_steps(name: str) -> None:
    assert not norm(name).sparse_steps and norm("l1").sparse_steps
    with pytest.raises(AdvbenchError) as err:
        norm(name).sparse_direction(torch.ones(1, 3), torch.ones(1))
    assert "\n" not in str(err.value)


def test_l1_random_start_is_uniform_in_the_ball_and_in_the_box() -> None:
    """E‖δ‖₁/ε = d/(d + 1) for the uniform ball; every coordinate's sign is a coin; the clip to the box only shrinks."""
    n, d = 4000, 5
    x = torch.full((n, d), 0.5, dtype=torch.float64)
    eps = torch.full((n,), 0.4, dtype=torch.float64)
    start = norm("l1").random_start(x, eps, BOUNDS, seed=3, sample_id=torch.arange(n))
    r = norm("l1").distance(start, x) / eps
    assert float(r.max()) <= 1 + 1e-12
    assert float(r.mean()) == pytest.approx(d / (d + 1), abs=0.01)
    assert float(((start - x) > 0).double().mean()) == pytest.approx(0.5, abs=0.02)
    again = norm("l1").random_start(x[:7], eps[:7] * 2, BOUNDS, seed=3, sample_id=torch.arange(7))
    torch.testing.assert_close(again - x[:7], 2 * (start[:7] - x[:7]))   # the draw rescaled by ε
    edge = norm("l1").random_start(torch.ones(50, d), torch.full((50,), 3.0), BOUNDS, seed=0, sample_id=torch.arange(50))
    assert float(edge.max()) <= 1.0 and float(edge.min()) >= 0.0


def test_l1_sphere_start_spends_the_budget_within_the_box() -> None:
    x, _ = _batch(6, n=5, d=40)
    eps = torch.tensor([0.5, 1.0, 2.0, 4.0, 8.0], dtype=torch.float64)
    start = norm("l1").sphere_start(x, eps, BOUNDS, seed=1, sample_id=torch.arange(5))
    torch.testing.assert_close(norm("l1").distance(start, x), eps)
    assert start.min() >= 0 and start.max() <= 1


def _images(seed: int, n: int = 5, c: int = 3, side: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, C, H, W) clean images with some values at the box's faces, and perturbed ones partly outside it."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, c, side, side, generator=g, dtype=torch.float64)
    x[:, :, 0, :2] = torch.tensor([0.0, 1.0], dtype=torch.float64)
    return x, x + 0.7 * torch.randn(n, c, side, side, generator=g, dtype=torch.float64)


def test_l0_counts_pixels_with_any_channel_changed() -> None:
    x = torch.zeros(2, 3, 2, 2)
    moved = x.clone()
    moved[0, 0, 0, 0] = moved[0, 2, 0, 0] = 0.5      # one pixel, two of its channels
    moved[0, 1, 1, 1] = 1e-7                         # a second pixel, barely
    moved[1] = 1.0                                   # every pixel
    assert norm("l0").distance(moved, x).tolist() == [2.0, 4.0]
    assert norm("l0").size(torch.tensor([[0.0, 2.0, -1.0]])).tolist() == [2.0]   # (N, D): a coordinate a pixel


def _l0_box_reference(y: torch.Tensor, x0: torch.Tensor, k: int) -> torch.Tensor:
    """argmin ‖z − y‖₂ over z in the box changing at most k pixels of x0, by trying every set of k pixels."""
    pixels = x0.shape[-1] * x0.shape[-2]
    best, best_cost = x0, math.inf
    for chosen in itertools.combinations(range(pixels), min(k, pixels)):
        mask = torch.zeros(pixels, dtype=torch.bool)
        mask[list(chosen)] = True
        z = torch.where(mask.reshape(x0.shape[-2:]), y.clamp(0, 1), x0)
        if (cost := float((z - y).square().sum())) < best_cost:
            best, best_cost = z, cost
    return best


@pytest.mark.parametrize("seed", range(3))
def test_l0_projection_is_the_euclidean_projection_onto_k_pixels_and_the_box(seed: int) -> None:
    x, x_adv = _images(seed, n=4)
    eps = torch.tensor([0.0, 1.0, 2.9, 4.0], dtype=torch.float64)        # ⌊ε⌋ pixels: 0, 1, 2, 4
    got = norm("l0").project(x_adv, x, eps, BOUNDS)
    for i, k in enumerate([0, 1, 2, 4]):
        torch.testing.assert_close(got[i], _l0_box_reference(x_adv[i], x[i], k), rtol=0, atol=1e-12)
    assert norm("l0").distance(got, x).tolist() == [0.0, 1.0, 2.0, 4.0]
    assert got.min() >= 0 and got.max() <= 1
    torch.testing.assert_close(norm("l0").project(got, x, eps, BOUNDS), got, rtol=0, atol=0)


def test_l0_projection_weighs_the_box_so_no_kept_pixel_is_wasted() -> None:
    """A change pushing a pixel at 1 further up is the largest but clips to nothing: keeping it, as
    clipping after a plain top-k would, spends the pixel for no change."""
    x = torch.tensor([[[1.0, 0.5, 0.5]]])
    x_adv = torch.tensor([[[3.0, 0.9, 0.6]]])
    got = norm("l0").project(x_adv, x, torch.tensor([1.0]), BOUNDS)
    torch.testing.assert_close(got, torch.tensor([[[1.0, 0.9, 0.5]]]))
    ball = norm("l0").project_ball(x_adv, x, torch.tensor([1.0]))   # without the box: the largest change
    torch.testing.assert_close(ball, torch.tensor([[[3.0, 0.5, 0.5]]]))


def test_l0_ties_keep_exactly_k_pixels() -> None:
    x = torch.zeros(1, 1, 6)
    got = norm("l0").project(torch.full((1, 1, 6), 0.5), x, torch.tensor([2.0]), BOUNDS)
    assert norm("l0").distance(got, x).item() == 2.0


def test_l0_starts_change_k_pixels_within_the_box_drawn_per_sample() -> None:
    n = 3000
    x = torch.full((n, 2, 2, 2), 0.5, dtype=torch.float64)
    eps = torch.full((n,), 2.0, dtype=torch.float64)
    ids = torch.arange(n)
    start = norm("l0").random_start(x, eps, BOUNDS, seed=1, sample_id=ids)
    assert (norm("l0").distance(start, x) == 2).all() and start.min() >= 0 and start.max() <= 1
    share = ((start - x) != 0).any(dim=1).double().mean(dim=0)                # each pixel's chance of a draw
    torch.testing.assert_close(share, torch.full((2, 2), 0.5, dtype=torch.float64), rtol=0, atol=0.03)
    again = norm("l0").random_start(x[5:9], eps[5:9], BOUNDS, seed=1, sample_id=ids[5:9])
    assert torch.equal(again, start[5:9])
    sphere = norm("l0").sphere_start(x, eps, BOUNDS, seed=1, sample_id=ids)
    assert (norm("l0").distance(sphere, x) == 2).all() and sphere.min() >= 0 and sphere.max() <= 1


def test_l0_refuses_what_it_has_no_meaning_for_in_one_line() -> None:
    ball, g = norm("l0"), torch.ones(1, 4)
    for ask in (lambda: ball.dual, lambda: ball.p, lambda: ball.direction(g), lambda: ball.normalized_scale(4),
                lambda: ball.sparse_direction(g, torch.ones(1)),
                lambda: ThreatModel(norm="l0", goal="untargeted", eps=2.5)):
        with pytest.raises(AdvbenchError) as err:
            ask()
        assert "\n" not in str(err.value) and "l0" in str(err.value)
    assert ThreatModel(norm="l0", goal="untargeted", eps=24.0).ball is ball


def test_whole_norms_search_whole_budgets() -> None:
    ball = norm("l0")
    assert ball.search_resolution(0.1) == 1.0 and ball.search_resolution(2.7) == 2.0
    probes = torch.tensor([2.5, 2.5, 3.0, 3.0], dtype=torch.float64)
    assert ball.snap(probes, up=torch.tensor([True, False, True, False])).tolist() == [3.0, 2.0, 3.0, 3.0]
    assert norm("l2").search_resolution(0.1) == 0.1 and torch.equal(norm("l2").snap(probes, up=True), probes)


def test_patch_side_is_the_smallest_square_holding_every_changed_pixel() -> None:
    v = torch.zeros(4, 3, 8, 8)
    v[0, 1, 2, 3] = 0.5                  # one pixel, one channel: side 1
    v[1, 0, 2, 3], v[1, 2, 5, 4] = 1.0, -0.25   # rows 2..5, columns 3..4: side 4 (the taller extent)
    v[2, :, 0, 0], v[2, 0, 1, 7] = 0.1, 0.1      # rows 0..1, columns 0..7: side 8 (the wider extent)
    got = norm("patch").size(v)
    assert got.tolist() == [1.0, 4.0, 8.0, 0.0] and torch.equal(got, got.round())
    # a random change inside a known square of side s has side s where its corners change
    x = torch.rand(5, 3, 12, 12)
    for s in range(1, 6):
        y = x.clone()
        y[:, :, 3:3 + s, 6:6 + s] = torch.rand(5, 3, s, s)
        y[:, 0, 3, 6], y[:, 0, 2 + s, 5 + s] = 2.0, 2.0
        assert norm("patch").distance(y, x).tolist() == [float(s)] * 5


def _nearest_in_one_square(y: torch.Tensor, x: torch.Tensor, side: int) -> torch.Tensor:
    """The projection by brute force: every placement of the square, y clipped inside, x outside."""
    best, h, w = None, x.shape[-2], x.shape[-1]
    for r in range(max(h - side, 0) + 1):
        for c in range(max(w - side, 0) + 1):
            z = x.clone()
            z[..., r:r + side, c:c + side] = y[..., r:r + side, c:c + side].clamp(0, 1)
            if best is None or (z - y).square().sum() < (best - y).square().sum():
                best = z
    return best


@pytest.mark.parametrize("seed", range(3))
def test_patch_projection_is_the_nearest_point_changed_in_one_square_within_the_box(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(4, 2, 7, 6, generator=g, dtype=torch.float64)
    y = x + 0.8 * torch.randn(4, 2, 7, 6, generator=g, dtype=torch.float64)
    eps = torch.tensor([0.5, 2.0, 3.0, 4.9999999], dtype=torch.float64)
    got = norm("patch").project(y, x, eps, BOUNDS)
    for i, side in enumerate((0, 2, 3, 5)):
        want = _nearest_in_one_square(y[i], x[i], side)
        assert float((got[i] - y[i]).square().sum()) <= float((want - y[i]).square().sum()) + 1e-12
        assert float(norm("patch").size((got[i] - x[i])[None])) <= side
    assert got.min() >= 0 and got.max() <= 1


def test_patch_refuses_what_it_has_no_meaning_for_in_one_line() -> None:
    ball, g = norm("patch"), torch.ones(1, 1, 4, 4)
    for ask in (lambda: ball.dual, lambda: ball.p, lambda: ball.direction(g), lambda: ball.normalized_scale(16),
                lambda: ball.sparse_direction(g, torch.ones(1)),
                lambda: ThreatModel(norm="patch", goal="untargeted", eps=2.5, knowledge="score")):
        with pytest.raises(AdvbenchError) as err:
            ask()
        assert "\n" not in str(err.value) and "patch" in str(err.value)
    assert ball.whole and ball.search_resolution(0.2) == 1.0
    assert ThreatModel(norm="patch", goal="untargeted", eps=5.0, knowledge="score").ball is ball


def test_unknown_norm_is_refused_in_one_line() -> None:
    for build in (lambda: norm("l3"), lambda: ThreatModel(norm="l3", goal="untargeted", eps=1.0),
                  lambda: project(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1), "lp")):
        with pytest.raises(AdvbenchError) as err:
            build()
        assert "\n" not in str(err.value) and "unknown norm" in str(err.value)


def test_normalised_budgets_are_refused_for_l1_in_one_line() -> None:
    with pytest.raises(AdvbenchError) as err:
        norm("l1").normalized_scale(4)
    assert "\n" not in str(err.value) and "l1" in str(err.value)


def _name_comparisons(source: str) -> list[int]:
    """Lines comparing (==, !=, in, not in) or indexing with a literal norm name."""
    found = []
    literal = set(names())

    def is_name(node: ast.AST) -> bool:
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return any(is_name(e) for e in node.elts)
        return isinstance(node, ast.Constant) and node.value in literal

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and any(is_name(n) for n in (node.left, *node.comparators)):
            found.append(node.lineno)
        elif isinstance(node, ast.Subscript) and is_name(node.slice):
            found.append(node.lineno)
    return found


def test_no_module_outside_the_norm_classes_compares_a_norm_name() -> None:
    offenders = {str(p.relative_to(PACKAGE)): lines for p in sorted(PACKAGE.rglob("*.py"))
                 if p.name != "norms.py" and (lines := _name_comparisons(p.read_text(encoding="utf-8")))}
    assert not offenders, f"norm names compared outside core/norms.py (use the norm object): {offenders}"


def test_the_name_comparison_finder_finds_them() -> None:
    source = 'if norm == "linf":\n    pass\nok = norm in ("l2", "l1")\nv = d["l2"]\nw = norm is LINF\n'
    assert _name_comparisons(source) == [1, 3, 4]
