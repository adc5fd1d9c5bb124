"""Square's cost per query: this tree, a committed version, and torchattacks, in one run.

`--model digits` (the default) is the benchmark's `small_cnn`, trained for a few seconds on
scikit-learn's 8×8 digits (what `advbench run` attacks by default), and the batch is held-out
digits labelled with their true classes. `--model resnet56` is ResNet-56 with random weights
on CIFAR-size uniform noise labelled with the model's own predictions (bench_attacks.py's
`build`): the cost of a query does not depend on the weights, and on a model this size it is
mostly the model's forward. Two settings, each timed for every contender round-robin (a
change of machine load hits all alike), medians over `--rounds`:

  * every sample active: ε so small that no sample breaks, so every sample pays every query and
    the figure is the cost of one query at full batch;
  * at `--eps`: samples leave as they break, later calls carry fewer rows (what a user waits for).

Each round's µs/query ratio to torchattacks is kept too, with their median (the steadier figure on a busy
machine). µs/query is wall time over the queries made: the oracle's count for advbench, the rows its
model evaluated for torchattacks (which spends one more query than its `n_queries`, so it is
given `--queries − 1`). `--baseline REV` also times Square as committed at REV (its score.py
and its draws module, read with `git show`) and checks that it returns exactly this tree's results.

    python scripts/bench_square.py --baseline ad4c800 --out square.json
    python scripts/bench_square.py --model resnet56 --batch 32 --queries 200 --only-active
"""

from __future__ import annotations

import argparse
import importlib
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
from bench_attacks import RowCounter, build, environment, interleaved
from sklearn.datasets import load_digits
from torch import nn

from advbench.robustness.attacks import score
from advbench.robustness.attacks.oracles import ScoreOracle
from advbench.robustness.models import build_model

_DRAWS = "advbench.robustness.attacks.model_draws"
_RENAMED = {"advbench.robustness.attacks.optimized": "advbench.robustness.attacks.minimum_norm",
            "advbench.robustness.attacks.zoo": "advbench.robustness.attacks.zeroth_order"}
"""Modules a committed score.py may import by the names they had before."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=["digits", "resnet56"], default="digits",
                   help="trained small_cnn on digits, or ResNet-56 (random weights) on CIFAR-size noise")
    p.add_argument("--queries", type=int, default=1000, help="Square's queries per sample")
    p.add_argument("--batch", type=int, default=100, help="inputs attacked at once")
    p.add_argument("--norm", choices=["linf", "l2"], default="linf")
    p.add_argument("--eps", type=float, default=0.1, help="the budget of the second setting")
    p.add_argument("--only-active", action="store_true", help="time the every-sample-active setting only")
    p.add_argument("--rounds", type=int, default=3, help="timed rounds per contender (median)")
    p.add_argument("--warmup", type=int, default=1, help="untimed runs per contender before the rounds")
    p.add_argument("--baseline", help="a git revision whose Square is timed too (e.g. the commit before a change)")
    p.add_argument("--out", type=Path, default=Path("bench_square.json"))
    return p.parse_args(argv)


def digits_model(n: int, scale: int = 1) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """small_cnn trained 10 epochs on the first 1,297 digits, and the next `n` digits with labels;
    with `scale` > 1, on digits enlarged that many times (bilinear), for a net whose calls cost more per row."""
    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0
    if scale > 1:
        x = nn.functional.interpolate(x, scale_factor=scale, mode="bilinear")
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


def inputs(args: argparse.Namespace) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """The model and the labelled batch `--model` names."""
    if args.model == "digits":
        return digits_model(args.batch)
    spec = argparse.Namespace(model="resnet56", depth=None, width=None, batch=args.batch, seed=0, amp=False,
                              channels_last=False)
    return build(spec, torch.device("cpu"))


def committed_score(rev: str) -> types.ModuleType:
    """score.py as committed at `rev`, run on the draws module as committed there (not this tree's;
    named random.py before it was draws.py); modules renamed since are found under their old names."""
    modules: dict[str, types.ModuleType] = {}
    for name in ("random", "score"):
        path, source = _committed(rev, ("draws", "random") if name == "random" else (name,))
        module = types.ModuleType(f"committed_{name}")
        draws = modules.get("random", importlib.import_module(_DRAWS))
        aliases = {**{old: importlib.import_module(new) for old, new in _RENAMED.items()},
                   _DRAWS: draws, "advbench.robustness.attacks.random": draws}
        saved = {key: sys.modules.get(key) for key in aliases}
        sys.modules.update(aliases)
        try:
            exec(compile(source, f"{rev}:{path}", "exec"), module.__dict__)
        finally:
            for key, value in saved.items():
                if value is None:
                    sys.modules.pop(key, None)
                else:
                    sys.modules[key] = value
        modules[name] = module
    return modules["score"]


def _committed(rev: str, names: tuple[str, ...]) -> tuple[str, str]:
    """(path, source) of the first of `names` under advbench/robustness/attacks/ that `rev` holds."""
    for name in names:
        path = f"advbench/robustness/attacks/{name}.py"
        shown = subprocess.run(["git", "show", f"{rev}:{path}"], capture_output=True, text=True)
        if shown.returncode == 0:
            return path, shown.stdout
    raise SystemExit(f"{rev} holds none of {', '.join(names)} under advbench/robustness/attacks/")


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


def setting(contenders: dict[str, Callable[[], tuple[int, torch.Tensor]]], rounds: int,
            warmup: int) -> dict[str, Any]:
    """Each contender's median µs/query over `rounds` interleaved rounds (after `warmup` runs each)."""
    timed = interleaved(contenders, torch.device("cpu"), warmup, rounds)
    rows = {}
    for name, (times, (queries, _)) in timed.items():
        seconds = statistics.median(times)
        rows[name] = {"times": times, "seconds": seconds, "queries": queries, "us_per_query": seconds / queries * 1e6}
    peer = timed["torchattacks"][0]
    for name, (times, _) in timed.items():
        # Within a round the contenders ran back to back, under nearly the same load: the median
        # of the rounds' ratios is steadier than the ratio of medians when the load swings.
        ratios = [t / p * rows["torchattacks"]["queries"] / rows[name]["queries"] for t, p in zip(times, peer)]
        rows[name]["round_ratios"] = ratios
        rows[name]["ratio"] = statistics.median(ratios)
    if "advbench (committed)" in timed:
        same = torch.equal(timed["advbench (committed)"][1][1], timed["advbench (this tree)"][1][1])
        rows["advbench (this tree)"]["same_as_committed"] = same
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    model, x, y = inputs(args)
    classes = {"advbench (this tree)": score.Square}
    if args.baseline:
        classes["advbench (committed)"] = committed_score(args.baseline).Square
    result: dict[str, Any] = {"config": vars(args) | {"out": str(args.out)}, "environment": environment(torch.device("cpu"))}
    settings = (("every sample active", 1e-4),) + (() if args.only_active else ((f"eps {args.eps}", args.eps),))
    for label, eps in settings:
        contenders = {name: ours(cls, model, x, y, args, eps) for name, cls in classes.items()}
        contenders["torchattacks"] = theirs(model, x, y, args, eps)
        rows = setting(contenders, args.rounds, args.warmup)
        result[label] = rows
        peer = rows["torchattacks"]["us_per_query"]
        print(f"{label} ({args.model}, {args.norm}, {args.queries} queries, batch {args.batch}):")
        for name, row in rows.items():
            same = {True: ", same results as committed", False: ", RESULTS DIFFER from committed"}.get(
                row.get("same_as_committed"), "")
            rounds = ", ".join(f"{r:.2f}" for r in row["round_ratios"])
            print(f"  {name:22s} {row['us_per_query']:7.1f} µs/query  ({row['seconds']:.2f} s, {row['queries']:,} queries, "
                  f"{row['us_per_query'] / peer:.2f}x torchattacks; per round {rounds}: median {row['ratio']:.2f}x{same})")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
