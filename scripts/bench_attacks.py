"""Attack cost against its limit, the model's own forward+backward, in one run on one batch.

Measures, on the same model, batch and device:
  (a) forward + backward to the input of one batch, what one attack iteration cannot beat
      (timed as a loop of as many passes as the attacks take iterations, like them);
  (b) our BIM per iteration, at a budget so small that every sample stays active, so early
      stopping cannot flatter the figure;
  (c) torchattacks PGD per iteration, and (d) Foolbox LinfPGD if `import foolbox` works;
  (d') our APGD-CE and torchattacks' APGD (CE) per iteration, at the same tiny budget;
  (a') the forward pass alone (the cost of a forward-only probe, as a fraction of (a));
  (e) the whole ε-curve against one fixed-budget run (`evaluate_batch`, search off, then on with
      `search.method` bisect and margin): gradient evaluations, forward-only passes (`queries`)
      and both in units of a full run (every sample, every iteration), forwards weighted by (a');
  (g) with --score: Square (score-based, ℓ∞) batched against one sample at a time, in queries
      per second, at a budget no sample breaks at (every sample pays every query);
  (h) with --decision: Boundary and Evolutionary (decision-based, ℓ2) the same way, on the model
      with its mean logits over the batch subtracted (a random network labels nearly all noise
      with one class, which leaves no adversarial start), every sample paying every query;
  (f) with --minnorm: whole runs of DeepFool-ℓ2 and C&W-ℓ2 and of Foolbox's on the same batch,
      per sample (they stop per sample, so per iteration means nothing), with the model
      evaluations each side made and the median minimum ℓ2 each found.
Times are the minimum over repeats (other load only ever adds time); every repeat is kept in
the JSON.
Inputs are uniform noise labelled with the model's own predictions and the weights are
random (no data set or checkpoint is read): cost per iteration does not depend on either,
but the search cost does depend on how many samples break at `--eps`, so it is printed too.

    python scripts/bench_attacks.py --model resnet56 --batch 128 --out bench.json
    python scripts/bench_attacks.py --model wrn34_10 --device cuda --amp --channels-last
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import math
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import torchattacks
from rich.console import Console
from rich.table import Table
from torch import nn

from advbench.core.errors import AdvbenchError
from advbench.core.runtime import as_input, deploy, resolve_device
from advbench.core.runtime import autocast as runtime_autocast
from advbench.core.steps import lp_norm
from advbench.robustness.attacks.apgd import APGD
from advbench.robustness.attacks.attack_contract import Attack
from advbench.robustness.attacks.boundary import Boundary
from advbench.robustness.attacks.carlini_wagner import CarliniWagnerL2
from advbench.robustness.attacks.evolutionary import Evolutionary
from advbench.robustness.attacks.gradient import BIM
from advbench.robustness.attacks.minimum_norm import DeepFool
from advbench.robustness.attacks.oracles import (
    DecisionOracle,
    Oracle,
    ScoreOracle,
    WhiteBoxOracle,
)
from advbench.robustness.attacks.score import Square
from advbench.robustness.evaluation.measure import evaluate_batch
from advbench.robustness.models import build_model
from advbench.robustness.specs import SearchSettings
from advbench.robustness.threat import ThreatModel

# Input shape of each architecture's data set, and the flags that map to its size options.
INPUTS = {"small_cnn": (1, 8, 8), "resnet56": (3, 32, 32), "wrn34_10": (3, 32, 32)}
SIZE_OPTIONS = {"small_cnn": {"width": "width"}, "resnet56": {"depth": "depth", "width": "base_width"},
                "wrn34_10": {"depth": "depth", "width": "widen_factor"}}
# A budget no sample can be broken at: the per-iteration figures keep every sample active.
TINY_EPS = 1e-6
REL_STEPSIZE = 0.15


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=sorted(INPUTS), default="resnet56")
    p.add_argument("--depth", type=int, help="network depth (resnet56: 6n+2, wrn34_10: 6n+4)")
    p.add_argument("--width", type=int, help="width option: small_cnn width, resnet base width, WRN widen factor")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:1 or auto")
    p.add_argument("--iters", type=int, default=20, help="attack iterations (BIM-20 by default)")
    p.add_argument("--repeats", type=int, default=5, help="timed repeats; the fastest is reported")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--eps", type=float, default=8 / 255, help="ℓ∞ budget of the fixed-budget vs search measurement")
    p.add_argument("--search-repeats", type=int, default=1, help="timed repeats of the fixed-budget and search runs")
    p.add_argument("--amp", action="store_true",
                   help="the model's passes under bf16 autocast, as `precision=bf16` (attack arithmetic stays fp32)")
    p.add_argument("--channels-last", action="store_true", help="model and inputs in channels_last, as `channels_last=true`")
    p.add_argument("--threads", type=int, help="torch CPU threads")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--minnorm", action="store_true", help="also time DeepFool and C&W against Foolbox's")
    p.add_argument("--cw-iterations", type=int, default=100, help="C&W Adam steps per c (--minnorm)")
    p.add_argument("--cw-search-steps", type=int, default=10, help="C&W binary-search steps over c (--minnorm)")
    p.add_argument("--score", action="store_true", help="also time Square batched vs one sample at a time")
    p.add_argument("--score-queries", type=int, default=100, help="Square's queries per sample (--score)")
    p.add_argument("--decision", action="store_true",
                   help="also time Boundary and Evolutionary batched vs one sample at a time")
    p.add_argument("--decision-queries", type=int, default=200,
                   help="Boundary's and Evolutionary's queries per sample (--decision)")
    p.add_argument("--out", type=Path, default=Path("bench_attacks.json"))
    args = p.parse_args(argv)
    for name in ("batch", "iters", "repeats", "search_repeats", "decision_queries"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    return args


def build(args: argparse.Namespace, device: torch.device) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """The model (random weights, eval mode) and a noise batch labelled with its predictions."""
    torch.manual_seed(args.seed)
    shape = INPUTS[args.model]
    options = {opt: getattr(args, flag) for flag, opt in SIZE_OPTIONS[args.model].items()
               if getattr(args, flag) is not None}
    model = build_model(args.model, num_classes=10, in_channels=shape[0], **options).to(device)
    x = torch.rand(args.batch, *shape, device=device)
    calibrate_batchnorm(model, x)
    model = deploy(model, precision=precision(args), channels_last=args.channels_last)
    x = as_input(model, x)
    with torch.inference_mode(), autocast(args, device):
        y = model(x).argmax(dim=1)
    return model, x, y.clone()


def calibrate_batchnorm(model: nn.Module, x: torch.Tensor) -> None:
    """Set BatchNorm statistics to those of `x`, then switch to eval mode.

    At initialisation the running statistics are (0, 1), which leaves a deep random network
    with exploding activations and margins no small budget can cross; with its statistics
    re-estimated it breaks at budgets like a trained one, so the search figures mean something.
    """
    norms = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # cumulative average: one pass gives the batch statistics exactly
    with torch.no_grad():
        model.train()(x)
    model.eval()


def precision(args: argparse.Namespace) -> str:
    return "bf16" if args.amp else "fp32"


def autocast(args: argparse.Namespace, device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """What `advbench run precision=...` puts around the model, here around the peers' rows and the
    limit too (our attacks get it from the deployed model through their oracle)."""
    return runtime_autocast(precision(args), device)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def interleaved(fns: dict[str, Callable[[], Any]], device: torch.device, warmup: int,
                repeats: int) -> dict[str, tuple[list[float], Any]]:
    """Wall seconds of each callable per repeat, and its last result.

    Repeats run round-robin over the callables, so a change of machine load (other jobs, CPU
    clocks) hits every measurement alike and their ratios stay meaningful.
    """
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    outs: dict[str, Any] = {}
    for _ in range(repeats):
        for key, fn in fns.items():
            sync(device)
            tic = time.perf_counter()
            outs[key] = fn()
            sync(device)
            times[key].append(time.perf_counter() - tic)
    return {k: (times[k], outs[k]) for k in fns}


def forward_only(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """What a forward-only probe costs: logits under inference mode, as the oracle computes them."""
    with torch.inference_mode():
        return model(x)


def forward_backward(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The work of one attack iteration and nothing else: logits, loss, input gradient."""
    xr = x.detach().requires_grad_(True)
    loss = F.cross_entropy(model(xr), y, reduction="sum")
    return torch.autograd.grad(loss, xr)[0]


def foolbox_pgd(model: nn.Module, eps: float, steps: int) -> Callable[[torch.Tensor, torch.Tensor], Any] | None:
    """Foolbox LinfPGD with our step size, or None when foolbox is not installed."""
    try:
        import foolbox
    except ImportError:
        return None
    fmodel = foolbox.PyTorchModel(model, bounds=(0.0, 1.0))
    attack = foolbox.attacks.LinfPGD(rel_stepsize=REL_STEPSIZE, steps=steps, random_start=True)
    return lambda x, y: attack(fmodel, x, y, epsilons=eps)


def attack_cost(attack: Attack, model: nn.Module, x: torch.Tensor, y: torch.Tensor, eps: torch.Tensor) -> WhiteBoxOracle:
    """One run of the attack; its oracle carries the per-sample gradient evaluations."""
    oracle = WhiteBoxOracle(model, x.shape[0])
    attack(oracle, x, y, eps=eps, norm="linf")
    return oracle


def measure(args: argparse.Namespace) -> dict[str, Any]:
    device = resolve_device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    load_before = os.getloadavg()[0]
    model, x, y = build(args, device)
    n, steps = x.shape[0], args.iters
    tiny = torch.full((n,), TINY_EPS, device=device)
    bim = BIM(steps=steps, rel_stepsize=REL_STEPSIZE)
    ta = torchattacks.PGD(model, eps=TINY_EPS, alpha=REL_STEPSIZE * TINY_EPS, steps=steps, random_start=True)
    fb = foolbox_pgd(model, TINY_EPS, steps)
    apgd = APGD(n_iter=steps, loss="ce")
    ta_apgd = torchattacks.APGD(model, eps=TINY_EPS, steps=steps, loss="ce")

    limit_key, ours_key, fwd_key = "forward+backward (limit)", f"advbench BIM-{steps}", "forward only"
    apgd_key = f"advbench APGD-CE-{steps}"
    per_iter: dict[str, Callable[[], Any]] = {
        limit_key: lambda: [forward_backward(model, x, y) for _ in range(steps)],
        fwd_key: lambda: [forward_only(model, x) for _ in range(steps)],
        ours_key: lambda: attack_cost(bim, model, x, y, tiny),
        f"torchattacks PGD-{steps}": lambda: ta(x, y),
        apgd_key: lambda: attack_cost(apgd, model, x, y, tiny),
        f"torchattacks APGD-CE-{steps}": lambda: ta_apgd(x, y),
    }
    if fb is not None:
        per_iter[f"foolbox LinfPGD-{steps}"] = lambda: fb(x, y)
    threat = ThreatModel(norm="linf", goal="untargeted", eps=args.eps)
    search_keys = (f"fixed budget (BIM-{steps}, early stop)", "whole curve, search.method=bisect",
                   "whole curve, search.method=margin")
    settings = (SearchSettings(enabled=False), SearchSettings(method="bisect"), SearchSettings(method="margin"))
    search = {key: (lambda s=st: evaluate_batch(bim, model, x, y, None, threat, s))
              for key, st in zip(search_keys, settings)}
    with autocast(args, device):
        timed = interleaved(per_iter, device, args.warmup, args.repeats)
        timed.update(interleaved(search, device, 0, args.search_repeats))

    limit = min(timed[limit_key][0])
    rows: dict[str, dict[str, Any]] = {}
    for key, (times, _) in timed.items():
        sec = min(times)
        rows[key] = {"seconds": sec, "times": times, "grad_evals": n * steps}
        if key in per_iter:
            rows[key].update(per_iter=sec / steps, x_limit=sec / limit)
    active = float(timed[ours_key][1].grad_evals.float().mean()) / steps
    rows[ours_key].update(grad_evals=int(timed[ours_key][1].grad_evals.sum()),
                          note=f"{active:.0%} of samples active throughout")
    rows[apgd_key].update(grad_evals=int(timed[apgd_key][1].grad_evals.sum()))
    rows[fwd_key].update(grad_evals=0, note=f"{rows[fwd_key]['x_limit']:.2f}x forward+backward: a forward-only probe")

    fwd_ratio = min(timed[fwd_key][0]) / limit
    full = n * steps
    curves = {}
    for key in search_keys:
        out = timed[key][1]
        evals, forwards = int(out["grad_evals"].sum()), int(out["queries"].sum())
        curves[key] = {"grad_evals": evals, "forward_evals": forwards, "x_full_grad": evals / full,
                       "x_full_weighted": (evals + fwd_ratio * forwards) / full}
        rows[key].update(grad_evals=evals, note=f"{evals / full:.2f}x a full run in grad evals, {forwards} forwards, "
                                                f"{curves[key]['x_full_weighted']:.2f}x with forwards at {fwd_ratio:.2f}")
    fixed, searched = timed[search_keys[0]][1], timed[search_keys[2]][1]
    success = float(fixed["success_at_budget"].float().mean())
    wall_ratio = rows[search_keys[2]]["seconds"] / rows[search_keys[0]]["seconds"]
    rows[search_keys[0]]["note"] = f"ε={args.eps:.4g}, {success:.0%} broken at the budget; " + rows[search_keys[0]]["note"]
    if args.minnorm:
        with autocast(args, device):
            rows.update(minimum_norm_rows(args, model, x, y, device))
    if args.score:
        with autocast(args, device):
            rows.update(score_rows(args, model, x, y, device))
    if args.decision:
        with autocast(args, device):
            rows.update(decision_rows(args, model, x, device))
    quartiles = torch.quantile(searched["min_eps"].double(), torch.tensor([0.25, 0.5, 0.75], dtype=torch.float64),
                               interpolation="nearest").tolist()
    return {
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "environment": environment(device) | {"load_avg_1min": [load_before, os.getloadavg()[0]]},
        "model_parameters": sum(p.numel() for p in model.parameters()),
        "input_shape": list(x.shape),
        "search": {"eps": args.eps, "success_at_budget": success, "forward_vs_forward_backward": fwd_ratio,
                   "full_budget_grad_evals": full, "curves": curves, "wall_ratio_margin_vs_fixed": wall_ratio,
                   "min_eps_quartiles": [q if math.isfinite(q) else None for q in quartiles]},
        "rows": rows,
    }


def environment(device: torch.device) -> dict[str, Any]:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or platform.machine()
    versions = {}
    for package in ("torch", "torchattacks", "foolbox"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    return {"device": str(device), "device_name": name, "threads": torch.get_num_threads(),
            "python": platform.python_version(), **versions}


class RowCounter(nn.Module):
    """The model, counting the input rows it evaluates (Foolbox's cost, which it does not report)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model, self.rows = model, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.rows += x.shape[0]
        return self.model(x)


def minimum_norm_rows(args: argparse.Namespace, model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                      device: torch.device) -> dict[str, dict[str, Any]]:
    """Whole DeepFool-ℓ2 and C&W-ℓ2 runs, ours and Foolbox's with the same settings: time per
    sample, model rows evaluated (forward or forward+backward) and the median minimum ℓ2
    (inf where the model does not confirm the example)."""
    n = x.shape[0]
    cw = CarliniWagnerL2(iterations=args.cw_iterations, binary_search_steps=args.cw_search_steps)
    ours: dict[str, Attack] = {"DeepFool-l2": DeepFool(), f"C&W-l2 ({cw.binary_search_steps}x{cw.iterations})": cw}
    counted = RowCounter(model).eval()

    def run_ours(attack: Attack) -> tuple[torch.Tensor, int]:
        oracle = WhiteBoxOracle(model, n)
        res = attack(oracle, x, y, eps=torch.full((n,), 1.0, device=device), norm="l2")
        return res.x_adv, int(oracle.grad_evals.sum() + oracle.queries.sum())

    fns: dict[str, Callable[[], Any]] = {f"advbench {k}": (lambda a=a: run_ours(a)) for k, a in ours.items()}
    try:
        import foolbox
    except ImportError:
        foolbox = None
    if foolbox is not None:
        fmodel = foolbox.PyTorchModel(counted, bounds=(0.0, 1.0))
        df = ours["DeepFool-l2"]
        theirs = {"DeepFool-l2": foolbox.attacks.L2DeepFoolAttack(steps=df.steps, candidates=df.candidates,
                                                                  overshoot=df.overshoot),
                  "C&W-l2": foolbox.attacks.L2CarliniWagnerAttack(
                      binary_search_steps=cw.binary_search_steps, steps=cw.iterations, stepsize=cw.stepsize,
                      confidence=cw.confidence, initial_const=cw.initial_const, abort_early=cw.abort_early)}

        def run_theirs(attack: Any) -> tuple[torch.Tensor, int]:
            counted.rows = 0
            return attack(fmodel, x, y, epsilons=None)[1], counted.rows

        fns.update({f"foolbox {k}": (lambda a=a: run_theirs(a)) for k, a in theirs.items()})
    timed = interleaved(fns, device, 0, args.search_repeats)
    rows = {}
    for key, (times, (x_adv, model_rows)) in timed.items():
        with torch.inference_mode():
            fooled = model(x_adv).argmax(dim=1) != y
        norms = torch.where(fooled, lp_norm(x_adv - x, "l2"), torch.full((n,), math.inf, device=device))
        sec = min(times)
        rows[key] = {"seconds": sec, "times": times, "per_sample": sec / n, "grad_evals": model_rows,
                     "median_min_l2": float(norms.median()), "found": float(fooled.float().mean()),
                     "note": f"{sec / n * 1e3:.2f} ms/sample, median min ℓ2 {float(norms.median()):.4g}, "
                             f"{float(fooled.float().mean()):.0%} found, model rows evaluated"}
    return rows


def score_rows(args: argparse.Namespace, model: nn.Module, x: torch.Tensor, y: torch.Tensor,
               device: torch.device) -> dict[str, dict[str, Any]]:
    """Square's queries per second, batched vs one sample at a time, every sample active throughout."""
    n, q = x.shape[0], args.score_queries
    square = Square(n_queries=q, seed=args.seed)
    return batched_vs_single(f"Square-{q}", square, ScoreOracle, model, x, y, "linf",
                             torch.full((n,), TINY_EPS, device=device))


class CentredLogits(nn.Module):
    """The model minus its mean logits over a batch: top-1 labels that spread over the classes
    like a trained model's (a random network gives nearly all noise one class), at the model's cost."""

    def __init__(self, model: nn.Module, x: torch.Tensor) -> None:
        super().__init__()
        self.model, self.bounds = model, (0.0, 1.0)
        with torch.inference_mode():
            self.register_buffer("offset", model(x).mean(dim=0).clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x) - self.offset


def decision_rows(args: argparse.Namespace, model: nn.Module, x: torch.Tensor,
                  device: torch.device) -> dict[str, dict[str, Any]]:
    """Boundary's and Evolutionary's queries per second, batched vs one sample at a time, on the
    centred model and its own labels: noise starts are adversarial, and no sample converges
    within the budget, so every started sample pays every query."""
    n, q = x.shape[0], args.decision_queries
    centred = CentredLogits(model, x).eval()
    with torch.inference_mode():
        y = centred(x).argmax(dim=1)
    eps = torch.ones(n, device=device)
    rows: dict[str, dict[str, Any]] = {}
    for name, cls in (("Boundary", Boundary), ("Evolutionary", Evolutionary)):
        attack = cls(max_queries=q, checkpoints=[q], seed=args.seed)
        rows.update(batched_vs_single(f"{name}-{q}", attack, DecisionOracle, centred, x, y, "l2", eps))
    return rows


def batched_vs_single(label: str, attack: Attack, oracle_cls: type[Oracle], model: nn.Module, x: torch.Tensor,
                      y: torch.Tensor, norm: str, eps: torch.Tensor) -> dict[str, dict[str, Any]]:
    """Queries per second of a query attack with the whole batch in each oracle call vs a loop over
    the samples (the peers' and the seed's platform's way); one timed run each. A sample's queries
    do not depend on its batch, so both runs pay the same queries."""
    n = x.shape[0]
    ids = torch.arange(n, device=x.device)

    def batched() -> Oracle:
        oracle = oracle_cls(model, n)
        attack(oracle, x, y, eps=eps, norm=norm, sample_id=ids)
        return oracle

    def one_at_a_time() -> Oracle:
        oracle = oracle_cls(model, n)
        for i in range(n):
            attack(oracle.subset(ids[i:i + 1]), x[i:i + 1], y[i:i + 1], eps=eps[i:i + 1], norm=norm,
                   sample_id=ids[i:i + 1])
        return oracle

    keys = (f"advbench {label} batched", f"advbench {label} one sample at a time")
    timed = interleaved(dict(zip(keys, (batched, one_at_a_time))), x.device, 0, 1)
    rows = {}
    for key, (times, oracle) in timed.items():
        queries = int(oracle.queries.sum())
        rows[key] = {"seconds": min(times), "times": times, "grad_evals": 0, "queries": queries,
                     "queries_per_s": queries / min(times),
                     "note": f"{queries / min(times):,.0f} queries/s, {queries / n:.1f} a sample"}
    speedup = rows[keys[0]]["queries_per_s"] / rows[keys[1]]["queries_per_s"]
    rows[keys[0]]["note"] += f", {speedup:.1f}x one sample at a time"
    return rows


def render(result: dict[str, Any]) -> Table:
    cfg = result["config"]
    title = (f"{cfg['model']} ({result['model_parameters']:,} parameters), batch {cfg['batch']} "
             f"on {result['environment']['device']}{', bf16' if cfg['amp'] else ''}"
             f"{', channels_last' if cfg['channels_last'] else ''}")
    table = Table(title=title)
    for col in ("measurement", "ms/batch", "ms/iter", "x limit", "grad evals", "note"):
        table.add_column(col, justify="left" if col in ("measurement", "note") else "right")
    for name, row in result["rows"].items():
        per_iter = f"{row['per_iter'] * 1e3:.1f}" if "per_iter" in row else ""
        ratio = f"{row['x_limit']:.2f}" if "x_limit" in row else ""
        table.add_row(name, f"{row['seconds'] * 1e3:.1f}", per_iter, ratio, str(row["grad_evals"]), row.get("note", ""))
    return table


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        result = measure(args)
    except AdvbenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    Console(width=160).print(render(result))
    return write_result(args.out, result)


def write_result(out: Path, result: dict[str, Any]) -> int:
    """The benchmark's JSON at `out` (its folder made), said on stderr; the script's exit status."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
