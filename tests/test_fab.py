"""FAB and FAB-T: what is their own beyond the catalogue's contract (tests/test_attacks.py).

The projections onto a hyperplane within the box are the exact minimisers (against an LP for ℓ∞ and
ℓ1 and an enumeration of active sets for ℓ2); the returned norm is the smallest adversarial iterate seen;
gradients are counted as declared (K − 1 an iteration untargeted, 1 for FAB-T, runs only on the
samples still robust); bad settings are one-line errors. The cross-check against torchattacks' FAB
is in tests/test_crosscheck_fab.py (slow).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from scipy.optimize import linprog
from test_ddn import predict
from test_minimum_norm import AlwaysZero, Shifted

from advbench.core.errors import AdvbenchError
from advbench.core.steps import lp_norm
from advbench.robustness.attacks.fab import FAB
from advbench.robustness.attacks.hyperplane import project_l1, project_l2, project_linf
from advbench.robustness.attacks.oracles import TransferOracle, WhiteBoxOracle
from advbench.robustness.attacks.starts import boundary_start, fab_start
from advbench.robustness.data.target_classes import target_classes

pytestmark = pytest.mark.usefixtures("one_thread")

N = 60
BOUNDS = (0.1, 0.9)


class Watched(WhiteBoxOracle):
    """A white-box oracle that keeps the `norm` of every iterate its verdict called adversarial."""

    def __init__(self, model, x: torch.Tensor, norm: str) -> None:
        super().__init__(model, x.shape[0])
        self.x, self.norm = x, norm
        self.seen: list[tuple[torch.Tensor, torch.Tensor]] = []  # (batch rows, norms) of adversarial iterates

    def verdict(self, x, y, target, idx, logits=None, undated=None):
        met = super().verdict(x, y, target, idx, logits, undated)
        self.seen.append((idx[met], lp_norm(x[met] - self.x[idx[met]], self.norm)))
        return met


@pytest.fixture(scope="module")
def batch(digits_tensors) -> tuple[torch.Tensor, torch.Tensor]:
    _, _, x, y = digits_tensors
    return x[:N], y[:N]


def problems(n: int = 120, d: int = 5) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random points in the box, hyperplanes with some zero weights, some out of the box's reach."""
    g = torch.Generator().manual_seed(0)
    lo, hi = BOUNDS
    t = lo + (hi - lo) * torch.rand(n, d, generator=g, dtype=torch.float64)
    w = torch.randn(n, d, generator=g, dtype=torch.float64)
    w[torch.rand(n, d, generator=g) < 0.15] = 0
    b = (w * t).sum(1) + torch.randn(n, generator=g, dtype=torch.float64) * 0.6
    return t, w, b


def smallest_l2(t: np.ndarray, w: np.ndarray, b: float) -> float | None:
    """Brute force: every coordinate free, at its lower or at its upper bound; the free ones solve the
    hyperplane along w; the smallest feasible step. None where no step reaches the hyperplane."""
    lo, hi = BOUNDS
    best = None
    for pattern in itertools.product(range(3), repeat=len(t)):
        p = np.array(pattern)
        d = np.where(p == 1, lo - t, np.where(p == 2, hi - t, 0.0))
        free = p == 0
        rest, q = b - w @ (t + d), (w[free] ** 2).sum()
        if q == 0 and abs(rest) > 1e-12:
            continue
        d[free] = (rest / q if q else 0.0) * w[free]
        if (t + d >= lo - 1e-12).all() and (t + d <= hi + 1e-12).all():
            best = min(best, float(np.linalg.norm(d))) if best is not None else float(np.linalg.norm(d))
    return best


def smallest_linf(t: np.ndarray, w: np.ndarray, b: float) -> float | None:
    """The LP min ρ s.t. |δ_i| ≤ ρ, w·(t + δ) = b, t + δ in the box; None where infeasible."""
    d = len(t)
    lo, hi = BOUNDS
    a_ub = np.r_[np.c_[np.eye(d), -np.ones(d)], np.c_[-np.eye(d), -np.ones(d)]]
    res = linprog(np.r_[np.zeros(d), 1.0], A_ub=a_ub, b_ub=np.zeros(2 * d), A_eq=np.r_[w, 0.0][None],
                  b_eq=[b - w @ t], bounds=[(lo - v, hi - v) for v in t] + [(0, None)])
    return float(res.x[-1]) if res.status == 0 else None


def smallest_l1(t: np.ndarray, w: np.ndarray, b: float) -> float | None:
    """The LP min Σ u_i s.t. |δ_i| ≤ u_i, w·(t + δ) = b, t + δ in the box; None where infeasible."""
    d = len(t)
    lo, hi = BOUNDS
    a_ub = np.r_[np.c_[np.eye(d), -np.eye(d)], np.c_[-np.eye(d), -np.eye(d)]]
    res = linprog(np.r_[np.zeros(d), np.ones(d)], A_ub=a_ub, b_ub=np.zeros(2 * d), A_eq=np.r_[w, np.zeros(d)][None],
                  b_eq=[b - w @ t], bounds=[(lo - v, hi - v) for v in t] + [(0, None)] * d)
    return float(res.fun) if res.status == 0 else None


PROJECTIONS = {"linf": (project_linf, smallest_linf), "l2": (project_l2, smallest_l2), "l1": (project_l1, smallest_l1)}


@pytest.mark.parametrize("norm", sorted(PROJECTIONS))
def test_projection_is_the_smallest_step_onto_the_hyperplane_in_the_box(norm: str) -> None:
    t, w, b = problems()
    project, reference = PROJECTIONS[norm]
    step = project(t, w, b, BOUNDS)
    lo, hi = BOUNDS
    assert ((t + step) >= lo - 1e-12).all() and ((t + step) <= hi + 1e-12).all()
    assert (step[w == 0] == 0).all()
    infeasible = 0
    for i in range(t.shape[0]):
        want = reference(t[i].numpy(), w[i].numpy(), float(b[i]))
        if want is None:  # out of reach: the box point of most progress towards the hyperplane
            infeasible += 1
            ahead = torch.sign(b[i] - w[i] @ t[i]) * w[i]
            corner = torch.where(ahead > 0, hi - t[i], torch.where(ahead < 0, lo - t[i], torch.zeros_like(t[i])))
            assert torch.allclose(step[i], corner * (ahead != 0), atol=1e-7)
            continue
        assert float(w[i] @ (t[i] + step[i])) == pytest.approx(float(b[i]), abs=1e-7)
        assert float(lp_norm(step[i:i + 1], norm)) == pytest.approx(want, abs=1e-7)
    assert 0 < infeasible < t.shape[0] // 2, "the problems include some the box cannot reach, not most"


@pytest.mark.parametrize("norm", sorted(PROJECTIONS))
def test_projection_onto_a_hyperplane_through_the_point_is_no_step(norm: str) -> None:
    t, w, _ = problems(8, 30)
    step = PROJECTIONS[norm][0](t, w, (w * t).sum(1), BOUNDS)
    assert torch.allclose(step, torch.zeros_like(step), atol=1e-7)


def test_restart_starts_are_the_originals() -> None:
    """ℓ∞ and ℓ2: APGD's sphere start to the bit (a uniform or Gaussian draw rescaled); ℓ1: a Gaussian
    rescaled to ℓ1 norm r, every coordinate moved, where APGD-ℓ1's projected Gaussian keeps a few."""
    x, r, ids = torch.full((4, 1, 8, 8), 0.5), torch.tensor([0.1, 0.2, 0.3, 0.4]), torch.arange(4)
    draw = {"seed": 0, "sample_id": ids, "stream": 1}
    for norm in ("linf", "l2"):
        assert torch.equal(fab_start(x, r, norm, (0.0, 1.0), **draw), boundary_start(x, r, norm, (0.0, 1.0), **draw))
    dense, sparse = fab_start(x, r, "l1", (0.0, 1.0), **draw) - x, boundary_start(x, r, "l1", (0.0, 1.0), **draw) - x
    assert torch.allclose(lp_norm(dense, "l1"), r, rtol=1e-5) and torch.allclose(lp_norm(sparse, "l1"), r, rtol=1e-5)
    assert ((dense != 0).flatten(1).sum(1) == 64).all() and ((sparse != 0).flatten(1).sum(1) < 8).all()


@pytest.mark.parametrize("norm,targeted", [("linf", False), ("l2", False), ("l2", True), ("l1", False)])
def test_returned_norm_is_the_smallest_adversarial_iterate_seen(norm: str, targeted: bool, tiny_model, batch) -> None:
    x, y = batch
    target = target_classes(torch.arange(N), y, 10, seed=0) if targeted else None
    oracle = Watched(tiny_model, x, norm)
    res = FAB(n_iter=15)(oracle, x, y, eps=torch.full((N,), 1e3), norm=norm, target=target)
    smallest = torch.full((N,), math.inf)
    for rows, seen in oracle.seen:
        smallest[rows] = torch.minimum(smallest[rows], seen)
    returned = torch.where(res.success, lp_norm(res.x_adv - x, norm), torch.full((N,), math.inf))
    assert torch.equal(torch.isfinite(smallest), res.success) and res.success.float().mean() > 0.9
    assert torch.allclose(returned, smallest, rtol=1e-5), "the returned norm exceeds an example found earlier"
    pred = predict(tiny_model, res.x_adv)
    assert torch.equal(res.success, (pred == target) if targeted else (pred != y))


def test_gradients_counted_as_declared(tiny_model, batch) -> None:
    """Untargeted: K − 1 gradients an iteration; FAB-T: one, and a target class only for samples
    without an example within ε yet; none for a sample adversarial at its input."""
    x, y = batch
    clean_wrong = predict(tiny_model, x) != y
    assert clean_wrong.any() and not clean_wrong.all()
    oracle = WhiteBoxOracle(tiny_model, N)
    FAB(n_iter=7, final_search=0)(oracle, x, y, eps=torch.full((N,), 0.1), norm="linf")
    assert torch.equal(oracle.grad_evals, torch.where(clean_wrong, 0, 7 * 9))
    assert torch.equal(oracle.queries, torch.where(clean_wrong, 1, 1 + 7))
    oracle = WhiteBoxOracle(tiny_model, N)
    eps = torch.full((N,), 0.05)
    res = FAB(n_iter=7, n_target_classes=3)(oracle, x, y, eps=eps, norm="linf")
    runs = torch.where(res.first_success > 0, (res.first_success - 1) // 7 + 1, 3)  # the run that broke it, else all
    assert torch.equal(oracle.grad_evals, torch.where(clean_wrong, 0, 7 * runs))
    assert (res.first_success <= FAB(n_iter=7, n_target_classes=3).strength_budget).all()


class Rows(torch.nn.Module):
    """The model, counting the rows it forwards."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model, self.rows = model, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.rows += x.shape[0]
        return self.model(x)


def test_an_iteration_forwards_each_sample_once_for_all_its_class_gradients(tiny_model, batch) -> None:
    """One forward of the iterate and one backward of it per class (not the sample replicated per
    class), and the iterate's verdict query: two rows a sample and iteration, beside the clean query."""
    x, y = batch
    model = Rows(tiny_model)
    oracle = WhiteBoxOracle(model, N)
    FAB(n_iter=3, final_search=0)(oracle, x, y, eps=torch.full((N,), 1e-6), norm="linf")
    running = int((predict(tiny_model, x) == y).sum())
    assert model.rows == N + 3 * 2 * running
    assert torch.equal(oracle.grad_evals.sum(), torch.tensor(3 * 9 * running)), "still a gradient a class"


def test_final_search_only_shrinks_the_examples(tiny_model, batch) -> None:
    x, y = batch
    eps = torch.full((N,), 1e3)
    plain = FAB(n_iter=10, final_search=0)(WhiteBoxOracle(tiny_model, N), x, y, eps=eps, norm="l2")
    searched = FAB(n_iter=10, final_search=3)(WhiteBoxOracle(tiny_model, N), x, y, eps=eps, norm="l2")
    before, after = lp_norm(plain.x_adv - x, "l2"), lp_norm(searched.x_adv - x, "l2")
    assert torch.equal(plain.success, searched.success)
    assert (after <= before + 1e-6).all() and (after < before - 1e-4).any()


@pytest.mark.parametrize("norm,eps", [("linf", 0.1), ("l1", 1.0)])
def test_restarts_only_lower_the_norm(norm: str, eps: float, tiny_model, batch) -> None:
    """The first run is the same; the restarts (from random points around the input) go on the samples
    not broken within ε and can only lower their norms."""
    x, y = batch
    eps = torch.full((N,), eps)
    one = FAB(n_iter=10, final_search=0)(WhiteBoxOracle(tiny_model, N), x, y, eps=eps, norm=norm)
    three = FAB(n_iter=10, final_search=0, n_restarts=3)(WhiteBoxOracle(tiny_model, N), x, y, eps=eps, norm=norm)
    d1, d3 = lp_norm(one.x_adv - x, norm), lp_norm(three.x_adv - x, norm)
    assert (three.success >= one.success).all() and (d3[one.success] <= d1[one.success] + 1e-6).all()
    early = one.first_success >= 0
    assert torch.equal(three.first_success[early], one.first_success[early])
    assert (~early & one.success).any()


@pytest.mark.parametrize("n_target_classes", [0, 2])
def test_transfer_counts_only_what_the_target_says(n_target_classes: int, tiny_model, batch) -> None:
    """On the substitute as its own target the transfer run is the white-box one; a target that
    always says 0 is fooled, at x itself, exactly on the samples labelled otherwise."""
    x, y = batch
    eps = torch.full((N,), 0.1)

    def fab(oracle):
        return FAB(n_iter=8, n_target_classes=n_target_classes)(oracle, x, y, eps=eps, norm="linf")

    white = fab(WhiteBoxOracle(tiny_model, N))
    same = TransferOracle(Shifted(tiny_model, 3.0), N, substitute=tiny_model)
    res = fab(same)
    assert torch.equal(res.success, white.success) and torch.allclose(res.x_adv, white.x_adv, atol=1e-6)
    assert (same.queries > 0).all()
    zero = fab(TransferOracle(AlwaysZero(), N, substitute=tiny_model))
    assert torch.equal(zero.success, y != 0) and torch.equal(zero.x_adv, x)


@pytest.mark.parametrize("kwargs", [{"eta": 0.9}, {"beta": 0}, {"alpha_max": 1.5}, {"n_iter": 0},
                                    {"n_target_classes": -1}, {"final_search": 1.5}])
def test_bad_hyperparameters_are_refused_with_one_line(kwargs) -> None:
    with pytest.raises(AdvbenchError) as err:
        FAB(**kwargs)
    assert "\n" not in str(err.value) and next(iter(kwargs)) in str(err.value)


def test_more_target_classes_than_the_model_has_are_refused(tiny_model, batch) -> None:
    x, y = batch
    with pytest.raises(AdvbenchError, match="n_target_classes=10 exceeds the 9 other classes"):
        FAB(n_target_classes=10)(WhiteBoxOracle(tiny_model, N), x, y, eps=torch.full((N,), 0.1), norm="linf")
    assert FAB().unsupported("l0", "white", "untargeted") == "FAB supports norms linf, l2, l1, got 'l0'"
