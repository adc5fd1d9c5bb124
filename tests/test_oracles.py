"""Oracles expose exactly their knowledge level and count cost per sample, through views too."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from advbench.core.errors import AdvbenchError
from advbench.robustness.attacks.attack_contract import Attack, AttackResult
from advbench.robustness.attacks.gradient import BIM
from advbench.robustness.attacks.oracles import (
    ORACLES,
    DecisionOracle,
    ScoreOracle,
    TransferOracle,
    WhiteBoxOracle,
    build_oracle,
)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def batch(digits_tensors):
    _, _, x, y = digits_tensors
    return x[:12], y[:12]


@pytest.fixture(scope="module")
def substitute(tiny_model):
    """Another model with the same interface: the tiny model with its logits scrambled."""
    class Shuffled(torch.nn.Module):
        bounds = (0.0, 1.0)

        def __init__(self) -> None:
            super().__init__()
            self.inner = tiny_model

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.inner(x).roll(1, dims=1)

    return Shuffled().eval()


def test_registry_builds_each_level(tiny_model, substitute) -> None:
    for knowledge, cls in ORACLES.items():
        oracle = build_oracle(knowledge, tiny_model, 5, substitute, num_classes=10)
        assert type(oracle) is cls and oracle.knowledge == knowledge
        assert len(oracle) == 5 and oracle.bounds == (0.0, 1.0) and oracle.num_classes == 10
        assert torch.equal(oracle.grad_evals, torch.zeros(5, dtype=torch.long))
    with pytest.raises(AdvbenchError, match="unknown knowledge level 'grey'"):
        build_oracle("grey", tiny_model, 5)
    with pytest.raises(AdvbenchError, match="substitute"):
        build_oracle("transfer", tiny_model, 5)


def test_white_box_gradient_is_the_cross_entropy_gradient(tiny_model, batch) -> None:
    x, y = batch
    oracle = WhiteBoxOracle(tiny_model, len(y))
    logits, grad = oracle.loss_grad(x, y, False, idx=torch.arange(len(y)))
    xr = x.clone().requires_grad_(True)
    F.cross_entropy(tiny_model(xr), y, reduction="sum").backward()
    assert torch.allclose(grad, xr.grad, atol=1e-6)
    assert logits.grad_fn is None
    _, tgrad = oracle.loss_grad(x, y, True, idx=torch.arange(len(y)))
    assert torch.allclose(tgrad, -grad)
    with pytest.raises(ValueError, match="one loss per sample"):
        oracle.value_and_grad(x, lambda z: z.sum(), idx=torch.arange(len(y)))


def test_counters_count_per_sample_with_repeats(tiny_model, batch) -> None:
    x, y = batch
    oracle = WhiteBoxOracle(tiny_model, len(y))
    idx = torch.tensor([0, 3, 3, 5])
    oracle.logits(x[idx], idx=idx)
    oracle.loss_grad(x[idx], y[idx], False, idx=idx)
    oracle.loss_grad(x[:2], y[:2], False, idx=torch.tensor([0, 1]))
    expected_q = torch.zeros(len(y), dtype=torch.long).index_add_(0, idx, torch.ones(4, dtype=torch.long))
    assert torch.equal(oracle.queries, expected_q)
    assert oracle.grad_evals.tolist()[:6] == [2, 1, 0, 2, 0, 1]
    with pytest.raises(ValueError, match="idx"):
        oracle.logits(x[:3], idx=torch.arange(2))


def test_subset_views_write_through_to_the_parent(tiny_model, batch) -> None:
    x, y = batch
    parent = ScoreOracle(tiny_model, len(y))
    view = parent.subset(torch.tensor([2, 7, 9]))
    inner = view.subset(torch.tensor([2, 0]))              # samples 9 and 2 of the parent
    assert len(view) == 3 and len(inner) == 2
    view.logits(x[[7, 7]], idx=torch.tensor([1, 1]))
    inner.logits(x[[9, 2]], idx=torch.tensor([0, 1]))
    assert parent.queries.tolist() == [0, 0, 1, 0, 0, 0, 0, 2, 0, 1, 0, 0]
    assert view.queries.tolist() == [1, 2, 1]
    assert inner.queries.tolist() == [1, 1]


def test_an_attack_on_a_view_is_counted_per_sample(tiny_model, batch) -> None:
    """BIM on samples 4..11 through a view costs exactly what it costs on its own."""
    x, y = batch
    eps = torch.full((8,), 0.1)
    alone = WhiteBoxOracle(tiny_model, 8)
    BIM(steps=5)(alone, x[4:], y[4:], eps=eps, norm="linf")
    parent = WhiteBoxOracle(tiny_model, len(y))
    BIM(steps=5)(parent.subset(torch.arange(4, 12)), x[4:], y[4:], eps=eps, norm="linf")
    assert torch.equal(parent.grad_evals[4:], alone.grad_evals)
    assert torch.equal(parent.queries[4:], alone.queries)
    assert (parent.grad_evals[:4] == 0).all() and alone.grad_evals.sum() > 8


def test_score_oracle_gives_no_autograd_path(tiny_model, batch) -> None:
    x, y = batch
    oracle = ScoreOracle(tiny_model, len(y))
    xr = x.clone().requires_grad_(True)
    out = oracle.logits(xr, idx=torch.arange(len(y)))
    assert out.grad_fn is None and not out.requires_grad
    assert torch.allclose(out, tiny_model(x))
    with pytest.raises(RuntimeError):
        torch.autograd.grad(out.sum(), xr)
    assert not any(hasattr(oracle, m) for m in ("value_and_grad", "loss_grad", "model", "labels"))
    out += 1.0  # a plain tensor: attacks may modify what they get back


def test_decision_oracle_returns_labels_only(tiny_model, batch) -> None:
    x, y = batch
    oracle = DecisionOracle(tiny_model, len(y))
    labels = oracle.labels(x.clone().requires_grad_(True), idx=torch.arange(len(y)))
    assert labels.dtype == torch.long and labels.shape == y.shape and labels.grad_fn is None
    assert torch.equal(labels, tiny_model(x).argmax(1))
    assert not any(hasattr(oracle, m) for m in ("logits", "value_and_grad", "loss_grad"))
    assert oracle.queries.sum() == len(y) and oracle.grad_evals.sum() == 0


def test_transfer_oracle_crafts_on_the_substitute_and_asks_the_target(tiny_model, substitute, batch) -> None:
    x, y = batch
    oracle = TransferOracle(tiny_model, len(y), substitute=substitute)
    idx = torch.arange(len(y))
    assert torch.allclose(oracle.logits(x, idx=idx), substitute(x))
    _, grad = oracle.loss_grad(x, y, False, idx=idx)
    xr = x.clone().requires_grad_(True)
    F.cross_entropy(substitute(xr), y, reduction="sum").backward()
    assert torch.allclose(grad, xr.grad, atol=1e-6)
    assert torch.equal(oracle.labels(x, idx=idx), tiny_model(x).argmax(1))
    assert oracle.queries.tolist() == [1] * len(y), "only target labels are target queries"
    assert oracle.grad_evals.tolist() == [1] * len(y)


class _Probe(Attack):
    """Returns x untouched; used to check what the base class lets through."""

    knowledge = ("white", "score")
    goals = ("untargeted",)
    strength_budget = 1

    def run(self, oracle, x, y, *, eps, norm, target, sample_id) -> AttackResult:
        self.seen = sample_id
        return AttackResult(x, torch.zeros_like(y, dtype=torch.bool), torch.full_like(y, -1))


def test_attack_call_checks_knowledge_goal_and_batch(tiny_model, batch) -> None:
    x, y = batch
    eps = torch.full((len(y),), 0.1)
    probe = _Probe()
    probe(ScoreOracle(tiny_model, len(y)), x, y, eps=eps, norm="linf")
    assert torch.equal(probe.seen, torch.arange(len(y)))
    with pytest.raises(AdvbenchError, match="needs white/score access, got a decision oracle"):
        probe(DecisionOracle(tiny_model, len(y)), x, y, eps=eps, norm="linf")
    with pytest.raises(AdvbenchError, match="not targeted"):
        probe(ScoreOracle(tiny_model, len(y)), x, y, eps=eps, norm="linf", target=(y + 1) % 10)
    with pytest.raises(ValueError, match="counts cost for 5 samples"):
        probe(ScoreOracle(tiny_model, 5), x, y, eps=eps, norm="linf")
    with pytest.raises(AdvbenchError, match="needs white/transfer access"):
        BIM()(ScoreOracle(tiny_model, len(y)), x, y, eps=eps, norm="linf")


def test_remembered_clean_gradients_are_served_once_evaluated_and_counted_apart(tiny_model, batch) -> None:
    """A probe that starts at the clean input reuses its gradient: same result, one grad_eval less per sample."""
    x, y = batch
    n = len(y)
    eps = torch.full((n,), 0.05)
    fresh = WhiteBoxOracle(tiny_model, n)
    alone = BIM(steps=4)(fresh, x, y, eps=eps, norm="linf")
    oracle = WhiteBoxOracle(tiny_model, n)
    assert oracle.remember_clean(x)
    BIM(steps=4)(oracle, x, y, eps=eps * 2, norm="linf")
    first = oracle.grad_evals.clone()
    assert (oracle.grad_reuses == 0).all()
    view = oracle.subset(torch.arange(n))
    again = BIM(steps=4)(view, x, y, eps=eps, norm="linf")
    assert torch.equal(again.x_adv, alone.x_adv) and torch.equal(again.first_success, alone.first_success)
    assert torch.equal(oracle.grad_evals - first, fresh.grad_evals - 1), "the clean gradient is not evaluated again"
    assert (oracle.grad_reuses == 1).all()
    oracle.loss_grad(x, y, True, idx=torch.arange(n))   # another goal at the same input is a new evaluation
    assert (oracle.grad_reuses == 1).all()


def test_a_randomized_model_remembers_nothing(tiny_model, batch) -> None:
    class Noisy(torch.nn.Module):
        randomized = True

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return tiny_model(x)

    assert not WhiteBoxOracle(Noisy(), len(batch[1])).remember_clean(batch[0])
    assert not ScoreOracle(tiny_model, len(batch[1])).remember_clean(batch[0])


def test_a_model_without_an_autograd_path_gives_zero_gradients() -> None:
    """A non-differentiable step attacked without BPDA masks the gradient; the oracle says so with
    zeros (as `flag_zero_grad` counts it) instead of stopping the cell."""
    class Detached(torch.nn.Module):
        bounds = (0.0, 1.0)
        randomized = False

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.one_hot((x.detach().flatten(1).sum(1) > 1).long(), 2).float()

    x = torch.rand(3, 1, 2, 2)
    oracle = WhiteBoxOracle(Detached(), 3)
    logits, grad = oracle.value_and_grad(x, lambda z: z[:, 0], torch.arange(3))
    assert logits.shape == (3, 2) and torch.equal(grad, torch.zeros_like(x))
    assert oracle.grad_evals.tolist() == [1, 1, 1]
