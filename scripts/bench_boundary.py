"""Boundary attack (ℓ2, untargeted) at equal counted queries: advbench's schedules, Foolbox's and ART's.

Two digits models trained here, independent of advbench's zoo: the benchmark's `small_cnn`
trained naturally (`bench_square.digits_model`) and the same net adversarially trained
(Madry PGD, ℓ∞ ε = 0.1, 10 steps of ε/4, 15 epochs: the digits `pgd_at` recipe's settings).
The held-out digits the natural model classifies correctly are attacked by

  * advbench `Boundary` with each schedule (`trust_region`, the default, and `paper`), one run
    per budget;
  * Foolbox 3's `BoundaryAttack`, one run per budget: it queries every sample in every call, so
    its cost is the rows its model saw over the batch; its steps are sized to the budget after
    a short run measures its start's cost;
  * ART's `BoundaryAttack` (skipped, with a line saying so, when ART is not installed), one
    sample at a time to the largest budget, every row its classifier predicts counted (ART's
    `max_iter` counts iterations of a few dozen queries, not queries): a call that would pass
    the budget stops the sample, and the closest row the model labelled adversarial before each
    budget is its result there. ART draws its noise start from fresh OS entropy, so its figures
    vary a little from run to run.

Every contender pays one query a sample for the clean label. A sample succeeds where its
attack saw the model misclassify its example (after tens of thousands of queries the examples
lie within rounding of the boundary, where the label of a re-evaluation in another batch size
can flip). The table gives the median ℓ2 over the successful samples and over all samples (a
failure counts inf), the success rate and the wall time of a run to that budget (ART: the time
its samples took to reach it).

    python scripts/bench_boundary.py --samples 64 --out bench_boundary.json
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import foolbox as fb
import numpy as np
import torch
from bench_attacks import RowCounter, environment
from bench_square import digits_model
from sklearn.datasets import load_digits
from torch import nn

from advbench.robustness.attacks.boundary import SCHEDULES, Boundary
from advbench.robustness.attacks.oracles import DecisionOracle
from advbench.robustness.models import build_model


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--samples", type=int, default=64, help="held-out digits attacked (correctly classified)")
    p.add_argument("--budgets", type=int, nargs="+", default=[1000, 5000, 20000], help="queries per sample")
    p.add_argument("--quick", action="store_true", help="16 samples, budgets 500 and 1000")
    p.add_argument("--out", type=Path, default=Path("bench_boundary.json"))
    args = p.parse_args(argv)
    if args.quick:
        args.samples, args.budgets = 16, [500, 1000]
    args.budgets = sorted(set(args.budgets))
    return args


def pgd_at_model(x: torch.Tensor, y: torch.Tensor) -> nn.Module:
    """small_cnn adversarially trained on (x, y): ℓ∞ PGD, ε = 0.1, 10 steps of ε/4, random start."""
    torch.manual_seed(0)
    model = build_model("small_cnn", num_classes=10, in_channels=1)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    eps, alpha = 0.1, 0.025
    for _ in range(15):
        for i in range(0, len(x), 64):
            xb, yb = x[i:i + 64], y[i:i + 64]
            adv = (xb + torch.empty_like(xb).uniform_(-eps, eps)).clamp(0, 1)
            for _ in range(10):
                adv.requires_grad_(True)
                grad, = torch.autograd.grad(nn.functional.cross_entropy(model(adv), yb), adv)
                adv = torch.min(torch.max(adv.detach() + alpha * grad.sign(), xb - eps), xb + eps).clamp(0, 1)
            opt.zero_grad()
            nn.functional.cross_entropy(model(adv), yb).backward()
            opt.step()
    return model.eval()


def norms_of(x: torch.Tensor, x_adv: torch.Tensor, ok: torch.Tensor) -> np.ndarray:
    """ℓ2 distance of each example its attack saw the model misclassify, inf elsewhere."""
    d = (x_adv - x).flatten(1).norm(dim=1)
    return torch.where(ok, d, torch.full_like(d, math.inf)).numpy()


def run_advbench(model: nn.Module, x: torch.Tensor, y: torch.Tensor, budgets: list[int],
                 schedule: str) -> dict[int, tuple[np.ndarray, float]]:
    """One run per budget: its examples' norms and its wall time."""
    n, out = len(y), {}
    for q in budgets:
        oracle = DecisionOracle(model, n)
        t0 = time.perf_counter()
        res = Boundary(max_queries=q, schedule=schedule, checkpoints=[q])(oracle, x, y, eps=torch.zeros(n), norm="l2")
        out[q] = (res.info[f"norm_at_{q}"].numpy(), time.perf_counter() - t0)
        assert int(oracle.queries.max()) <= q
    return out


def run_foolbox(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                budgets: list[int]) -> dict[int, tuple[np.ndarray, float, float]]:
    """One Foolbox run per budget, its steps sized so that rows seen / batch fits the budget."""
    n = len(y)

    def attack(steps: int) -> tuple[np.ndarray, float, float]:
        counted = RowCounter(model).eval()
        torch.manual_seed(0)
        t0 = time.perf_counter()
        _, x_fb, ok = fb.attacks.BoundaryAttack(steps=steps)(fb.PyTorchModel(counted, bounds=(0, 1)), x,
                                                             fb.criteria.Misclassification(y), epsilons=None)
        return norms_of(x, x_fb, ok), time.perf_counter() - t0, counted.rows / n

    start = attack(10)[2] - 11  # the start's queries: ten steps cost 11 (every 10th step judges twice)
    return {q: attack(max(1, int((q - start) * 10 / 11))) for q in budgets}


class Budgeted(Exception):
    """The next predict call would pass the sample's largest budget."""


class CountedSample:
    """ART's predict for one sample: rows counted (from 1, the clean label ART's `generate` pays),
    the closest row the model labelled adversarial kept, and its norm and the time so far recorded
    as each budget is reached (ART's own point is never closer: it picks among those rows)."""

    def __init__(self, predict: Callable[..., np.ndarray], x: np.ndarray, y: int, budgets: list[int]) -> None:
        self.predict, self.x, self.y, self.budgets = predict, x, y, budgets
        self.spent, self.best, self.t0 = 1, math.inf, time.perf_counter()
        self.norms: dict[int, float] = {}
        self.walls: dict[int, float] = {}

    def __call__(self, rows: np.ndarray, *a: Any, **k: Any) -> np.ndarray:
        for q in self.budgets:
            if q not in self.norms and self.spent + len(rows) > q:
                self.record(q)
        if self.spent + len(rows) > self.budgets[-1]:
            raise Budgeted
        self.spent += len(rows)
        rows = rows.astype(np.float32)  # numpy 2 promotes ART's steps to float64, the model takes float32
        out = self.predict(rows, *a, **k)
        adv = out.argmax(1) != self.y
        if adv.any():
            self.best = min(self.best, float(np.linalg.norm((rows[adv] - self.x).reshape(int(adv.sum()), -1),
                                                            axis=1).min()))
        return out

    def record(self, q: int) -> None:
        self.norms[q], self.walls[q] = self.best, time.perf_counter() - self.t0


def run_art(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
            budgets: list[int]) -> dict[int, tuple[np.ndarray, float]] | None:
    """ART's attack one sample at a time (what its `generate` does), every predicted row counted."""
    try:
        from art.attacks.evasion import BoundaryAttack
        from art.estimators.classification import PyTorchClassifier
    except ImportError:
        return None
    logging.getLogger("art").setLevel(logging.ERROR)  # its "found but not optimal" line, once per give-up
    clf = PyTorchClassifier(model, loss=nn.CrossEntropyLoss(), input_shape=tuple(x.shape[1:]), nb_classes=10,
                            clip_values=(0.0, 1.0))
    art = BoundaryAttack(clf, targeted=False, max_iter=max(budgets), verbose=False)
    predict, samples = clf.predict, []
    np.random.seed(0)  # ART's orthogonal steps (its start draws from OS entropy)
    for xi, yi in zip(x.numpy(), y.tolist(), strict=True):
        clf.predict = sample = CountedSample(predict, xi, yi, budgets)
        try:
            art._perturb(xi, -1, yi, None, None, 0.0, 1.0)
        except Budgeted:
            pass
        for q in set(budgets) - set(sample.norms):  # budgets the sample did not reach (ART gave up first)
            sample.record(q)
        samples.append(sample)
    clf.predict = predict
    return {q: (np.array([s.norms[q] for s in samples]), sum(s.walls[q] for s in samples)) for q in budgets}


def summary(d: np.ndarray) -> dict[str, float]:
    ok = np.isfinite(d)
    return {"median_successful": float(np.median(d[ok])) if ok.any() else math.inf,
            "median_all": float(np.median(d)), "success": float(ok.mean())}


def contenders(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
               budgets: list[int]) -> dict[str, Callable[[], dict[int, tuple]]]:
    runs: dict[str, Callable[[], dict[int, tuple]]] = {
        f"advbench Boundary ({s})": (lambda s=s: run_advbench(model, x, y, budgets, s)) for s in SCHEDULES}
    runs["Foolbox BoundaryAttack"] = lambda: run_foolbox(model, x, y, budgets)
    runs["ART BoundaryAttack"] = lambda: run_art(model, x, y, budgets)
    return runs


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    natural, x, y = digits_model(400)
    keep = natural(x).argmax(1) == y
    x, y = x[keep][:args.samples], y[keep][:args.samples]
    d = load_digits()
    robust = pgd_at_model(torch.tensor(d.images[:1297], dtype=torch.float32).unsqueeze(1) / 16.0,
                          torch.tensor(d.target[:1297], dtype=torch.long))
    rows: list[dict[str, Any]] = []
    print("| model | attack | queries | median ℓ2 (successful) | median ℓ2 (all, inf = failed) | success | wall s |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for model_name, model in (("natural", natural), ("pgd_at", robust)):
        for name, run in contenders(model, x, y, args.budgets).items():
            got = run()
            if got is None:
                print(f"| {model_name} | {name} | – | skipped: adversarial-robustness-toolbox is not installed | | | |")
                continue
            for q, (norms, wall, *spent) in got.items():
                s = summary(norms)
                shown = f"{q:,}" if not spent else f"{q:,} ({spent[0]:,.0f})"
                print(f"| {model_name} | {name} | {shown} | {s['median_successful']:.3f} | {s['median_all']:.3f} "
                      f"| {s['success']:.0%} | {wall:.1f} |", flush=True)
                rows.append({"model": model_name, "attack": name, "budget": q, "wall_s": wall,
                             "queries_per_sample": spent[0] if spent else q, **s})
    args.out.write_text(json.dumps({"environment": environment(torch.device("cpu")), "samples": len(y),
                                    "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
