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
  * whether the two give the same records (largest difference per column).

Variants are interleaved over `--rounds` (medians), one torch thread.

    python scripts/bench_pool.py --out bench_pool.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any, Callable

import torch
from bench_attacks import environment, forward_backward, interleaved
from bench_square import digits_model
from torch import nn

from advbench.core.runtime import call_slices
from advbench.robustness.attacks.gradient import BIM, PGD
from advbench.robustness.evaluation.measure import evaluate_batch
from advbench.robustness.evaluation.search import SearchSettings
from advbench.robustness.threat import ThreatModel

BUDGETS = {"linf": 0.2, "l2": 0.8}
"""conf/dataset/digits.yaml's budgets."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--samples", type=int, default=360, help="held-out digits (the benchmark's cells hold 360)")
    p.add_argument("--batch", type=int, default=256, help="batch_size (the default)")
    p.add_argument("--pool", type=int, default=4, help="probe_pool (the default)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds per variant (median)")
    p.add_argument("--out", type=Path, default=Path("bench_pool.json"))
    return p.parse_args(argv)


class GradCalls(nn.Module):
    """The model, keeping the rows of every pass that builds a graph (a gradient call)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model, self.rows = model, []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled():
            self.rows.append(x.shape[0])
        return self.model(x)


def cell(attack, model: GradCalls, x: torch.Tensor, y: torch.Tensor, norm: str, batch: int,
         pool: int) -> tuple[dict[str, torch.Tensor], list[int]]:
    """The cell's records in pools of `pool` batches, and the rows of its gradient calls."""
    threat = ThreatModel(norm=norm, goal="untargeted", eps=BUDGETS[norm])
    ids = torch.arange(x.shape[0])
    model.rows = []
    parts = [evaluate_batch(attack, model, x[s], y[s], None, threat, SearchSettings(), sample_id=ids[s],
                            call_rows=batch) for s in call_slices(x.shape[0], batch * pool)]
    records = {k: torch.cat([p[k] for p in parts]) for k, v in parts[0].items() if isinstance(v, torch.Tensor)}
    return records, list(model.rows)


def floor(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int) -> Callable[[], None]:
    """20 forward+backward passes at `batch` rows: timed beside the cells, the per-row cost of their limit."""
    xb, yb = x[:batch].repeat(-(-batch // x.shape[0]), 1, 1, 1)[:batch], y.repeat(-(-batch // y.shape[0]))[:batch]
    return lambda: [forward_backward(model, xb, yb) for _ in range(FLOOR_LOOPS)]


FLOOR_LOOPS = 20


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
    net, x, y = digits_model(args.samples)
    model = GradCalls(net)
    rows: dict[str, Any] = {"environment": environment(torch.device("cpu")), "args": {k: str(v) for k, v in vars(args).items()},
                            "cells": {}}
    print("| cell | variant | wall s | grad calls | < 32 rows | grad evals | wall / limit |")
    print("|---|---|---|---|---|---|---|")
    for name, attack in (("bim", BIM(steps=20, rel_stepsize=0.15)), ("pgd", PGD(steps=20, rel_stepsize=0.125))):
        for norm in BUDGETS:
            variants = {"batches": lambda a=attack, n=norm: cell(a, model, x, y, n, args.batch, 1),
                        "pool": lambda a=attack, n=norm: cell(a, model, x, y, n, args.batch, args.pool),
                        "fb": floor(net, x, y, args.batch)}
            timed = interleaved(variants, torch.device("cpu"), 1, args.rounds)
            per_row = [t / (FLOOR_LOOPS * args.batch) for t in timed.pop("fb")[0]]  # each round's own floor
            entry = {"fb_us_per_row": statistics.median(per_row) * 1e6}
            for variant, (times, (records, calls)) in timed.items():
                evals = int(records["grad_evals"].sum())
                over = statistics.median(t / (evals * r) for t, r in zip(times, per_row))
                entry[variant] = {"times": times, "wall": statistics.median(times), "grad_calls": len(calls),
                                  "small_calls": sum(r < 32 for r in calls), "grad_evals": evals, "over_limit": over}
                e = entry[variant]
                print(f"| {name} {norm} | {variant} | {e['wall']:.2f} | {e['grad_calls']} | {e['small_calls']} | {evals} "
                      f"| {over:.2f}× |")
            entry["records_differ"] = difference(timed["batches"][1][0], timed["pool"][1][0])
            print(f"|  | records differ in | {entry['records_differ'] or 'nothing'} | | | | |")
            rows["cells"][f"{name}_{norm}"] = entry
    args.out.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
