"""A pool of several batches: the search's probes share calls, the records stay those of its batches.

A cell hands `evaluate_batch` `probe_pool` batches at once with `call_rows` = its batch size: no
model pass takes more rows, and each search round gathers the pending samples of the whole pool,
so the calls stay full while the pool drains. A pooled attack (BIM, PGD, ...) gets the whole pool
in one call and its oracle splits the gradient calls, so its early stopping refills them too.
"""

from __future__ import annotations

import pytest
import torch

from advbench.core.runtime import call_slices
from advbench.robustness.attacks.attack_contract import AttackResult
from advbench.robustness.attacks.gradient import BIM, PGD
from advbench.robustness.attacks.score import Square
from advbench.robustness.evaluation.batch import concat
from advbench.robustness.evaluation.measure import evaluate_batch
from advbench.robustness.specs import SearchSettings
from advbench.robustness.threat import ThreatModel

pytestmark = pytest.mark.usefixtures("one_thread")


class CallSizes:
    """Wraps an attack and keeps the rows of each call."""

    def __init__(self, attack) -> None:
        self.attack, self.rows = attack, []
        self.kind, self.strength_budget, self.pooled_calls = attack.kind, attack.strength_budget, attack.pooled_calls

    def __call__(self, oracle, x, y, **kwargs) -> AttackResult:
        self.rows.append(x.shape[0])
        return self.attack(oracle, x, y, **kwargs)

    def unsupported(self, *args):
        return self.attack.unsupported(*args)


class PassSizes(torch.nn.Module):
    """The model, keeping the rows of each pass and whether it built a graph (a gradient call)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model, self.passes = model, []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.passes.append((x.shape[0], torch.is_grad_enabled()))
        return self.model(x)


def in_batches(attack, model, x, y, threat, search, ids, batch: int) -> dict[str, torch.Tensor]:
    parts = [evaluate_batch(attack, model, x[s], y[s], None, threat, search, sample_id=ids[s])
             for s in call_slices(x.shape[0], batch)]
    return {k: torch.cat([p[k] for p in parts]) for k, v in parts[0].items() if isinstance(v, torch.Tensor)}


@pytest.mark.parametrize("attack, norm, knowledge", [(PGD(steps=5, seed=1), "linf", "white"),
                                                     (BIM(steps=4), "l2", "white"),
                                                     (Square(n_queries=40, seed=3), "linf", "score")],
                         ids=["pgd-linf", "bim-l2", "square-linf"])
def test_a_pool_gives_its_batches_records_in_fewer_fuller_calls(attack, norm, knowledge, tiny_model,
                                                                digits_tensors) -> None:
    x, y = digits_tensors[2][:60], digits_tensors[3][:60]
    ids = torch.arange(300, 360)
    threat = ThreatModel(norm=norm, goal="untargeted", knowledge=knowledge, eps=0.1 if norm == "linf" else 0.8)
    search = SearchSettings()
    batched, pooled = CallSizes(attack), CallSizes(attack)
    alone_model, pool_model = PassSizes(tiny_model), PassSizes(tiny_model)
    alone = in_batches(batched, alone_model, x, y, threat, search, ids, batch=16)
    together = evaluate_batch(pooled, pool_model, x, y, None, threat, search, sample_id=ids, call_rows=16)
    # ℓ2 steps pass the model's last-bit differences between call sizes on to the measured norms (see test_engine).
    measured = ("adv_norm", "dist_linf", "dist_l2", "dist_l2_norm") if norm == "l2" else ()
    for column, value in alone.items():
        torch.testing.assert_close(together[column], value, rtol=0, atol=1e-5 if column in measured else 0.0,
                                   equal_nan=True, msg=column)
    assert max(rows for rows, _ in pool_model.passes) <= 16, "no pass takes more than the batch size"
    assert sum(r for r, _ in pool_model.passes) == sum(r for r, _ in alone_model.passes), "the same rows, other calls"
    # Passes under 16 rows: gradient calls of a pooled attack (forward passes of the others) at least halve.
    small = [sum(r < 16 for r, grad in m.passes if grad == attack.pooled_calls) for m in (pool_model, alone_model)]
    assert small[0] < small[1] / (2 if attack.pooled_calls else 1), small
    if attack.pooled_calls:  # one attack call for the budget run and one per search round
        assert pooled.rows[0] == 60 and len(pooled.rows) <= 1 + search.max_probes
    else:  # the budget run keeps the batches, a round's calls are full but its last
        assert pooled.rows[:4] == [16, 16, 16, 12] and sum(r < 16 for r in pooled.rows[4:]) <= search.max_probes


def test_results_of_consecutive_calls_concatenate_field_by_field() -> None:
    parts = [AttackResult(torch.zeros(2, 3), torch.tensor([True, False]), torch.tensor([1, -1]), {"k": torch.tensor([4, 5])}),
             AttackResult(torch.ones(1, 3), torch.tensor([True]), torch.tensor([2]), {"k": torch.tensor([6])})]
    joined = concat(parts)
    assert joined.x_adv.shape == (3, 3) and joined.success.tolist() == [True, False, True]
    assert joined.first_success.tolist() == [1, -1, 2] and joined.info["k"].tolist() == [4, 5, 6]
    assert call_slices(0, 4) == [slice(0, 4)] and call_slices(9, None) == [slice(0, 9)]
    assert call_slices(9, 4) == [slice(0, 4), slice(4, 8), slice(8, 12)]
