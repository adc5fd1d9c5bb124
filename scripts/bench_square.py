"""Square's cost per query on the digits model: this tree, a committed version, and torchattacks, in one run.

The model is the benchmark's `small_cnn`, trained for a few seconds on scikit-learn's 8×8
digits (what `advbench run` attacks by default); the batch is held-out digits labelled with
their true classes. Two settings, each timed for every contender round-robin (a change of
machine load hits all alike), medians over `--rounds`:

  * every sample active: ε so small that no sample breaks, so every sample pays every query and
    the figure is the cost of one query at full batch;
  * at `--eps`: samples leave as they break, later calls carry fewer rows (what a user waits for).

µs/query is wall time over the queries made: the oracle's count for advbench, the rows its
model evaluated for torchattacks (which spends one more query than its `n_queries`, so it is
given `--queries − 1`). `--baseline REV` also times Square as committed at REV (its score.py
and random.py, read with `git show`) and checks that it returns exactly this tree's results.

    python scripts/bench_square.py --baseline ad4c800 --out square.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torchattacks
from bench_attacks import RowCounter, environment, interleaved
from sklearn.datasets import load_digits
from torch import nn

from advbench.robustness.attacks import score
from advbench.robustness.attacks.oracles import ScoreOracle
from advbench.robustness.models import build_model

_RANDOM = "advbench.robustness.attacks.random"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--queries", type=int, default=1000, help="Square's queries per sample")
    p.add_argument("--batch", type=int, default=100, help="held-out digits attacked at once")
    p.add_argument("--norm", choices=["linf", "l2"], default="linf")
    p.add_argument("--eps", type=float, default=0.1, help="the budget of the second setting")
    p.add_argument("--rounds", type=int, default=3, help="timed rounds per contender (median)")
    p.add_argument("--baseline", help="a git revision whose Square is timed too (e.g. the commit before a change)")
    p.add_argument("--out", type=Path, default=Path("bench_square.json"))
    return p.parse_args(argv)


def digits_model(n: int) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """small_cnn trained 10 epochs on the first 1,297 digits, and the next `n` digits with labels."""
    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(d.target, dtype=torch.long)
    torch.manual_seed(0)
    model = build_model("small_cnn", num_classes=10, in_channels=1)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(10):
        for i in range(0, 1297, 64):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x[i:i + 64]), y[i:i + 64]).backward()
            opt.step()
    return model.eval(), x[1297:1297 + n], y[1297:1297 + n]


def committed_score(rev: str) -> types.ModuleType:
    """score.py as committed at `rev`, run on random.py as committed there (not this tree's)."""
    modules: dict[str, types.ModuleType] = {}
    for name in ("random", "score"):
        path = f"advbench/robustness/attacks/{name}.py"
        source = subprocess.run(["git", "show", f"{rev}:{path}"], capture_output=True, text=True, check=True).stdout
        module = types.ModuleType(f"committed_{name}")
        current = sys.modules[_RANDOM]
        sys.modules[_RANDOM] = modules.get("random", current)
        try:
            exec(compile(source, f"{rev}:{path}", "exec"), module.__dict__)
        finally:
            sys.modules[_RANDOM] = current
        modules[name] = module
    return modules["score"]


def ours(square_cls: type, model: nn.Module, x: torch.Tensor, y: torch.Tensor, args: argparse.Namespace,
         eps: float) -> Callable[[], tuple[int, torch.Tensor]]:
    def run() -> tuple[int, torch.Tensor]:
        oracle = ScoreOracle(model, len(y))
        res = square_cls(n_queries=args.queries, seed=0)(oracle, x, y, eps=torch.full((len(y),), eps), norm=args.norm)
        return int(oracle.queries.sum()), res.x_adv
    return run


def theirs(model: nn.Module, x: torch.Tensor, y: torch.Tensor, args: argparse.Namespace,
           eps: float) -> Callable[[], tuple[int, torch.Tensor]]:
    counter = RowCounter(model).eval()

    def run() -> tuple[int, torch.Tensor]:
        counter.rows = 0
        attack = torchattacks.Square(counter, norm=args.norm.capitalize(), eps=eps, n_queries=args.queries - 1, seed=0)
        x_adv = attack(x, y)
        return counter.rows, x_adv
    return run


def setting(contenders: dict[str, Callable[[], tuple[int, torch.Tensor]]], rounds: int) -> dict[str, Any]:
    """Each contender's median µs/query over `rounds` interleaved rounds (after one warm-up)."""
    timed = interleaved(contenders, torch.device("cpu"), 1, rounds)
    rows = {}
    for name, (times, (queries, _)) in timed.items():
        seconds = statistics.median(times)
        rows[name] = {"times": times, "seconds": seconds, "queries": queries, "us_per_query": seconds / queries * 1e6}
    if "advbench (committed)" in timed:
        same = torch.equal(timed["advbench (committed)"][1][1], timed["advbench (this tree)"][1][1])
        rows["advbench (this tree)"]["same_as_committed"] = same
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    model, x, y = digits_model(args.batch)
    classes = {"advbench (this tree)": score.Square}
    if args.baseline:
        classes["advbench (committed)"] = committed_score(args.baseline).Square
    result: dict[str, Any] = {"config": vars(args) | {"out": str(args.out)}, "environment": environment(torch.device("cpu"))}
    for label, eps in (("every sample active", 1e-4), (f"eps {args.eps}", args.eps)):
        contenders = {name: ours(cls, model, x, y, args, eps) for name, cls in classes.items()}
        contenders["torchattacks"] = theirs(model, x, y, args, eps)
        rows = setting(contenders, args.rounds)
        result[label] = rows
        peer = rows["torchattacks"]["us_per_query"]
        print(f"{label} ({args.norm}, {args.queries} queries, batch {args.batch}):")
        for name, row in rows.items():
            same = {True: ", same results as committed", False: ", RESULTS DIFFER from committed"}.get(
                row.get("same_as_committed"), "")
            print(f"  {name:22s} {row['us_per_query']:7.1f} µs/query  ({row['queries']:,} queries, "
                  f"{row['us_per_query'] / peer:.2f}x torchattacks{same})")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
