"""EOT passes and the vote's passes stacked into few model calls, each pass drawing what it drew alone.

A randomized model keyed per row (the defense wrappers) gets k passes as k stacked copies of the
rows in one call: `RowCalls` gives the j-th copy of a row the j-th call index, so the means and the
vote are those of k calls of their own (up to the rounding of a larger call). A model on torch's generator keeps one call a
pass: it may draw once a call, which stacked copies would share. On CUDA a call takes as many
copies as its rows allow (`model_draws.STACKED_ON`), on the CPU as many as `CPU_STACK_ELEMENTS`
input elements hold; the tests that stack more turn the CUDA rule on for the CPU.
"""

from __future__ import annotations

import traceback

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from advbench.robustness.attacks import model_draws
from advbench.robustness.attacks.model_draws import RowCalls
from advbench.robustness.attacks.oracles import WhiteBoxOracle
from advbench.robustness.attacks.votes import logits_of, vote
from advbench.robustness.defenses.wrappers import RandomResizePad

pytestmark = pytest.mark.usefixtures("one_thread")

N, PASSES = 12, 6


class Calls(nn.Module):
    """The model, keeping the row count of every call."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model, self.rows = model, []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.rows.append(x.shape[0])
        return self.model(x)


class BatchNoise(nn.Module):
    """A user's randomized model on torch's generator that draws one shift for the whole call."""

    randomized, grad_mode, eot_samples, bounds = True, "eot", PASSES, (0.0, 1.0)

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x + 0.1 * torch.randn(()))


@pytest.fixture()
def stacked_on_the_cpu(monkeypatch) -> None:
    monkeypatch.setattr(model_draws, "STACKED_ON", ("cuda", "cpu"))


@pytest.fixture()
def rows(digits_tensors) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    _, _, x, y = digits_tensors
    return x[:N], y[:N], torch.arange(100, 100 + N)


def one_call_a_pass(model: nn.Module, x: torch.Tensor, y: torch.Tensor, ids: torch.Tensor) -> tuple:
    """The EOT mean of logits and loss gradient over PASSES calls of one pass each, keyed as the oracle keys them."""
    calls = RowCalls(ids)
    logits_sum = grad_sum = None
    for _ in range(PASSES):
        xr = x.clone().requires_grad_(True)
        with calls.pass_of(model, torch.arange(N)):
            logits = model(xr)
        grad = torch.autograd.grad(F.cross_entropy(logits, y, reduction="none").sum(), xr)[0]
        logits_sum = logits.detach() if logits_sum is None else logits_sum + logits.detach()
        grad_sum = grad if grad_sum is None else grad_sum + grad
    return logits_sum / PASSES, grad_sum / PASSES


def test_keyed_eot_passes_go_in_one_call_and_average_the_same_draws(tiny_model, rows, stacked_on_the_cpu) -> None:
    x, y, ids = rows
    model = RandomResizePad(Calls(tiny_model), rate=0.75, eot_samples=PASSES, seed=0).eval()
    want_logits, want_grad = one_call_a_pass(model, x, y, ids)
    model.model.rows.clear()
    oracle = WhiteBoxOracle(model, N, calls=RowCalls(ids))
    logits, grad = oracle.loss_grad(x, y, False, torch.arange(N))
    assert model.model.rows == [N * PASSES], "one call of the stacked passes"
    torch.testing.assert_close(logits, want_logits)  # the same draws; a larger call may round an ulp apart
    torch.testing.assert_close(grad, want_grad)
    assert torch.equal(oracle.grad_evals, torch.full((N,), PASSES)), "each pass a grad_eval"
    assert torch.equal(oracle.calls.count, torch.full((N,), PASSES)), "each pass a call index"


def test_passes_on_torchs_generator_keep_a_call_each(tiny_model, rows, stacked_on_the_cpu) -> None:
    """Stacked, a draw once a call would be one draw for every pass: the EOT mean of one pass."""
    x, y, ids = rows
    model = BatchNoise(Calls(tiny_model)).eval()
    WhiteBoxOracle(model, N, calls=RowCalls(ids)).loss_grad(x, y, False, torch.arange(N))
    assert model.model.rows == [N] * PASSES


def test_the_vote_stacks_keyed_passes_and_keeps_their_draws(tiny_model, rows, stacked_on_the_cpu) -> None:
    x, y, ids = rows
    model = RandomResizePad(Calls(tiny_model), rate=0.75, eot_samples=PASSES, seed=0).eval()
    calls = RowCalls(ids)
    alone = torch.stack([logits_of(model, x, calls.pass_of(model, torch.arange(N))) for _ in range(9)])
    model.model.rows.clear()
    got = vote(model, x, y, None, 9, calls=RowCalls(ids), rows=torch.arange(N))
    assert model.model.rows == [9 * N]
    torch.testing.assert_close(got.logits, alone.mean(dim=0))
    assert torch.equal(got.fraction, (alone.argmax(dim=2) != y).double().mean(dim=0))
    generator = BatchNoise(Calls(tiny_model)).eval()
    vote(generator, x, y, None, 9, calls=RowCalls(ids), rows=torch.arange(N))
    assert generator.model.rows == [N] * 9


def test_a_pass_on_torchs_generator_draws_as_manual_seed_without_formatting_stacks(rows, monkeypatch) -> None:
    """The pass seeds torch's generator as `torch.manual_seed` would, without queueing a seed for
    devices not started (CUDA, XPU), which formats the call stack each time: 0.3 ms a pass."""
    model, ids = BatchNoise(nn.Identity()), rows[2]
    stacks = []
    monkeypatch.setattr(traceback, "format_stack", lambda *a, **k: stacks.append(1) or [])
    with RowCalls(ids).pass_of(model, torch.arange(N)):
        got, seed = torch.randn(3), torch.initial_seed()
    assert stacks == []
    monkeypatch.undo()
    torch.manual_seed(seed)
    assert torch.equal(torch.randn(3), got)


@pytest.mark.parametrize(("elements", "calls"), [(None, [N * PASSES, N * 3]), (2 * N * 64, [2 * N] * 3 + [2 * N, N]),
                                                 (N * 64 - 1, [N] * (PASSES + 3))])
def test_on_the_cpu_stacked_calls_stay_within_an_input_size(tiny_model, rows, monkeypatch, elements, calls) -> None:
    """Few rows go stacked on the CPU too (a pass's fixed cost is most of a small call's), but no
    call takes more than `CPU_STACK_ELEMENTS` input elements (digits: 64 a row), nor fewer than one pass."""
    if elements is not None:
        monkeypatch.setattr(model_draws, "CPU_STACK_ELEMENTS", elements)
    x, y, ids = rows
    model = RandomResizePad(Calls(tiny_model), rate=0.75, eot_samples=PASSES, seed=0).eval()
    WhiteBoxOracle(model, N, calls=RowCalls(ids)).loss_grad(x, y, False, torch.arange(N))
    vote(model, x, y, None, 3, calls=RowCalls(ids), rows=torch.arange(N))
    assert model.model.rows == calls


@pytest.mark.parametrize("keyed", [True, False])
def test_the_keys_of_several_calls_taken_at_once_are_those_of_the_calls_in_turn(keyed) -> None:
    """Rows repeated within a call too (a decision attack's probes): each copy a call index of its own."""
    model = RandomResizePad(nn.Identity()) if keyed else BatchNoise(nn.Identity())
    rows, copies = torch.tensor([3, 0, 3, 5]), [2, 1, 3]
    one_by_one, at_once = RowCalls(torch.arange(100, 106)), RowCalls(torch.arange(100, 106))
    at_once.take(torch.tensor([5, 5]))  # both with earlier passes counted
    one_by_one.take(torch.tensor([5, 5]))
    want = [one_by_one.pass_of(model, model_draws.stacked(rows, c)) for c in copies]
    got = at_once.calls_of(model, rows, copies)
    assert [torch.equal(g.keys, w.keys) for g, w in zip(got, want)] == [True] * 3
    assert [g.torch_generator for g in got] == [not keyed] * 3
    for g, w in zip(got, want) if not keyed else ():  # the seed taken at once: the pass's from its keys
        with g:
            drawn = torch.rand(2)
        with w:
            assert torch.equal(torch.rand(2), drawn)
    assert torch.equal(at_once.count, one_by_one.count)
    assert [d.keys for d in RowCalls(torch.arange(6)).calls_of(nn.Identity(), rows, copies)] == [None] * 3
