"""The whole ε-curve of BIM and PGD on digits: a pool of batches against one batch at a time, in one run.

A cell hands `evaluate_batch` `probe_pool` batches at once (calls of at most `batch_size` rows),
so each round of the minimum-ε search gathers the pending samples of the whole pool; before,
every batch searched on its own and its probe calls shrank with its pending samples. For each
attack × norm, on `small_cnn` trained for a few seconds on scikit-learn's digits (as
`bench_square.digits_model`) and `--samples` held-out digits at the benchmark's budgets:

  * wall time of the cell's evaluation, one batch at a time (`probe_pool=1`) and pooled;
  * the gradient calls (forward+backward to the input) by rows: how many had fewer than 32;
  * the limit: the records' gradient evaluations × one forward+backward's cost per row at
    `--batch` rows, timed in the same rounds (so load changes cancel), and the wall time as a
    multiple of it (the median over rounds);
  * where the last round's wall time went, as multiples of its limit: 1 (the limit) + what calls
    of 32 rows or more and calls under 32 rows took beyond their rows at the limit's per-row rate
    + the forward-only passes (verdicts) + the rest (the attack loop's own work and the search);
  * the longest chain: the most gradient evaluations of one sample (`grad_evals`). Each waits
    for the one before (its next iterate, its next probe's ε) and no call evaluates a sample
    twice, so no schedule with these records makes fewer calls;
  * the chain's floor, as a multiple of the limit: that many calls at a call's fixed cost (the
    median excess of the last round's calls under 32 rows over their rows at the limit's rate)
    plus every row at the limit's rate: what any schedule of the same records would take on
    this machine with a loop and a search that cost nothing;
  * whether the two give the same records (largest difference per column).

Variants are interleaved over `--rounds` (medians), one torch thread. With `--scale 4` the digits
are enlarged to 32 x 32 and the net trained on them: each row of a call costs about 16 times more,
so the call's fixed cost and the loop's weigh less against the limit.

    python scripts/bench_pool.py --out bench_pool.json
    python scripts/bench_pool.py --scale 4 --rounds 3 --out bench_pool_32.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import torch
from bench_attacks import environment, forward_backward, interleaved
from bench_square import digits_model
from torch import nn

from advbench.core.runtime import call_slices
from advbench.robustness.attacks.gradient import BIM, PGD
from advbench.robustness.evaluation.measure import evaluate_batch
from advbench.robustness.specs import SearchSettings
from advbench.robustness.threat import ThreatModel

BUDGETS = {"linf": 0.2, "l2": 0.8}
"""conf/dataset/digits.yaml's budgets."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--samples", type=int, default=360, help="held-out digits (the benchmark's cells hold 360)")
    p.add_argument("--batch", type=int, default=256, help="batch_size (the default)")
    p.add_argument("--pool", type=int, default=4, help="probe_pool (the default)")
    p.add_argument("--scale", type=int, default=1,
                   help="digits enlarged this many times (4: 32 x 32, the pixels of a CIFAR image per channel)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds per variant (median)")
    p.add_argument("--out", type=Path, default=Path("bench_pool.json"))
    return p.parse_args(argv)


class GradCalls(nn.Module):
    """The model, timing each of its passes: a gradient call from its forward to the input's
    gradient (a hook on the input), a forward-only pass inside its forward; kept as (rows, seconds)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.grad_passes: list[tuple[int, float]] = []
        self.forward_passes: list[tuple[int, float]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tic = time.perf_counter()
        if torch.is_grad_enabled() and x.requires_grad:
            rows = x.shape[0]
            x.register_hook(lambda g: self.grad_passes.append((rows, time.perf_counter() - tic)))
            return self.model(x)
        out = self.model(x)
        self.forward_passes.append((x.shape[0], time.perf_counter() - tic))
        return out


def cell(attack, model: GradCalls, x: torch.Tensor, y: torch.Tensor, norm: str, batch: int,
         pool: int) -> tuple[dict[str, torch.Tensor], tuple[list[tuple[int, float]], list[tuple[int, float]]]]:
    """The cell's records in pools of `pool` batches, and its timed gradient and forward-only passes."""
    threat = ThreatModel(norm=norm, goal="untargeted", eps=BUDGETS[norm])
    ids = torch.arange(x.shape[0])
    model.grad_passes, model.forward_passes = [], []
    parts = [evaluate_batch(attack, model, x[s], y[s], None, threat, SearchSettings(), sample_id=ids[s],
                            call_rows=batch) for s in call_slices(x.shape[0], batch * pool)]
    records = {k: torch.cat([p[k] for p in parts]) for k, v in parts[0].items() if isinstance(v, torch.Tensor)}
    return records, (list(model.grad_passes), list(model.forward_passes))


def floor(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int) -> Callable[[], None]:
    """20 forward+backward passes at `batch` rows: timed beside the cells, the per-row cost of their limit."""
    xb, yb = x[:batch].repeat(-(-batch // x.shape[0]), 1, 1, 1)[:batch], y.repeat(-(-batch // y.shape[0]))[:batch]
    return lambda: [forward_backward(model, xb, yb) for _ in range(FLOOR_LOOPS)]


FLOOR_LOOPS = 20
SMALL = 32
"""Rows under which a gradient call counts as small."""


def excess(grad_passes: list[tuple[int, float]], per_row: float, *, small: bool) -> list[float]:
    """What each gradient call under `SMALL` rows (`small`) or of at least `SMALL` rows took beyond its
    rows at the limit's rate."""
    return [t - r * per_row for r, t in grad_passes if (r < SMALL) == small]


def where_time_goes(wall: float, grad_passes: list[tuple[int, float]], forward_passes: list[tuple[int, float]],
                    per_row: float) -> dict[str, float]:
    """One run's wall time as multiples of its limit (gradient rows × `per_row`): the limit itself (1),
    what calls of at least / under `SMALL` rows took beyond their rows at the limit's rate, the
    forward-only passes (verdicts), and the rest (the attack loop's own work and the search)."""
    limit = sum(r for r, _ in grad_passes) * per_row
    forwards = sum(t for _, t in forward_passes)
    passes = sum(t for _, t in grad_passes)
    return {"limit": 1.0,
            "full_calls": sum(excess(grad_passes, per_row, small=False)) / limit,
            "small_calls": sum(excess(grad_passes, per_row, small=True)) / limit,
            "forward_passes": forwards / limit,
            "loop_and_search": (wall - passes - forwards) / limit}


def chain_floor(records: dict[str, torch.Tensor], grad_passes: list[tuple[int, float]],
                per_row: float) -> tuple[int, float, float]:
    """The longest chain of gradient calls a sample takes part in (its evaluations: a gradient served
    from memory needs no call); its floor as a multiple of the limit: that many calls' fixed cost
    plus every gradient row at the limit's rate; and that fixed cost, the median excess of the calls
    under `SMALL` rows (0 when there are none)."""
    small = excess(grad_passes, per_row, small=True)
    per_call = max(statistics.median(small), 0.0) if small else 0.0
    chain = int(records["grad_evals"].max())
    evals = int(records["grad_evals"].sum())
    return chain, (chain * per_call + evals * per_row) / (evals * per_row), per_call


def difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> dict[str, float]:
    """The largest absolute difference per column where the two differ (NaN equals NaN)."""
    out = {}
    for k in a:
        if not torch.equal(torch.nan_to_num(a[k].double(), nan=-7.0, posinf=7e9),
                           torch.nan_to_num(b[k].double(), nan=-7.0, posinf=7e9)):
            out[k] = float((a[k].double() - b[k].double()).abs().nan_to_num(0.0).max())
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    net, x, y = digits_model(args.samples, args.scale)
    model = GradCalls(net)
    rows: dict[str, Any] = {"environment": environment(torch.device("cpu")), "args": {k: str(v) for k, v in vars(args).items()},
                            "cells": {}}
    print("| cell | variant | wall s | grad calls | < 32 rows | grad evals | longest chain | wall / limit | chain's floor "
          "| last round: full calls + small calls + forwards + loop & search |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, attack in (("bim", BIM(steps=20, rel_stepsize=0.15)), ("pgd", PGD(steps=20, rel_stepsize=0.125))):
        for norm in BUDGETS:
            variants = {"batches": lambda a=attack, n=norm: cell(a, model, x, y, n, args.batch, 1),
                        "pool": lambda a=attack, n=norm: cell(a, model, x, y, n, args.batch, args.pool),
                        "fb": floor(net, x, y, args.batch)}
            timed = interleaved(variants, torch.device("cpu"), 1, args.rounds)
            per_row = [t / (FLOOR_LOOPS * args.batch) for t in timed.pop("fb")[0]]  # each round's own floor
            entry = {"fb_us_per_row": statistics.median(per_row) * 1e6}
            for variant, (times, (records, (grad_passes, forward_passes))) in timed.items():
                evals = int(records["grad_evals"].sum())
                over = statistics.median(t / (evals * r) for t, r in zip(times, per_row))
                split = where_time_goes(times[-1], grad_passes, forward_passes, per_row[-1])
                chain, floor_x, per_call = chain_floor(records, grad_passes, per_row[-1])
                entry[variant] = {"times": times, "wall": statistics.median(times), "grad_calls": len(grad_passes),
                                  "small_calls": sum(r < SMALL for r, _ in grad_passes), "grad_evals": evals,
                                  "longest_chain": chain, "chain_floor": floor_x,
                                  "per_call_s": per_call, "over_limit": over, "last_round": split}
                e = entry[variant]
                parts = " + ".join(f"{split[k]:.2f}" for k in ("full_calls", "small_calls", "forward_passes",
                                                               "loop_and_search"))
                print(f"| {name} {norm} | {variant} | {e['wall']:.2f} | {e['grad_calls']} | {e['small_calls']} | {evals} "
                      f"| {chain} | {over:.2f}× | {floor_x:.2f}× | 1 + {parts} |")
            entry["records_differ"] = difference(timed["batches"][1][0], timed["pool"][1][0])
            print(f"|  | records differ in | {entry['records_differ'] or 'nothing'} | | | | | | | |")
            rows["cells"][f"{name}_{norm}"] = entry
    args.out.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
