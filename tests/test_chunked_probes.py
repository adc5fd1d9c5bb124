"""Big calls in memory-sized pieces: decision attacks' probes (`probe_rows`) and DeepFool's
candidate-class backwards (`grad_rows`) give the results, counts and draws of one big call.

Each case runs twice on the digits net, once with a cap no call reaches (one call, as before
the pieces) and once with a tiny cap that forces many pieces, and compares bit for bit; a
forward hook checks that the tiny cap really bounded every call the model saw.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch
from torch import nn

from advbench.core import runtime
from advbench.robustness.attacks.attack_contract import AttackResult
from advbench.robustness.attacks.boundary import Boundary
from advbench.robustness.attacks.decision import HopSkipJump
from advbench.robustness.attacks.minimum_norm import DeepFool
from advbench.robustness.attacks.oracles import DecisionOracle, Oracle, WhiteBoxOracle
from advbench.robustness.defenses.wrappers import RandomResizePad

pytestmark = pytest.mark.usefixtures("one_thread")

N = 12
UNBOUNDED = 10 ** 9


@pytest.fixture(scope="module")
def batch(digits_tensors) -> tuple[torch.Tensor, torch.Tensor]:
    _, _, x, y = digits_tensors
    return x[:N], y[:N]


def rows_seen(model: nn.Module, backward: bool) -> Callable[[], Iterator[list[int]]]:
    """A context manager recording the rows of every forward call of `model`'s first layer
    (with `backward`, only those that build a graph for a backward)."""
    layer = next(m for m in model.modules() if isinstance(m, nn.Conv2d))

    class Recorder:
        def __enter__(self) -> list[int]:
            self.sizes: list[int] = []
            def hook(_m: nn.Module, inp: tuple[torch.Tensor, ...], _out: torch.Tensor) -> None:
                if torch.is_grad_enabled() or not backward:
                    self.sizes.append(inp[0].shape[0])

            self.handle = layer.register_forward_hook(hook)
            return self.sizes

        def __exit__(self, *exc: object) -> None:
            self.handle.remove()

    return Recorder  # type: ignore[return-value]


def run_capped(monkeypatch, cap_name: str, cap: int, model: nn.Module, make_oracle: Callable[[], Oracle],
               attack: Callable[[Oracle], AttackResult]) -> tuple[AttackResult, Oracle, list[int]]:
    monkeypatch.setattr(runtime, cap_name, cap)
    oracle = make_oracle()
    with rows_seen(model, backward=cap_name == "CPU_AUTO_BATCH")() as sizes:
        res = attack(oracle)
    return res, oracle, sizes


def assert_same(a: AttackResult, b: AttackResult) -> None:
    assert torch.equal(a.x_adv, b.x_adv)
    assert torch.equal(a.success, b.success) and torch.equal(a.first_success, b.first_success)
    assert a.info.keys() == b.info.keys()
    for key in a.info:
        assert torch.equal(a.info[key], b.info[key]), key


DECISION = [
    ("hsj", "l2", False), ("hsj", "linf", False), ("boundary", "l2", False), ("hsj", "l2", True),
]


@pytest.mark.parametrize(("name", "norm", "randomized"), DECISION)
def test_decision_probes_in_pieces_give_the_results_and_queries_of_one_call(
        monkeypatch, tiny_model, batch, name: str, norm: str, randomized: bool) -> None:
    x, y = batch
    model = RandomResizePad(tiny_model, rate=0.75, eot_samples=1).eval() if randomized else tiny_model
    cls = {"hsj": HopSkipJump, "boundary": Boundary}[name]
    eps = torch.full((N,), 0.8)

    def attack(oracle: Oracle) -> AttackResult:
        return cls(max_queries=300, checkpoints=[100, 200])(oracle, x, y, eps=eps, norm=norm,
                                                            sample_id=torch.arange(N) + 40)

    whole, o_whole, s_whole = run_capped(monkeypatch, "CPU_PROBE_ROWS", UNBOUNDED, tiny_model,
                                         lambda: DecisionOracle(model, N), attack)
    cut, o_cut, s_cut = run_capped(monkeypatch, "CPU_PROBE_ROWS", 7, tiny_model,
                                   lambda: DecisionOracle(model, N), attack)
    assert max(s_whole) > 7 >= max(s_cut)   # the cap bounded calls that were bigger
    assert sum(s_cut) == sum(s_whole)       # no row evaluated twice or skipped
    assert_same(whole, cut)
    assert torch.equal(o_whole.queries, o_cut.queries)
    assert bool(whole.success.any())


@pytest.mark.parametrize(("norm", "targeted", "cap", "randomized"), [
    ("l2", False, 12, False), ("linf", False, 12, False), ("l2", False, 12, True),
    ("l2", False, 7, False), ("l2", True, 7, False),
])
def test_deepfool_candidate_groups_give_the_gradients_of_one_backward(
        monkeypatch, digits_tensors, tiny_model, norm: str, targeted: bool, cap: int, randomized: bool) -> None:
    """A forward of the class gradients takes whole samples, at most `cap` of them, each of its
    backwards (one a candidate) the same rows. Pieces of a dozen rows or fewer take other BLAS
    paths on the CPU than one call of all, whose logits differ by an ulp: the results agree to
    1e-6, the verdicts, first successes and counts exactly."""
    _, _, x, y = digits_tensors
    n = 24 if cap > 9 else N
    x, y = x[:n], y[:n]
    model = RandomResizePad(tiny_model, rate=0.75, eot_samples=2).eval() if randomized else tiny_model
    target = (y + 1) % 10 if targeted else None
    eps = torch.full((n,), 1.0)

    def attack(oracle: Oracle) -> AttackResult:
        return DeepFool(steps=6)(oracle, x, y, eps=eps, norm=norm, target=target, sample_id=torch.arange(n))

    whole, o_whole, s_whole = run_capped(monkeypatch, "CPU_AUTO_BATCH", UNBOUNDED, tiny_model,
                                         lambda: WhiteBoxOracle(model, n), attack)
    cut, o_cut, s_cut = run_capped(monkeypatch, "CPU_AUTO_BATCH", cap, tiny_model,
                                   lambda: WhiteBoxOracle(model, n), attack)
    assert max(s_whole) > cap >= max(s_cut)   # whole samples a call, no more than the cap
    assert sum(s_cut) == sum(s_whole)
    torch.testing.assert_close(cut.x_adv, whole.x_adv, rtol=0, atol=1e-6)
    assert torch.equal(whole.success, cut.success) and torch.equal(whole.first_success, cut.first_success)
    assert torch.equal(o_whole.grad_evals, o_cut.grad_evals) and torch.equal(o_whole.queries, o_cut.queries)
    assert bool(whole.success.any())


def test_pieces_are_near_equal_and_a_call_over_no_rows_still_runs_once() -> None:
    assert runtime.pieces(0, 7) == [slice(0, 1)]
    assert runtime.pieces(7, 7) == [slice(0, 7)]
    assert runtime.pieces(15, 7) == [slice(0, 5), slice(5, 10), slice(10, 15)]  # no 1-row remainder
