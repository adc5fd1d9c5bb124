"""Transfer-based attacks: crafted on a substitute, judged on the target, never seeing its logits.

The substitute is the tiny digits net trained with another seed; the target is the session's
`tiny_model`. Everything runs on a few hundred 8x8 digits in seconds.
"""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from advbench.core.errors import AdvbenchError
from advbench.robustness.attacks.gradient import BIM, FGSM, MIM
from advbench.robustness.attacks.oracles import (
    TransferOracle,
    WhiteBoxOracle,
    build_oracle,
)
from advbench.robustness.attacks.transfer import (
    DIM,
    TI,
    diverse_inputs,
    gaussian_kernel,
    smooth,
)
from advbench.robustness.evaluation.measure import evaluate_batch
from advbench.robustness.specs import SearchSettings
from advbench.robustness.threat import ThreatModel

pytestmark = pytest.mark.usefixtures("one_thread")
EPS = 0.2


@pytest.fixture(scope="module")
def batch(digits_tensors):
    _, _, x, y = digits_tensors
    return x[:200], y[:200]


class Spy(nn.Module):
    """Wraps the target: records whether autograd could ever reach it."""

    bounds = (0.0, 1.0)

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.rows = 0
        self.grad_reachable = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.rows += x.shape[0]
        self.grad_reachable |= torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
        return self.inner(x)


# --- the transforms -----------------------------------------------------------------------

def test_diverse_inputs_is_interpolate_then_pad_per_sample() -> None:
    """Each transformed sample is F.interpolate to some rnd in [⌊0.9·s⌋, s] plus a zero pad back to s."""
    x = torch.rand(24, 3, 16, 16)
    out = diverse_inputs(x, prob=1.0, resize_rate=0.8, seed=3, sample_id=torch.arange(24), stream=5)
    sizes = set()
    for i in range(24):
        found = None
        for rnd, top, left in itertools.product(range(12, 17), range(5), range(5)):
            if top > 16 - rnd or left > 16 - rnd:
                continue
            small = F.interpolate(x[i:i + 1], size=(rnd, rnd), mode="bilinear", align_corners=False)
            ref = F.pad(small, (left, 16 - rnd - left, top, 16 - rnd - top))
            if torch.allclose(out[i:i + 1], ref, atol=1e-5):
                found = rnd
                break
        assert found is not None, f"sample {i} is not a resize-and-pad of its input"
        sizes.add(found)
    assert len(sizes) >= 3, "sizes must vary between samples"


def test_diverse_inputs_probability_and_identity() -> None:
    x = torch.rand(400, 1, 8, 8)
    ids = torch.arange(400)
    assert torch.equal(diverse_inputs(x, prob=0.0, resize_rate=0.9, seed=0, sample_id=ids, stream=0), x)
    out = diverse_inputs(x, prob=0.5, resize_rate=0.9, seed=0, sample_id=ids, stream=0)
    changed = (out != x).flatten(1).any(1).float().mean()
    # changed only when drawn (p = 0.5) and the size drawn is below 8 (1 of {7, 8}): about 1/4
    assert 0.15 < float(changed) < 0.35


def test_gaussian_kernel_and_smoothing() -> None:
    k = gaussian_kernel(5, 3.0)
    assert k.shape == (5, 5) and float(k.sum()) == pytest.approx(1.0)
    assert torch.equal(k, k.T) and int(k.argmax()) == 12
    g = torch.zeros(1, 2, 9, 9)
    g[0, 1, 4, 4] = 1.0
    s = smooth(g, k)
    assert s.shape == g.shape and float(s[0, 0].abs().sum()) == 0.0, "channels are smoothed separately"
    assert torch.allclose(s[0, 1, 2:7, 2:7], k.float())


# --- the oracle ----------------------------------------------------------------------------

def test_transfer_oracle_gives_only_substitute_gradients_and_target_labels(tiny_model, substitute, batch) -> None:
    x, y = batch
    spy = Spy(tiny_model)
    oracle = build_oracle("transfer", spy, len(y), substitute)
    ids = torch.arange(len(y))
    logits, grad = oracle.loss_grad(x, y, False, ids)
    xs = x.clone().requires_grad_(True)
    ref, = torch.autograd.grad(F.cross_entropy(substitute(xs), y, reduction="sum"), xs)
    assert torch.allclose(grad, ref, atol=1e-6) and torch.allclose(logits, substitute(x), atol=1e-6)
    assert spy.rows == 0, "gradients and logits come from the substitute only"
    assert torch.equal(oracle.labels(x, ids), tiny_model(x).argmax(1))
    assert spy.rows == len(y) and int(oracle.queries.sum()) == len(y)


@pytest.mark.parametrize("attack", [FGSM(), BIM(steps=10), MIM(steps=10), DIM(), TI(prob=0.5)],
                         ids=lambda a: type(a).__name__)
def test_attacks_never_reach_the_target_except_by_counted_labels(attack, tiny_model, substitute, batch) -> None:
    x, y = batch
    spy = Spy(tiny_model)
    oracle = TransferOracle(spy, len(y), substitute=substitute)
    res = attack(oracle, x, y, eps=torch.full((len(y),), EPS), norm="linf")
    assert not spy.grad_reachable, "the target ran with autograd enabled"
    assert spy.rows == int(oracle.queries.sum()), "every target evaluation is a counted query"
    pred = tiny_model(res.x_adv).argmax(1)
    assert torch.equal(res.success, pred != y), "success is the target's verdict on the returned example"


def test_early_stop_costs_one_label_query_per_checked_iterate(tiny_model, substitute, batch) -> None:
    """Success is checked on the target before each step: queries = first_success + 1 (steps + 1 if never)."""
    x, y = batch
    oracle = TransferOracle(tiny_model, len(y), substitute=substitute)
    res = BIM(steps=10)(oracle, x, y, eps=torch.full((len(y),), EPS), norm="linf")
    steps = torch.where(res.success, res.first_success, torch.full_like(res.first_success, 10))
    assert torch.equal(oracle.queries, steps + 1)
    assert torch.equal(oracle.grad_evals, steps), "one substitute gradient per step taken"


@pytest.mark.parametrize("make", [lambda s: BIM(steps=s), lambda s: DIM(steps=s), lambda s: TI(steps=s, prob=0.5)],
                         ids=["BIM", "DIM", "TI"])
def test_strength_curve_from_one_run_equals_rerunning(make, tiny_model, substitute, batch) -> None:
    """first_success ≤ k after 10 steps ⇔ success of a k-step run: randomness follows (sample, step)."""
    x, y = batch
    eps = torch.full((len(y),), EPS)
    long = make(10)(TransferOracle(tiny_model, len(y), substitute=substitute), x, y, eps=eps, norm="linf")
    short = make(4)(TransferOracle(tiny_model, len(y), substitute=substitute), x, y, eps=eps, norm="linf")
    assert torch.equal((long.first_success >= 0) & (long.first_success <= 4), short.success)


def test_without_early_stop_only_the_last_iterate_is_queried(tiny_model, substitute, batch) -> None:
    x, y = batch
    oracle = TransferOracle(tiny_model, len(y), substitute=substitute)
    res = DIM(early_stop=False)(oracle, x, y, eps=torch.full((len(y),), EPS), norm="linf")
    assert (oracle.queries == 1).all() and (oracle.grad_evals == 10).all()
    assert set(res.first_success.tolist()) <= {-1, 10}


# --- DIM / TI determinism ------------------------------------------------------------------

@pytest.mark.parametrize("make", [DIM, lambda: TI(prob=0.5)], ids=["DIM", "TI"])
@pytest.mark.parametrize("norm", ["linf", "l2"])
def test_dim_ti_deterministic_and_batch_size_independent(make, norm, tiny_model, substitute, batch) -> None:
    x, y = batch
    eps = torch.full((len(y),), EPS if norm == "linf" else 1.0)
    whole = make()(TransferOracle(tiny_model, len(y), substitute=substitute), x, y, eps=eps, norm=norm)
    again = make()(TransferOracle(tiny_model, len(y), substitute=substitute), x, y, eps=eps, norm=norm)
    assert torch.equal(whole.x_adv, again.x_adv)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    parts = []
    for chunk in perm.split(37):
        res = make()(TransferOracle(tiny_model, len(chunk), substitute=substitute), x[chunk], y[chunk],
                     eps=eps[chunk], norm=norm, sample_id=chunk)
        parts.append(res)
    x_adv = torch.empty_like(x)
    first = torch.empty_like(whole.first_success)
    for chunk, res in zip(perm.split(37), parts):
        x_adv[chunk], first[chunk] = res.x_adv, res.first_success
    assert torch.allclose(x_adv, whole.x_adv, atol=1e-5)
    assert torch.equal(first, whole.first_success)
    other_seed = make()
    other_seed.seed = 1
    moved = other_seed(TransferOracle(tiny_model, len(y), substitute=substitute), x, y, eps=eps, norm=norm)
    assert not torch.equal(moved.x_adv, whole.x_adv), "the seed must change the random transforms"


def test_bad_hyperparameters_are_rejected() -> None:
    with pytest.raises(AdvbenchError, match="resize_rate"):
        DIM(resize_rate=1.5)
    with pytest.raises(AdvbenchError, match="prob"):
        DIM(prob=2.0)
    with pytest.raises(AdvbenchError, match="kernel_size"):
        TI(kernel_size=4)


# --- through the engine --------------------------------------------------------------------

def test_transfer_lowers_accuracy_but_less_than_white_box(tiny_model, substitute, digits_tensors) -> None:
    _, _, x, y = digits_tensors
    x, y = x[:300], y[:300]
    off = SearchSettings(enabled=False)
    clean = float((tiny_model(x).argmax(1) == y).float().mean())
    white = ThreatModel(norm="linf", goal="untargeted", eps=EPS, knowledge="white")
    transfer = ThreatModel(norm="linf", goal="untargeted", eps=EPS, knowledge="transfer")
    for attack in (FGSM(), BIM(steps=10), MIM(steps=10), DIM(), TI()):
        w = evaluate_batch(attack, tiny_model, x, y, None, white, off)
        t = evaluate_batch(attack, tiny_model, x, y, None, transfer, off, substitute=substitute)
        acc_w = float((w["adv_pred"] == y).float().mean())
        acc_t = float((t["adv_pred"] == y).float().mean())
        assert acc_w < acc_t < clean - 0.2, f"{type(attack).__name__}: clean {clean:.3f} transfer {acc_t:.3f} white {acc_w:.3f}"
        assert (t["queries"] >= 1).all() and int(t["queries"].sum()) > 0


def test_min_eps_search_crafts_on_the_substitute_and_judges_on_the_target(tiny_model, substitute, batch) -> None:
    x, y = batch
    threat = ThreatModel(norm="linf", goal="untargeted", eps=0.1, knowledge="transfer")
    out = evaluate_batch(DIM(), tiny_model, x, y, None, threat, SearchSettings(), substitute=substitute)
    succ = out["success_at_budget"]
    assert torch.equal(succ, out["min_eps"] <= 0.1), "success at the budget ⇔ min_eps <= budget"
    lo = out["min_eps_lo"]
    assert (torch.isnan(lo) | (lo <= out["min_eps"])).all(), "the bracket is ordered (NaN: no failing probe)"
    found = torch.isfinite(out["min_eps"])
    assert float(found.float().mean()) > float(succ.float().mean()), "probes above the budget find more"
    assert (out["search_grad_evals"] > 0).any() and (out["queries"] > out["grad_evals"] / 10).all()


def test_transfer_without_substitute_is_an_error(tiny_model, batch) -> None:
    x, y = batch
    threat = ThreatModel(norm="linf", goal="untargeted", eps=EPS, knowledge="transfer")
    with pytest.raises(AdvbenchError, match="substitute"):
        evaluate_batch(BIM(), tiny_model, x, y, None, threat, SearchSettings(enabled=False))


def test_white_box_dim_judges_the_untransformed_iterate(tiny_model, batch) -> None:
    """Under a white-box oracle DIM's gradient comes from a transformed input; success must not."""
    x, y = batch
    oracle = WhiteBoxOracle(tiny_model, len(y))
    res = DIM(prob=1.0)(oracle, x, y, eps=torch.full((len(y),), EPS), norm="linf")
    assert torch.equal(res.success, tiny_model(res.x_adv).argmax(1) != y)
