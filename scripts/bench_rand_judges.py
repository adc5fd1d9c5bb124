"""AutoAttack's rand version on a randomized model under each rule of success, beside the original's number.

The model is a small conv net trained for a few seconds on advbench's digits split (the one
`dataset=digits` draws) behind Gaussian input noise (σ 0.3), fresh on every pass; the samples
are the first `--samples` test digits, the threat ℓ∞ at ε 0.1. It prints the robust accuracy of

  * advbench `attack=autoattack attack.version=rand` judged by the engine's vote of 20 passes
    (the default), and by a vote of one (one pass a verdict, `judge.draws=1`);
  * advbench with `attack.judge=original`, the original's rule (docs/attacks.md, AutoAttack);
  * pyautoattack's `AutoAttack(build_member=member_attack, version='rand')`, the number the original and RobustBench report.

Each advbench number is read as the run's summary line reads it (`adv_pred == label`), beside
the records' success (`clean_correct` and not `success_at_budget`), which must agree.

    python scripts/bench_rand_judges.py --samples 300
    python scripts/bench_rand_judges.py --samples 300 --seed 1 --only original
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from pyautoattack import AutoAttack as Original
from torch import nn

import advbench
from advbench.cli.option_targets import member_attack
from advbench.robustness.attacks.autoattack import AutoAttack
from advbench.robustness.data.digits import load_digits, stratified_split

SIGMA, EPS = 0.3, 0.1
RUNS = {"vote": ("vote", 20), "one_pass": ("vote", 1), "original": ("original", 20)}
"""advbench's runs: the attack's judge and the engine's judge.draws."""


class Noisy(nn.Module):
    """The net behind Gaussian input noise, drawn afresh on every pass: a randomized model."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x + SIGMA * torch.randn_like(x))


def digits(n: int) -> tuple[torch.Tensor, ...]:
    """The training digits and labels, then the first `n` test digits and labels, in [0, 1]."""
    pixels, target = load_digits()
    train, test = stratified_split(target, 0.3, 0)
    x = torch.from_numpy(pixels.astype(np.float32)).unsqueeze(1) / 16
    y = torch.from_numpy(target.astype(np.int64))
    return x[train], y[train], x[test][:n], y[test][:n]


def trained(x: torch.Tensor, y: torch.Tensor) -> nn.Module:
    """A two-convolution net, 15 epochs of Adam on clean digits (seeded: the same weights every run)."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1, stride=2),
                        nn.ReLU(), nn.Flatten(), nn.Linear(32 * 16, 10))
    opt = torch.optim.Adam(net.parameters(), lr=3e-3)
    for _ in range(15):
        for i in range(0, len(x), 64):
            opt.zero_grad()
            nn.functional.cross_entropy(net(x[i:i + 64]), y[i:i + 64]).backward()
            opt.step()
    return net.eval()


def ours(model: nn.Module, x: torch.Tensor, y: torch.Tensor, run: str, seed: int) -> str:
    judge, draws = RUNS[run]
    frame = advbench.evaluate(advbench.Model(model, randomized=True), (x, y), eps=EPS, seed=seed,
                              attack=AutoAttack(build_member=member_attack, version="rand", judge=judge, seed=seed),
                              overrides=["search.enabled=false", f"judge.draws={draws}"])
    robust = (frame["clean_correct"].astype(bool) & ~frame["success_at_budget"].astype(bool)).mean()
    return f"summary line {(frame['adv_pred'] == frame['label']).mean():.2%}, records {robust:.2%}"


def theirs(model: nn.Module, x: torch.Tensor, y: torch.Tensor, seed: int) -> str:
    torch.manual_seed(seed)
    _, pred = Original(model, norm="Linf", eps=EPS, version="rand", seed=seed).run_standard_evaluation(
        x, y, batch_size=len(y))
    return f"{float((pred == y).float().mean()):.2%}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--samples", type=int, default=300)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--only", choices=[*RUNS, "pyautoattack"], action="append", help="these runs only (repeatable)")
    args = p.parse_args()
    torch.set_num_threads(1)
    xtr, ytr, x, y = digits(args.samples)
    model = Noisy(trained(xtr, ytr)).eval()
    for run in args.only or [*RUNS, "pyautoattack"]:
        tic = time.perf_counter()
        line = theirs(model, x, y, args.seed) if run == "pyautoattack" else ours(model, x, y, run, args.seed)
        print(f"{run}: robust accuracy {line} ({time.perf_counter() - tic:.0f} s, {args.samples} digits, "
              f"seed {args.seed})", flush=True)


if __name__ == "__main__":
    main()
