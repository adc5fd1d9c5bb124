"""DeepFool and C&W: the minimum-norm contract, their maths, and the known peer bugs.

Minimum-norm attacks return the smallest adversarial example they found (the input itself
where none), whatever the budget; eps only dates `first_success`. C&W runs here with short
schedules (the catalogue's seed settings are exercised by the slow cross-check).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from advbench.core.errors import AdvbenchError
from advbench.core.steps import adam_step, lp_norm
from advbench.robustness.attacks.carlini_wagner import CarliniWagnerL2, ClipBox, next_const
from advbench.robustness.attacks.minimum_norm import DeepFool, goal_margin, max_other
from advbench.robustness.attacks.oracles import TransferOracle, WhiteBoxOracle
from advbench.robustness.data.target_classes import target_classes
from advbench.robustness.evaluation.measure import evaluate_batch
from advbench.robustness.specs import SearchSettings
from advbench.robustness.threat import ThreatModel

pytestmark = pytest.mark.usefixtures("one_thread")

N = 100
BUDGET = {"l2": 0.8, "linf": 0.1}


def fast_cw(**kw) -> CarliniWagnerL2:
    return CarliniWagnerL2(**{"iterations": 30, "binary_search_steps": 4, "stepsize": 0.05, **kw})


def fast_cw_clip(**kw) -> CarliniWagnerL2:
    return fast_cw(box="clip", **kw)


CASES = {
    "deepfool-l2": (DeepFool, "l2"),
    "deepfool-linf": (DeepFool, "linf"),
    "cw-l2": (fast_cw, "l2"),
    "cw-clip-l2": (fast_cw_clip, "l2"),
}


@pytest.fixture(scope="module")
def batch(digits_tensors) -> tuple[torch.Tensor, torch.Tensor]:
    _, _, x, y = digits_tensors
    return x[:N], y[:N]


def attack(case: str, x: torch.Tensor, y: torch.Tensor, model: nn.Module, *, target=None, eps=None, **kw):
    make, norm = CASES[case]
    eps = torch.full((len(y),), BUDGET[norm]) if eps is None else eps
    oracle = WhiteBoxOracle(model, len(y))
    return make(**kw)(oracle, x, y, eps=eps, norm=norm, target=target), oracle


def predict(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return model(x).argmax(dim=1)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("targeted", [False, True])
def test_minimum_norm_contract(case: str, targeted: bool, tiny_model, batch) -> None:
    x, y = batch
    norm = CASES[case][1]
    target = target_classes(torch.arange(N), y, 10, seed=0) if targeted else None
    eps = torch.linspace(0.2, 1.5, N) * BUDGET[norm]
    res, oracle = attack(case, x, y, tiny_model, target=target, eps=eps)

    assert res.x_adv.min() >= 0 and res.x_adv.max() <= 1
    pred = predict(tiny_model, res.x_adv)
    agrees = (pred == target) if targeted else (pred != y)
    assert torch.equal(res.success, agrees), "success must be what the model says on the returned example"
    assert torch.equal(res.x_adv[~res.success], x[~res.success]), "a failure returns the input, not a perturbation"
    d = lp_norm(res.x_adv - x, norm)
    within = res.success & (d <= eps)
    assert torch.equal(res.first_success >= 0, within), "first_success dates exactly the examples within eps"
    assert bool((d[res.success] > eps[res.success]).any()), "eps must not cap a minimum-norm attack"
    assert res.success.float().mean() >= (0.5 if targeted else 0.9)
    assert (oracle.grad_evals > 0).any()


@pytest.mark.parametrize("case", list(CASES))
def test_deterministic_and_batch_size_independent(case: str, tiny_model, batch) -> None:
    x, y = batch
    norm = CASES[case][1]
    eps = torch.full((N,), BUDGET[norm])
    whole, oracle = attack(case, x, y, tiny_model)
    again, _ = attack(case, x, y, tiny_model)
    assert torch.equal(whole.x_adv, again.x_adv) and torch.equal(whole.first_success, again.first_success)

    make = CASES[case][0]
    ids = torch.arange(N)
    split = WhiteBoxOracle(tiny_model, N)
    parts = [make()(split.subset(i), x[i], y[i], eps=eps[i], norm=norm, sample_id=i) for i in (ids[:37], ids[37:])]
    assert torch.allclose(whole.x_adv, torch.cat([p.x_adv for p in parts]), atol=1e-5)
    assert torch.equal(whole.first_success, torch.cat([p.first_success for p in parts]))
    assert torch.equal(oracle.grad_evals, split.grad_evals), "each sample's cost is its own"


@pytest.mark.parametrize("norm", ["l2", "linf"])
def test_deepfool_first_iterations_equal_a_shorter_run(norm: str, tiny_model, batch) -> None:
    """The strength curve from one run: a sample broken by iteration t gets the same example
    from a t-iteration run, and a t-iteration run breaks no other sample."""
    x, y = batch
    eps = torch.full((N,), 1e3)  # every adversarial example is within: first_success = its iteration
    oracle = WhiteBoxOracle(tiny_model, N)
    long = DeepFool(steps=100)(oracle, x, y, eps=eps, norm=norm)
    for t in (1, 3):
        short = DeepFool(steps=t)(WhiteBoxOracle(tiny_model, N), x, y, eps=eps, norm=norm)
        early = long.success & (long.first_success <= t)
        assert 0 < int(early.sum()) < int(long.success.sum())
        assert torch.equal(short.success, early)
        assert torch.equal(short.x_adv[early], long.x_adv[early])
        assert torch.equal(short.first_success, torch.where(early, long.first_success, -1))


class Affine(nn.Module):
    """Logits W·x + b on unbounded-ish inputs: DeepFool's linearisation is exact."""

    bounds = (-1e3, 1e3)

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(3)
        self.lin = nn.Linear(16, 4)
        with torch.no_grad():
            self.lin.weight.copy_(torch.randn(4, 16, generator=g))
            self.lin.bias.copy_(torch.randn(4, generator=g))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x.flatten(1))


@pytest.mark.parametrize("norm", ["l2", "linf"])
def test_deepfool_steps_to_the_nearest_hyperplane(norm: str) -> None:
    """On an affine model one step lands (1 + overshoot)·(|f|/‖w‖_dual + 1e-4) away,
    f and w of the nearest class boundary, ‖·‖_dual = ℓ2 for ℓ2 and ℓ1 for ℓ∞."""
    model = Affine().eval()
    x = torch.randn(50, 1, 4, 4, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        z = model(x)
    y = z.argmax(dim=1)
    w = model.lin.weight.detach()
    diff_w = w[None, :, :] - w[y][:, None, :]                       # (n, classes, d)
    f = z - z.gather(1, y[:, None])
    dual = diff_w.norm(dim=2) if norm == "l2" else diff_w.abs().sum(dim=2)
    dist = (f.abs() / dual).scatter(1, y[:, None], float("inf")).amin(dim=1)
    res = DeepFool(overshoot=0.02)(WhiteBoxOracle(model, 50), x, y, eps=torch.full((50,), 1e3), norm=norm)
    assert res.success.all() and (res.first_success == 1).all()
    assert torch.allclose(lp_norm(res.x_adv - x, norm), 1.02 * (dist + 1e-4), rtol=1e-4)


def test_max_other_is_not_clamped_at_zero_when_all_logits_are_negative() -> None:
    logits = torch.tensor([[-5.0, -1.0, -3.0], [-2.0, -7.0, -0.5]])
    y = torch.tensor([0, 2])
    assert torch.equal(max_other(logits, y), torch.tensor([-1.0, -2.0]))
    assert torch.equal(goal_margin(logits, y, None), torch.tensor([-4.0, 1.5]))
    assert torch.equal(goal_margin(logits, y, torch.tensor([1, 1])), torch.tensor([-2.0, 6.5]))


class Shifted(nn.Module):
    """The same classifier with every logit lowered by a constant: all logits negative."""

    bounds = (0.0, 1.0)

    def __init__(self, model: nn.Module, shift: float) -> None:
        super().__init__()
        self.model, self.shift = model, shift

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x) - self.shift


def test_cw_margin_is_shift_invariant_with_all_negative_logits(tiny_model, batch) -> None:
    """C&W's margin only depends on logit differences. A zero-masked max over the other
    logits reads 0 when they are all negative, so the attack would think every sample
    already adversarial and stop at x."""
    x, y = batch
    shifted = Shifted(tiny_model, 60.0)
    with torch.no_grad():
        assert (shifted(x) < 0).all()
    plain, _ = attack("cw-l2", x, y, tiny_model)
    moved, _ = attack("cw-l2", x, y, shifted)
    assert torch.equal(plain.success, moved.success)
    assert torch.allclose(lp_norm(plain.x_adv - x, "l2"), lp_norm(moved.x_adv - x, "l2"), rtol=1e-2, atol=1e-3)


def test_next_const_decreases_after_a_success_and_increases_after_a_failure() -> None:
    c = torch.tensor([1.0, 1.0, 4.0, 4.0], dtype=torch.float64)
    lo = torch.tensor([0.0, 0.0, 2.0, 2.0], dtype=torch.float64)
    hi = torch.tensor([float("inf"), float("inf"), 8.0, 8.0], dtype=torch.float64)
    found = torch.tensor([True, False, True, False])
    c2, lo2, hi2 = next_const(c, lo, hi, found)
    assert (c2[found] < c[found]).all() and (c2[~found] > c[~found]).all()
    assert c2.tolist() == [0.5, 10.0, 3.0, 6.0]
    assert lo2.tolist() == [0.0, 1.0, 2.0, 4.0] and hi2.tolist() == [1.0, float("inf"), 4.0, 8.0]


class ConstSpy(WhiteBoxOracle):
    """Records, per gradient call, each row's c (the penalty at a margin of exactly 1) and
    whether the row was adversarial."""

    def __init__(self, model: nn.Module, y: torch.Tensor) -> None:
        super().__init__(model, len(y))
        self.y, self.seen = y, []

    def value_and_grad(self, x, objective, idx):
        logits, grad = super().value_and_grad(x, objective, idx)
        unit = torch.zeros_like(logits).scatter(1, self.y[idx][:, None], 1.0)  # margin 1
        self.seen.append((idx, objective(unit).detach(), logits.argmax(dim=1) != self.y[idx]))
        return logits, grad


def test_cw_const_falls_after_a_success_and_rises_after_a_failure(tiny_model, batch) -> None:
    """Read c off the attack's own objective: within one binary-search step a sample keeps its
    c; between steps c must fall if that step found an adversarial example, rise if not."""
    x, y = batch
    spy = ConstSpy(tiny_model, y)
    fast_cw(initial_const=0.05, binary_search_steps=4)(spy, x, y, eps=torch.full((N,), 0.8), norm="l2")
    phases: dict[int, list[tuple[float, bool]]] = {}
    for idx, c, adv in spy.seen:
        for i, ci, ai in zip(idx.tolist(), c.tolist(), adv.tolist()):
            seq = phases.setdefault(i, [])
            if seq and seq[-1][0] == ci:
                seq[-1] = (ci, seq[-1][1] or ai)
            else:
                seq.append((ci, ai))
    rises = falls = 0
    for seq in phases.values():
        for (c0, found), (c1, _) in zip(seq, seq[1:]):
            assert (c1 < c0) if found else (c1 > c0), f"c went {c0} -> {c1} after {'a success' if found else 'a failure'}"
            falls, rises = falls + found, rises + (not found)
    assert rises > 0 and falls > 0
    assert max(len(seq) for seq in phases.values()) == 4


def test_cw_early_abort_saves_steps_per_sample(tiny_model, batch) -> None:
    x, y = batch
    eager, cost_eager = attack("cw-l2", x, y, tiny_model, abort_early=True)
    full, cost_full = attack("cw-l2", x, y, tiny_model, abort_early=False)
    assert float(cost_eager.grad_evals.float().mean()) < 0.8 * float(cost_full.grad_evals.float().mean())
    assert eager.success.float().mean() >= full.success.float().mean() - 0.02


def test_clip_box_passes_the_gradient_inside_the_bounds_ends_included() -> None:
    """A pixel at a bound must be able to move inwards (gradient at the end passes); one the
    step pushed outside is clipped in the objective, so it gets no gradient and costs nothing."""
    x = torch.tensor([0.0, 1.0, 0.5, 0.0, 1.0])
    w = torch.tensor([0.0, 0.0, 0.2, -0.1, 0.3])
    x_model = ClipBox.to_model(w, x, (0.0, 1.0))
    assert torch.equal(x_model, torch.tensor([0.0, 1.0, 0.7, 0.0, 1.0]))
    assert torch.equal(ClipBox.chain(w, x, (0.0, 1.0), torch.full((5,), 2.0)), torch.tensor([2.0, 2.0, 2.0, 0.0, 0.0]))
    assert torch.equal(ClipBox.start(x, (0.0, 1.0)), torch.zeros(5))


def test_cw_clip_box_moves_saturated_pixels_and_finds_smaller_examples(tiny_model, batch) -> None:
    """On digits most pixels sit at 0 or 1. The tanh box starts them where tanh' ≈ 1e-6, so
    they stay put and C&W must go around them; the clipped box moves them like any other."""
    x, y = batch[0][:64], batch[1][:64]
    eps = torch.full((64,), 0.8)
    runs = {box: fast_cw(iterations=25, box=box)(WhiteBoxOracle(tiny_model, 64), x, y, eps=eps, norm="l2")
            for box in ("tanh", "clip")}
    saturated = (x == 0) | (x == 1)
    delta = {box: res.x_adv - x for box, res in runs.items()}
    assert float(delta["tanh"][saturated].abs().max()) < 1e-3
    energy = float((delta["clip"] ** 2)[saturated].sum() / (delta["clip"] ** 2).sum())
    assert energy > 0.2, f"the clipped box put only {energy:.1%} of its perturbation on saturated pixels"
    median = {box: float(torch.where(res.success, lp_norm(delta[box], "l2"), torch.tensor(float("inf"))).median())
              for box, res in runs.items()}
    assert runs["clip"].success.all() and median["clip"] < 0.95 * median["tanh"], median


def test_cw_rejects_an_unknown_box() -> None:
    with pytest.raises(AdvbenchError, match="unknown box 'sigmoid'; valid: tanh, clip"):
        CarliniWagnerL2(box="sigmoid")


def test_cw_is_l2_only(tiny_model, batch) -> None:
    x, y = batch
    with pytest.raises(AdvbenchError, match="norms"):
        fast_cw()(WhiteBoxOracle(tiny_model, N), x, y, eps=torch.full((N,), 0.1), norm="linf")


def test_adam_step_matches_torch_adam() -> None:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(3, 5, generator=g)
    ours, m, v = w.clone(), torch.zeros_like(w), torch.zeros_like(w)
    ref = w.clone().requires_grad_(True)
    opt = torch.optim.Adam([ref], lr=0.01)
    for t in range(1, 6):
        grad = torch.randn(3, 5, generator=g)
        ours -= adam_step(grad, m, v, t, 0.01)
        ref.grad = grad.clone()
        opt.step()
    assert torch.allclose(ours, ref.detach(), atol=1e-7)


def test_engine_takes_min_eps_from_the_norm_and_inf_for_failures(tiny_model, batch) -> None:
    """One run gives min_eps: the found example's norm, inf (never 0) where none was found."""
    x, y = batch
    threat = ThreatModel(norm="l2", goal="untargeted", eps=0.5)
    out = evaluate_batch(DeepFool(steps=2), tiny_model, x, y, None, threat, SearchSettings())
    assert out["min_eps_source"] == "norm"
    clean_ok = out["clean_pred"] == y
    failed = torch.isinf(out["min_eps"])
    assert 0 < int(failed.sum()) < N and not bool((out["min_eps"][clean_ok] == 0).any())
    assert torch.equal(out["success_at_budget"], out["min_eps"] <= 0.5)
    assert (out["adv_pred"][failed] == y[failed]).all()


class AlwaysZero(nn.Module):
    """A target that predicts class 0 whatever the input."""

    bounds = (0.0, 1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.zeros(x.shape[0], 10).index_fill(1, torch.tensor([0]), 1.0)


@pytest.mark.parametrize("case", list(CASES))
def test_transfer_counts_only_what_the_target_says(case: str, tiny_model, batch) -> None:
    """Under transfer knowledge the attack optimises on the substitute and an example counts
    once the target's top-1 (a counted query) meets the goal. With the substitute as target
    that is the white-box run; a target that always says 0 is fooled, at x itself, exactly
    on the samples labelled otherwise."""
    x, y = batch
    make, norm = CASES[case]
    eps = torch.full((N,), BUDGET[norm])
    white = make()(WhiteBoxOracle(tiny_model, N), x, y, eps=eps, norm=norm)
    same = TransferOracle(Shifted(tiny_model, 3.0), N, substitute=tiny_model)
    res = make()(same, x, y, eps=eps, norm=norm)
    assert torch.equal(res.success, white.success) and torch.allclose(res.x_adv, white.x_adv, atol=1e-6)
    assert (same.queries > 0).all()

    zero = make()(TransferOracle(AlwaysZero(), N, substitute=tiny_model), x, y, eps=eps, norm=norm)
    assert torch.equal(zero.success, y != 0) and torch.equal(zero.x_adv, x)
    assert torch.equal(zero.first_success, torch.where(y != 0, 0, -1))
