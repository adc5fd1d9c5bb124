"""FAB and PGD with EOT beside torchattacks' FAB and EOTPGD, in one process, alternating rounds, at two batch sizes.

On one CIFAR-size network (a ResNet-8 of width 8, random weights, BatchNorm statistics of the
batch: no checkpoint or data set is read) and uniform noise labelled with the model's own
predictions, for each batch size it times, side by side and round-robin after a warm-up:

  * FAB: advbench's untargeted ℓ∞ FAB (`final_search=0`) and torchattacks 3.5.1's FAB
    (`multi_targeted=False`, 10 classes), the same iterations, at ε = 1e-6, so no sample is
    broken within ε and both sides run every iteration on every sample;
  * EOT: advbench's PGD through its white-box oracle on a randomized model, its gradient an EOT
    mean over `--eot` passes (the model's `eot_samples`), vote off (`draws=1`: the attack's cost
    alone), and torchattacks' EOTPGD with `eot_iter` the same, the same steps and step size, at
    ε = 1e-6 (every sample pays every step). Two randomized models: `random_resize_pad`, whose
    draws are keyed per row (on CUDA advbench stacks the passes as copies in one call; on the CPU
    a call a pass, `draws.STACKED_ON`), and a network with dropout kept active, a user's model on
    torch's generator (a call a pass);
  * the vote on its own line: `judge.draws` (20) fresh forward passes of the batch, the price of
    judging each example on a randomized model by its output distribution, which torchattacks
    does not pay; an attack pays it on the rows one pass calls adversarial, the engine once a cell;
  * judged (`--what judged`): where samples do break, PGD-10 with the vote on (`judge.draws` = 20,
    the default) beside EOTPGD at the same gradient passes (a randomized model's samples run every
    step on both sides), on the digits small_cnn of `bench_square.py` at the digits budget
    ε∞ = 0.2, with `--eot` passes and with one; the time advbench spent in its votes is printed
    apart, and the ratio without it.

The median round of each side is printed with advbench / peer. The same script on an older
checkout (PYTHONPATH pointing at it) gives the before figures.

    python scripts/bench_fab_eot.py --threads 1 --rounds 5 --out bench_fab_eot.json
    python scripts/bench_fab_eot.py --threads 1 --rounds 5 --what judged --batches 64,256 --out bench_judged.json
    python scripts/bench_fab_eot.py --device cuda --batches 64,512 --out bench_fab_eot_cuda.json
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torchattacks
from bench_attacks import TINY_EPS, calibrate_batchnorm, environment, interleaved, write_result
from bench_square import digits_model
from torch import nn

from advbench.core.runtime import resolve_device
from advbench.robustness.attacks import oracles
from advbench.robustness.attacks.fab import FAB
from advbench.robustness.attacks.gradient import PGD
from advbench.robustness.attacks.model_draws import RowCalls
from advbench.robustness.attacks.oracles import WhiteBoxOracle
from advbench.robustness.attacks.votes import vote
from advbench.robustness.defenses.wrappers import RandomResizePad
from advbench.robustness.models import build_model

PGD_REL_STEPSIZE = 0.125  # conf/attack/pgd.yaml's α = 0.125·ε
JUDGE_DRAWS = 20  # conf/config.yaml's judge.draws
DIGITS_EPS, JUDGED_STEPS = 0.2, 10  # conf/dataset/digits.yaml's ε∞, conf/attack/pgd.yaml's steps
WHAT = ("fab", "eot", "vote", "judged")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", default="16,64", help="comma-separated batch sizes")
    p.add_argument("--what", default="fab,eot,vote", help=f"comma-separated subset of {', '.join(WHAT)}")
    p.add_argument("--fab-iters", type=int, default=10)
    p.add_argument("--steps", type=int, default=5, help="PGD / EOTPGD steps")
    p.add_argument("--eot", type=int, default=10, help="EOT passes per gradient")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--threads", type=int)
    p.add_argument("--device", default="cpu", help="cpu, cuda or auto")
    p.add_argument("--out", type=Path, default=Path("bench_fab_eot.json"))
    args = p.parse_args(argv)
    args.batches = [int(b) for b in args.batches.split(",")]
    args.what = [w.strip() for w in args.what.split(",")]
    if any(b < 1 for b in args.batches) or min(args.fab_iters, args.steps, args.eot, args.rounds) < 1:
        p.error("batch sizes, --fab-iters, --steps, --eot and --rounds must be >= 1")
    if unknown := set(args.what) - set(WHAT):
        p.error(f"--what: unknown {', '.join(sorted(unknown))}; valid: {', '.join(WHAT)}")
    return args


class Dropout(nn.Module):
    """A user's randomized model: the network behind dropout kept active in eval mode, drawing
    from torch's generator (no `keyed_draws`), EOT over `eot_samples` passes."""

    randomized, grad_mode = True, "eot"

    def __init__(self, model: nn.Module, eot_samples: int) -> None:
        super().__init__()
        self.model, self.eot_samples, self.bounds = model, eot_samples, (0.0, 1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(nn.functional.dropout(x, 0.1, training=True))


def network(seed: int, x: torch.Tensor) -> nn.Module:
    torch.manual_seed(seed)
    model = build_model("resnet56", num_classes=10, in_channels=3, depth=8, base_width=8).to(x.device)
    calibrate_batchnorm(model, x)
    return model.requires_grad_(False)


def sides(what: str, args: argparse.Namespace, model: nn.Module, x: torch.Tensor,
          y: torch.Tensor) -> dict[str, dict[str, Callable[[], Any]]]:
    """Each pair of this measurement, advbench's side first."""
    n = x.shape[0]
    tiny, ids = torch.full((n,), TINY_EPS, device=x.device), torch.arange(n, device=x.device)
    if what == "fab":
        fab = FAB(n_iter=args.fab_iters, final_search=0)
        ta = torchattacks.FAB(model, norm="Linf", eps=TINY_EPS, steps=args.fab_iters, n_restarts=1,
                              multi_targeted=False, n_classes=10)
        return {f"FAB-{args.fab_iters} linf": {
            "advbench": lambda: fab(WhiteBoxOracle(model, n), x, y, eps=tiny, norm="linf"),
            "torchattacks": lambda: ta(x, y)}}
    if what == "vote":
        keyed = RandomResizePad(model, eot_samples=args.eot).eval()
        return {f"vote of {JUDGE_DRAWS} passes, {name}": {
            "advbench": lambda m=m: vote(m, x, y, None, JUDGE_DRAWS, calls=RowCalls(ids), rows=ids)}
            for name, m in (("random_resize_pad", keyed), ("dropout", Dropout(model, args.eot).eval()))}
    pairs = {}
    pgd = PGD(steps=args.steps, rel_stepsize=PGD_REL_STEPSIZE)
    for name, m in (("random_resize_pad", RandomResizePad(model, eot_samples=args.eot).eval()),
                    ("dropout", Dropout(model, args.eot).eval())):
        ta = torchattacks.EOTPGD(m, eps=TINY_EPS, alpha=PGD_REL_STEPSIZE * TINY_EPS, steps=args.steps,
                                 eot_iter=args.eot, random_start=True)
        pairs[f"PGD-{args.steps} EOT-{args.eot}, {name}, vote off"] = {
            "advbench": lambda m=m: pgd(WhiteBoxOracle(m, n, draws=1), x, y, eps=tiny, norm="linf"),
            "torchattacks": lambda ta=ta: ta(x, y)}
    return pairs


class VoteClock:
    """Wall seconds each advbench run spent in its oracle's votes (`Oracle.verdict` confirming the
    rows its one-pass screen calls adversarial): installed in place of the oracles' `vote`."""

    def __init__(self) -> None:
        self.vote, self.runs, self.seconds = oracles.vote, [], 0.0

    def __enter__(self) -> VoteClock:
        oracles.vote = self
        return self

    def __exit__(self, *exc: object) -> None:
        oracles.vote = self.vote

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        tic = time.perf_counter()
        out = self.vote(*args, **kwargs)
        self.seconds += time.perf_counter() - tic
        return out

    def run(self, fn: Callable[[], Any]) -> Any:
        """`fn()`, its vote seconds kept in `runs`."""
        self.seconds = 0.0
        out = fn()
        self.runs.append(self.seconds)
        return out


def judged(args: argparse.Namespace, net: nn.Module, x: torch.Tensor, y: torch.Tensor,
           clock: VoteClock) -> dict[str, dict[str, Callable[[], Any]]]:
    """PGD-10 judged by the default 20-draw vote beside EOTPGD, equal gradient passes, where samples break."""
    n, pairs = x.shape[0], {}
    eps = torch.full((n,), DIGITS_EPS, device=x.device)
    pgd = PGD(steps=JUDGED_STEPS, rel_stepsize=PGD_REL_STEPSIZE)
    for passes in dict.fromkeys((args.eot, 1)):
        for name, m in (("random_resize_pad", RandomResizePad(net, rate=0.75, eot_samples=passes).eval()),
                        ("dropout", Dropout(net, passes).eval())):
            ta = torchattacks.EOTPGD(m, eps=DIGITS_EPS, alpha=PGD_REL_STEPSIZE * DIGITS_EPS, steps=JUDGED_STEPS,
                                     eot_iter=passes, random_start=True)
            pairs[f"PGD-{JUDGED_STEPS} EOT-{passes}, {name}, vote of {JUDGE_DRAWS}"] = {
                "advbench": lambda m=m: clock.run(lambda: pgd(WhiteBoxOracle(m, n, draws=JUDGE_DRAWS), x, y, eps=eps,
                                                              norm="linf")),
                "torchattacks": lambda ta=ta: ta(x, y)}
    return pairs


def timed_rows(label: str, fns: dict[str, Callable[[], Any]], args: argparse.Namespace, device: torch.device,
               clock: VoteClock | None) -> dict[str, Any]:
    """One pair (or single) timed in alternating rounds, its medians printed on one line."""
    before = len(clock.runs) if clock is not None else 0
    timed = interleaved(fns, device, args.warmup, args.rounds)
    row = {side: {"median_s": statistics.median(t), "times": t} for side, (t, _) in timed.items()}
    line = "  ".join(f"{side} {v['median_s']:.3f} s" for side, v in row.items())
    if "torchattacks" in row:
        row["advbench_over_peer"] = row["advbench"]["median_s"] / row["torchattacks"]["median_s"]
        line += f"  advbench/peer {row['advbench_over_peer']:.2f}x"
    if clock is not None:
        votes = clock.runs[before:][-args.rounds:]  # the timed rounds' advbench runs, not the warm-up's
        row["advbench_votes_s"] = {"median_s": statistics.median(votes), "times": votes}
        rest = statistics.median(t - v for t, v in zip(row["advbench"]["times"], votes))
        row["advbench_without_votes_over_peer"] = rest / row["torchattacks"]["median_s"]
        line += (f"\n{'':64s}of which votes {statistics.median(votes):.3f} s;"
                 f"  without them advbench/peer {row['advbench_without_votes_over_peer']:.2f}x")
    print(f"{label:62s}  {line}", flush=True)
    return row


def measure(args: argparse.Namespace) -> dict[str, Any]:
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    rows: dict[str, Any] = {}
    clock = VoteClock() if "judged" in args.what else None
    with clock if clock is not None else contextlib.nullcontext():
        for batch in args.batches:
            x = torch.rand(batch, 3, 32, 32, generator=torch.Generator().manual_seed(batch)).to(device)
            model = network(0, x).eval()
            with torch.no_grad():
                y = model(x).argmax(dim=1)
            for what in args.what:
                if what == "judged":
                    net, xd, yd = digits_model(batch)
                    pairs = judged(args, net.to(device).requires_grad_(False), xd.to(device), yd.to(device), clock)
                else:
                    pairs = sides(what, args, model, x, y)
                for label, fns in pairs.items():
                    rows[f"batch {batch}: {label}"] = timed_rows(f"batch {batch:4d}  {label}", fns, args, device,
                                                                 clock if what == "judged" else None)
    return {"config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "environment": environment(device), "rows": rows}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return write_result(args.out, measure(args))


if __name__ == "__main__":
    sys.exit(main())
