"""Per-iteration cost of the attacks on metrics against their floor, the metric's own forward+backward.

On one batch of the sample photos' test crops (256x256), the same metric, device and thread
count, interleaved in one process:
  (a) the metric's forward + backward to the input (`score_and_grad`), what one gradient
      iteration cannot beat, timed as a loop of `--steps` passes;
  (b) I-FGSM, MI-FGSM and Korhonen–You per iteration (`--steps` iterations), at a sweep of four
      budgets carried by one call (the rows of the batch are images × budgets).
Times are medians over `--rounds` rounds; every round is kept in the JSON.

    python scripts/bench_iqa.py --metrics niqe cnnqa --batch 8 --out bench_iqa.json
    python scripts/bench_iqa.py --device cuda --batch 64 --metrics paq2piq linearity
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import advbench.core.paths  # noqa: F401  (the ${advbench:cache} resolver of the metric YAML)
from advbench.cli.metrics import build_metric
from advbench.quality.attacks.iterative import IFGSM, MIFGSM, Korhonen
from advbench.quality.attacks.metric_attack import score_and_grad
from advbench.quality.images import as_batch, uap_images
from advbench.quality.metrics.scoring import sync_device

BUDGETS = [1 / 255, 2 / 255, 4 / 255, 8 / 255]


def timed(fn, device: torch.device) -> float:
    sync_device(device)
    start = time.perf_counter()
    fn()
    sync_device(device)
    return time.perf_counter() - start


def bench_metric(name: str, batch: int, steps: int, rounds: int, device: torch.device) -> dict:
    metric = build_metric(name).to(device).eval()
    images = as_batch(uap_images(None, split="test"), -(-batch // len(BUDGETS)))
    x = images.repeat_interleave(len(BUDGETS), 0)[:batch].to(device)
    eps = torch.tensor(BUDGETS, device=device).repeat(len(images))[:batch]
    attacks = {"ifgsm": IFGSM(steps=steps), "mifgsm": MIFGSM(steps=steps), "korhonen": Korhonen(steps=steps)}

    def floor() -> None:
        for _ in range(steps):
            score_and_grad(metric, x)

    runs = {"floor": floor, **{k: (lambda a=a: a.run(metric, x, eps)) for k, a in attacks.items()}}
    for fn in runs.values():  # warm-up (allocator, autotune, NIQE's first fit)
        fn()
    times = {k: [] for k in runs}
    for _ in range(rounds):
        for key, fn in runs.items():
            times[key].append(timed(fn, device) / steps)
    medians = {k: statistics.median(v) for k, v in times.items()}
    return {"metric": name, "batch": batch, "steps": steps, "device": str(device), "seconds_per_iteration": medians,
            "ratio_to_floor": {k: medians[k] / medians["floor"] for k in attacks}, "rounds": times}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--metrics", nargs="+", default=["niqe", "cnnqa"])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    results = [bench_metric(m, args.batch, args.steps, args.rounds, device) for m in args.metrics]
    for r in results:
        per = r["seconds_per_iteration"]
        shown = ", ".join(f"{k} {1e3 * per[k]:.1f} ms ({r['ratio_to_floor'][k]:.2f}x)" for k in r["ratio_to_floor"])
        print(f"{r['metric']} b{r['batch']} on {r['device']}: floor {1e3 * per['floor']:.1f} ms/iteration; {shown}")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump(results, fh, indent=1)


if __name__ == "__main__":
    main()
