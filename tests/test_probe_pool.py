"""A pool of several batches: the search's probes share calls, the records stay those of its batches.

A cell hands `evaluate_batch` `probe_pool` batches at once with `call_rows` = its batch size: every
attack call and verdict takes at most that many rows, and each search round gathers the pending
samples of the whole pool, so the calls stay full while the pool drains.
"""

from __future__ import annotations

import pytest
import torch

from advbench.robustness.attacks.base import AttackResult
from advbench.robustness.attacks.gradient import BIM, PGD
from advbench.robustness.attacks.score import Square
from advbench.robustness.evaluation.batch import call_slices, concat
from advbench.robustness.evaluation.measure import evaluate_batch
from advbench.robustness.evaluation.search import SearchSettings
from advbench.robustness.threat import ThreatModel

pytestmark = pytest.mark.usefixtures("one_thread")


class CallSizes:
    """Wraps an attack and keeps the rows of each call."""

    def __init__(self, attack) -> None:
        self.attack, self.rows = attack, []
        self.kind, self.steps = attack.kind, getattr(attack, "steps", 1)

    def __call__(self, oracle, x, y, **kwargs) -> AttackResult:
        self.rows.append(x.shape[0])
        return self.attack(oracle, x, y, **kwargs)

    def unsupported(self, *args):
        return self.attack.unsupported(*args)


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
    alone = in_batches(batched, tiny_model, x, y, threat, search, ids, batch=16)
    together = evaluate_batch(pooled, tiny_model, x, y, None, threat, search, sample_id=ids, call_rows=16)
    # ℓ2 steps pass the model's last-bit differences between call sizes on to the measured norms (see test_engine).
    measured = ("adv_norm", "dist_linf", "dist_l2", "dist_l2_norm") if norm == "l2" else ()
    for column, value in alone.items():
        torch.testing.assert_close(together[column], value, rtol=0, atol=1e-5 if column in measured else 0.0,
                                   equal_nan=True, msg=column)
    assert max(pooled.rows) <= 16 and pooled.rows[:4] == [16, 16, 16, 12], "the budget run keeps the batches"
    assert sum(pooled.rows) == sum(batched.rows), "the same probes, in other calls"
    assert len(pooled.rows) < len(batched.rows), (pooled.rows, batched.rows)
    short = sum(r < 16 for r in pooled.rows[4:])
    assert short <= search.max_probes, "a round's calls are full but its last"
    assert short < sum(r < 16 for r in batched.rows[4:])


def test_results_of_consecutive_calls_concatenate_field_by_field() -> None:
    parts = [AttackResult(torch.zeros(2, 3), torch.tensor([True, False]), torch.tensor([1, -1]), {"k": torch.tensor([4, 5])}),
             AttackResult(torch.ones(1, 3), torch.tensor([True]), torch.tensor([2]), {"k": torch.tensor([6])})]
    joined = concat(parts)
    assert joined.x_adv.shape == (3, 3) and joined.success.tolist() == [True, False, True]
    assert joined.first_success.tolist() == [1, -1, 2] and joined.info["k"].tolist() == [4, 5, 6]
    assert call_slices(0, 4) == [slice(0, 4)] and call_slices(9, None) == [slice(0, 9)]
    assert call_slices(9, 4) == [slice(0, 4), slice(4, 8), slice(8, 12)]
