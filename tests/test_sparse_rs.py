"""Sparse-RS (Croce et al. 2022) under ℓ0 and patches: what it changes (at most k pixels, each at a corner
of the box; one square of side s), its exact query count, its per-sample draws, and a known optimum.

The optimum: on a linear classifier (logits W x + b) a patch of side s at a place reaches class j when the
most its pixels can add to a_j·δ (each channel to the face a_j points to, as for ℓ0 in
test_known_optimum.py) reaches f_j, so the smallest side is found by trying every side and place
(one pooling per side). Sparse-RS's whole-side minimum-ε search must land never below it and within
one side above it; under ℓ0 the fewest pixels (`l0_box_costs`) are the bar.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from contract import Counting, assert_seeded_and_batch_independent
from test_known_optimum import Linear, half_spaces, l0_box_costs

from advbench.robustness.attacks.oracles import build_oracle
from advbench.robustness.attacks.sparse_rs import PIXEL_SCHEDULE, SparseRS, alpha_at
from advbench.robustness.data.target_classes import target_classes
from advbench.robustness.evaluation.measure import evaluate_batch
from advbench.robustness.specs import SearchSettings
from advbench.robustness.threat import ThreatModel

N = 16


@pytest.fixture(scope="module")
def digits(digits_tensors, one_thread) -> tuple[torch.Tensor, torch.Tensor]:
    _, _, x, y = digits_tensors
    return x[:40], y[:40]


@pytest.mark.parametrize("targeted", [False, True])
def test_l0_changes_at_most_k_pixels_each_at_a_corner_of_the_box(targeted: bool, tiny_model, digits) -> None:
    x, y = digits
    k = torch.arange(len(y)) % 4 + 1
    target = target_classes(torch.arange(len(y)), y, 10, seed=0) if targeted else None
    res = SparseRS(n_queries=200)(build_oracle("score", tiny_model, len(y)), x, y, eps=k.float(), norm="l0", target=target)
    changed = res.x_adv != x
    assert (changed.flatten(1).sum(dim=1) <= k).all()
    assert ((res.x_adv[changed] == 0) | (res.x_adv[changed] == 1)).all(), "a changed pixel sits at a corner"
    assert res.success.any()


def test_queries_are_counted_exactly_and_a_success_stops_its_sample(tiny_model, digits) -> None:
    """Every image the model saw is a counted query; a sample that breaks spent exactly the queries its
    first success counts (the start included); one that does not spent the whole budget."""
    x, y = digits
    for norm in ("l0", "patch"):
        stub = Counting(tiny_model)
        oracle = build_oracle("score", stub, len(y))
        res = SparseRS(n_queries=150)(oracle, x, y, eps=torch.full((len(y),), 2.0), norm=norm, target=None)
        assert stub.rows == int(oracle.queries.sum())
        broke = res.success & (tiny_model(x).argmax(1) == y)
        assert broke.any() and (~res.success).any()
        assert torch.equal(oracle.queries[broke], res.first_success[broke])
        assert (oracle.queries[~res.success] == 150).all()


@pytest.mark.parametrize("norm", ["l0", "patch"])
def test_draws_follow_the_seed_and_the_sample_not_the_batch(norm: str, tiny_model, digits) -> None:
    x, y = digits

    def run(seed: int, rows: torch.Tensor):
        attack = SparseRS(n_queries=100, seed=seed)
        return attack(build_oracle("score", tiny_model, len(rows)), x[rows], y[rows], eps=torch.full((len(rows),), 2.0),
                      norm=norm, target=None, sample_id=rows)

    assert_seeded_and_batch_independent(run, len(y), (0, 7, 21))


def test_alpha_halves_on_the_authors_schedule_stretched_over_the_budget() -> None:
    assert alpha_at(0.3, 0, 10000, PIXEL_SCHEDULE, 20) == 0.3
    assert alpha_at(0.3, 100, 10000, PIXEL_SCHEDULE, 20) == pytest.approx(0.3 / 4)
    assert alpha_at(0.3, 50, 5000, PIXEL_SCHEDULE, 20) == pytest.approx(0.3 / 4)   # 100 on the 10,000 scale
    assert alpha_at(0.3, 9999, 10000, PIXEL_SCHEDULE, 20) == pytest.approx(0.3 / 20)


def patch_costs(model: Linear, x: torch.Tensor) -> torch.Tensor:
    """(N, K): the smallest side of a square whose pixels, moved within [0, 1], reach each class's
    half-space, over every place (inf for the label and where no square can)."""
    y, f, a = half_spaces(model, x)
    xf = x.flatten(1)[:, None, :]
    gain = torch.where(a > 0, a * (1 - xf), -a * xf).reshape(*a.shape[:2], x.shape[1], -1).sum(dim=2)
    n, k = f.shape
    h, w = x.shape[2:]
    gain = gain.reshape(n * k, 1, h, w)
    cost = torch.full((n, k), math.inf, dtype=x.dtype)
    for side in range(max(h, w), 0, -1):   # a side reaches a class when its best place does
        best = (F.avg_pool2d(gain, side, stride=1) * side * side).flatten(1).amax(dim=1).reshape(n, k)
        cost = torch.where(best >= f, float(side), cost)
    return cost.scatter(1, y[:, None], math.inf)


@pytest.fixture(scope="module")
def linear_problem() -> tuple[Linear, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A 10-class linear model on 8×8 inputs pushed towards a class (0.5 ± 0.45·u along the sign of its
    weights), 16 samples whose smallest patch is 2 to 5 pixels wide; the smallest side and fewest pixels."""
    g = torch.Generator().manual_seed(2)
    w = torch.randn(10, 64, generator=g, dtype=torch.float64)
    wide = Linear(w, -w.sum(dim=1) / 2)
    towards = torch.randint(0, 10, (512,), generator=g)
    x = (0.5 + 0.45 * torch.sign(w[towards]) * torch.rand(512, 64, generator=g, dtype=torch.float64)).reshape(-1, 1, 8, 8)
    side = patch_costs(wide, x).amin(dim=1)
    keep = ((side >= 2) & (side <= 5)).nonzero().squeeze(1)[:N]
    assert len(keep) == N
    model = Linear(w.float(), wide.b.float())
    y = model(x[keep].float()).argmax(dim=1)
    assert torch.equal(y, wide(x[keep]).argmax(dim=1))
    return model, x[keep].float(), y, side[keep].float(), l0_box_costs(wide, x[keep]).amin(dim=1).float()


def test_the_smallest_patch_is_the_smallest_side_over_every_place(linear_problem) -> None:
    """At its best place the optimum's square, its pixels at the faces, misclassifies; no square a side
    smaller does, anywhere."""
    model, x, y, side, _ = linear_problem
    for i in range(4):
        s = int(side[i])
        for size, flips in ((s, True), (s - 1, False)):
            hit = False
            for r in range(9 - size):
                for c in range(9 - size):
                    a = model.w - model.w[y[i]]
                    face = (a > 0).float().reshape(10, 1, 8, 8)
                    moved = x[i].expand(10, 1, 8, 8).clone()
                    moved[:, :, r:r + size, c:c + size] = face[:, :, r:r + size, c:c + size]
                    hit |= bool((model(moved).argmax(dim=1) != y[i]).any())
            assert hit == flips


@pytest.mark.parametrize(("norm", "at_least"), [("patch", 6), ("l0", 12)])
def test_sparse_rs_lands_at_or_one_above_the_optimum(norm: str, at_least: int, linear_problem) -> None:
    """The whole-number minimum-ε search over Sparse-RS (1,000 queries a probe): never below the optimum,
    never more than one above, and on it for most samples (measured: patches 8 of 16, ℓ0 15 of 16)."""
    model, x, y, side, pixels = linear_problem
    best = {"patch": side, "l0": pixels}[norm]
    out = evaluate_batch(SparseRS(n_queries=1000), model, x, y, None,
                         ThreatModel(norm=norm, goal="untargeted", eps=3.0, knowledge="score"),
                         SearchSettings(resolution=0.25, max_probes=12))
    found = out["min_eps"].float()
    seen = f"{norm}: found {found.tolist()}, optimum {best.tolist()}"
    print(seen)
    assert torch.equal(found, found.round()) and (found >= best).all(), f"below the optimum: {seen}"
    assert (found <= best + 1).all() and int((found == best).sum()) >= at_least, seen
