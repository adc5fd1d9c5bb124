"""Per-attack throughput beside the peers, in fp32 and bf16, against the network's own forward+backward.

On one CIFAR-size network (PreAct ResNet-18, random weights: no checkpoint or data set is read)
and one batch (512 by default), for each dtype it times:

  * the limit: a forward+backward to the input of the batch, and a forward alone;
  * advbench PGD, APGD-CE, FAB (untargeted, ℓ∞), Square and `autoattack` standard, each beside
    its peer at the same iteration counts and queries: torchattacks 3.5.1's PGD, APGD, FAB and
    Square, and the original AutoAttack standard (`from autoattack import AutoAttack`, as the authors'
    repository installs it, or PyPI's pyautoattack 0.2.0, the same code), with the members'
    iterations lowered alike on both sides so the whole set fits in minutes.

Every attack runs at ε = 1e-6 (ℓ∞) on uniform noise labelled with the model's own predictions:
no sample is broken, so both sides pay every iteration for every sample and the figures measure
cost, never robustness. Each pair runs in alternating rounds (advbench, peer, advbench, peer, …)
after a warm-up, synchronising the device around each call; the median round is reported, with
samples per second, seconds per iteration and that over one forward+backward of the batch. bf16
is advbench's `precision=bf16` deployment: the model's passes under `torch.autocast(bfloat16)`
and their logits widened to fp32, for advbench through its oracles and for the peers and the
limit through the same `runtime.forward` (`Deployed`); attack arithmetic stays fp32 on every side.
A side that fails (a peer without bf16 support, a missing package) gets its error string in the
JSON instead of figures. The JSON is rewritten after every pair, so an interrupted run keeps what
it measured.

    python scripts/bench_gpu.py --device cuda --out bench_gpu.json
    python scripts/bench_gpu.py --device cpu --tiny --out tiny.json
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
import torchattacks
from bench_attacks import TINY_EPS, calibrate_batchnorm, environment, forward_backward, forward_only, interleaved
from torch import nn

from advbench.cli.option_targets import member_attack
from advbench.core.errors import AdvbenchError
from advbench.core.runtime import PRECISIONS, deploy, resolve_device
from advbench.core.runtime import forward as runtime_forward
from advbench.robustness.attacks.apgd import APGD
from advbench.robustness.attacks.attack_contract import Attack
from advbench.robustness.attacks.autoattack import AutoAttack
from advbench.robustness.attacks.fab import FAB
from advbench.robustness.attacks.gradient import PGD
from advbench.robustness.attacks.oracles import Oracle, ScoreOracle, WhiteBoxOracle
from advbench.robustness.attacks.score import Square
from advbench.robustness.models import build_model

ATTACKS = ("pgd", "apgd", "fab", "square", "autoattack")
PGD_REL_STEPSIZE = 0.125  # conf/attack/pgd.yaml's α = 0.125·ε, given to torchattacks as alpha
TARGETS = 9  # AutoAttack standard's APGD-T and FAB-T target classes
ORIGINAL_AUTOATTACK = ("autoattack", "pyautoattack")  # the authors' repository's module name, then PyPI's package


@dataclass(frozen=True)
class Size:
    """A network, a batch and the iteration counts of one bench size."""

    arch: str
    options: dict[str, int]
    batch: int
    steps: int  # PGD steps, APGD and FAB iterations; also the limit's passes per timed call
    queries: int  # Square's queries a sample (advbench's count: torchattacks is given one fewer)
    aa_iters: int  # iterations of each AutoAttack member run: APGD-CE, APGD-T and FAB-T per target
    aa_queries: int  # AutoAttack's Square iterations (the original's n_queries; advbench counts one more)
    rounds: int
    warmup: int
    dtypes: tuple[str, ...] = ("fp32", "bf16")


SIZES = {
    "cifar": Size("preact_resnet18", {}, 512, 10, 100, 10, 100, rounds=3, warmup=1),
    "tiny": Size("resnet56", {"depth": 8, "base_width": 4}, 8, 2, 4, 1, 2, rounds=2, warmup=1, dtypes=("fp32",)),
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="auto", help="cuda, cuda:1, cpu or auto")
    p.add_argument("--size", choices=sorted(SIZES), default="cifar",
                   help="cifar: PreAct ResNet-18 on 3x32x32 at batch 512; tiny: ResNet-8 of width 4, batch 8, 2 steps")
    p.add_argument("--tiny", action="store_const", const="tiny", dest="size", help="the same as --size tiny")
    p.add_argument("--arch", help="another CIFAR-size architecture of advbench (resnet56, wrn28_10, ...)")
    p.add_argument("--batch", type=int, help="inputs attacked at once (512 for cifar, 8 for tiny)")
    p.add_argument("--dtypes", help="comma-separated, of fp32 and bf16 (cifar: both; tiny: fp32)")
    p.add_argument("--attacks", default=",".join(ATTACKS), help=f"comma-separated subset of {','.join(ATTACKS)}")
    p.add_argument("--rounds", type=int, help="timed rounds per side (the median is reported)")
    p.add_argument("--warmup", type=int, help="untimed runs per side before the rounds")
    p.add_argument("--threads", type=int, help="torch CPU threads")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("bench_gpu.json"))
    args = p.parse_args(argv)
    args.attacks = _choices(p, "--attacks", args.attacks, ATTACKS)
    if args.dtypes is not None:
        args.dtypes = _choices(p, "--dtypes", args.dtypes, PRECISIONS)
    for name in ("batch", "rounds"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.warmup is not None and args.warmup < 0:
        p.error(f"--warmup must be >= 0, got {args.warmup}")
    return args


def _choices(p: argparse.ArgumentParser, flag: str, value: str, valid: tuple[str, ...]) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(v.strip() for v in value.split(",") if v.strip()))
    unknown = [n for n in names if n not in valid]
    if unknown or not names:
        p.error(f"{flag}: unknown {', '.join(unknown) or 'empty list'}; valid: {', '.join(valid)}")
    return names


def plan(args: argparse.Namespace) -> Size:
    """The size's settings with the command line's overrides."""
    size = SIZES[args.size]
    overrides = {k: getattr(args, k) for k in ("batch", "rounds", "warmup", "dtypes") if getattr(args, k) is not None}
    if args.arch:
        overrides.update(arch=args.arch, options={})
    return replace(size, **overrides)


def build(size: Size, seed: int, device: torch.device) -> tuple[nn.Module, torch.Tensor]:
    """The network (random weights, BatchNorm statistics of the batch, eval mode) and a noise batch."""
    torch.manual_seed(seed)
    model = build_model(size.arch, num_classes=10, in_channels=3, **size.options).to(device)
    x = torch.rand(size.batch, 3, 32, 32, device=device)
    calibrate_batchnorm(model, x)
    return model.requires_grad_(False), x  # frozen, as the engine's targets are: gradients reach the input only


@dataclass
class Pair:
    """One attack: advbench's and the peer's run at the same settings, and how many iterations that is."""

    iterations: int
    make_ours: Callable[[], Callable[[], Any]]
    peer_name: str
    make_peer: Callable[[], Callable[[], Any]]
    settings: dict[str, Any]


def ours(make: Callable[[], Attack], oracle_cls: type[Oracle], model: nn.Module, x: torch.Tensor,
         y: torch.Tensor) -> Callable[[], Callable[[], Any]]:
    """advbench's side: builds the attack, then runs it on the whole batch through its oracle, as the engine does."""
    eps = torch.full((x.shape[0],), TINY_EPS, device=x.device)

    def built() -> Callable[[], Any]:
        attack = make()
        return lambda: attack(oracle_cls(model, x.shape[0]), x, y, eps=eps, norm="linf")
    return built


def pairs(size: Size, model: nn.Module, peer_model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, Pair]:
    """Each attack of the bench with its peer (given `peer_model`); each side is built only when its pair runs."""
    steps, q = size.steps, size.queries

    def peer(cls: Callable[..., Any], **kw: Any) -> Callable[[], Callable[[], Any]]:
        def built() -> Callable[[], Any]:
            attack = cls(peer_model, eps=TINY_EPS, **kw)
            return lambda: attack(x, y)
        return built

    return {
        "pgd": Pair(steps, ours(lambda: PGD(steps=steps, rel_stepsize=PGD_REL_STEPSIZE), WhiteBoxOracle, model, x, y),
                    "torchattacks PGD", peer(torchattacks.PGD, alpha=PGD_REL_STEPSIZE * TINY_EPS, steps=steps,
                                             random_start=True),
                    {"steps": steps, "rel_stepsize": PGD_REL_STEPSIZE, "random_start": True}),
        "apgd": Pair(steps, ours(lambda: APGD(n_iter=steps, loss="ce"), WhiteBoxOracle, model, x, y),
                     "torchattacks APGD", peer(torchattacks.APGD, steps=steps, loss="ce", n_restarts=1),
                     {"n_iter": steps, "loss": "ce", "n_restarts": 1}),
        "fab": Pair(steps, ours(lambda: FAB(n_iter=steps, final_search=0), WhiteBoxOracle, model, x, y),
                    "torchattacks FAB", peer(torchattacks.FAB, norm="Linf", steps=steps, n_restarts=1,
                                             multi_targeted=False, n_classes=10),
                    {"n_iter": steps, "untargeted over": "every class", "n_restarts": 1, "final_search": 0}),
        "square": Pair(q, ours(lambda: Square(n_queries=q), ScoreOracle, model, x, y),
                       "torchattacks Square", peer(torchattacks.Square, norm="Linf", n_queries=q - 1, p_init=0.8),
                       {"queries": q, "p_init": 0.8, "torchattacks n_queries": q - 1,
                        "why": "torchattacks spends one query more than its n_queries"}),
        "autoattack": autoattack_pair(size, model, peer_model, x, y),
    }


def autoattack_pair(size: Size, model: nn.Module, peer_model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> Pair:
    """AutoAttack standard (APGD-CE, APGD-T, FAB-T, Square) with every member's iterations lowered alike."""
    it, q = size.aa_iters, size.aa_queries
    member_params = {"apgd_ce": {"n_iter": it}, "apgd_t": {"n_iter": it}, "fab_t": {"n_iter": it},
                     "square_autoattack": {"n_queries": q + 1}}

    def original() -> Callable[[], Any]:
        module = original_autoattack()
        settings["original module"] = module.__name__
        adversary = module.AutoAttack(
            peer_model, norm="Linf", eps=TINY_EPS, version="standard", seed=0, device=x.device)
        for apgd in (adversary.apgd, adversary.apgd_targeted):
            apgd_iterations(apgd, it)
        adversary.fab.n_iter, adversary.square.n_queries = it, q
        return lambda: adversary.run_standard_evaluation(x, y, batch_size=x.shape[0])

    settings = {"advbench member_params": member_params, "original": {
        "apgd.n_iter": it, "apgd_targeted.n_iter": it, "fab.n_iter": it, "square.n_queries": q},
        "target_classes": TARGETS, "counted iterations": "APGD-CE + 9 APGD-T + 9 FAB-T runs + Square iterations"}
    advbench = ours(lambda: AutoAttack(build_member=member_attack, version="standard", member_params=member_params, seed=0), WhiteBoxOracle,
                    model, x, y)
    return Pair(it * (1 + 2 * TARGETS) + q, advbench, "original AutoAttack", original, settings)


def original_autoattack() -> ModuleType:
    """The original AutoAttack's module: `autoattack` where the authors' repository is installed, else
    `pyautoattack`; neither is a dependency of advbench, and where neither is, its side records why."""
    for name in ORIGINAL_AUTOATTACK:
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:  # the package is there but broken: say so, do not fall through
                raise
    raise ModuleNotFoundError("the original AutoAttack is not installed: neither `autoattack` "
                              "(pip install git+https://github.com/fra31/auto-attack) nor `pyautoattack`")


def apgd_iterations(apgd: Any, n: int) -> None:
    """The original APGD's iterations and the checkpoints its constructor derives from them."""
    apgd.n_iter = n
    apgd.n_iter_2, apgd.n_iter_min, apgd.size_decr = max(int(0.22 * n), 1), max(int(0.06 * n), 1), max(int(0.03 * n), 1)


def error(exc: BaseException) -> dict[str, str]:
    """A side's failure as the JSON keeps it (its first line); on CUDA the cached memory is freed,
    so a side that ran out of memory does not starve the next one."""
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return {"error": f"{type(exc).__name__}: {exc}".splitlines()[0][:500]}


def time_sides(sides: dict[str, Callable[[], Callable[[], Any]]], size: Size,
               device: torch.device) -> dict[str, dict[str, Any]]:
    """Build and warm up each side, then time the ones that worked in alternating rounds.

    A side that raises (building, warming up or timed) gets its error instead of times; the
    others keep theirs."""
    rows: dict[str, dict[str, Any]] = {}
    live: dict[str, Callable[[], Any]] = {}
    for key, make in sides.items():
        try:
            fn = make()
            for _ in range(size.warmup):
                fn()
            live[key] = fn
        except Exception as exc:  # a peer's failure is a result to record, not a reason to stop
            rows[key] = error(exc)
    try:
        timed = interleaved(live, device, 0, size.rounds)
    except Exception as exc:
        return rows | {key: error(exc) for key in live}
    return rows | {key: {"times": times} for key, (times, _) in timed.items()}


def figures(row: dict[str, Any], batch: int, iterations: int, per_pass: float) -> dict[str, Any]:
    """Median seconds, samples per second, seconds per iteration and that over one forward+backward."""
    if "error" in row:
        return row
    sec = statistics.median(row["times"])
    return {"seconds": sec, "samples_per_s": batch / sec, "iterations": iterations, "per_iter_s": sec / iterations,
            "x_forward_backward": sec / iterations / per_pass, "times": row["times"]}


class Deployed(nn.Module):
    """The model as advbench's oracles call it (`runtime.forward`): its passes under the deployed
    precision's autocast, logits widened to the input's dtype. The peers and the limit get this, so
    in bf16 every side runs the model's passes in bf16 and its own arithmetic in fp32, as
    `precision=bf16` does; a peer under a bare autocast instead gets bf16 logits, which the
    original AutoAttack's and torchattacks' Square index-put into fp32 buffers and fail on."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return runtime_forward(self.model, x)


def measure_dtype(precision: str, size: Size, attacks: tuple[str, ...], model: nn.Module, x: torch.Tensor,
                  device: torch.device, report: Callable[[], None], into: dict[str, Any]) -> None:
    """The limit, then every attack pair, at one precision; `into` is filled and reported as it goes."""
    deployed = Deployed(deploy(model, precision=precision)).eval()
    with torch.no_grad():
        y = deployed(x).argmax(dim=1)
    k = size.steps
    limit = time_sides({"forward+backward": lambda: lambda: [forward_backward(deployed, x, y) for _ in range(k)],
                        "forward": lambda: lambda: [forward_only(deployed, x) for _ in range(k)]}, size, device)
    if "error" in limit["forward+backward"]:
        raise AdvbenchError(f"{precision}: the forward+backward itself failed: {limit['forward+backward']['error']}")
    per_pass = statistics.median(limit["forward+backward"]["times"]) / k
    into["limit"] = {key: figures(row, size.batch, k, per_pass) for key, row in limit.items()}
    into["attacks"] = {}
    _print(precision, "forward+backward", into["limit"]["forward+backward"])
    for name, pair in pairs(size, model, deployed, x, y).items():
        if name not in attacks:
            continue
        sides = {"advbench": pair.make_ours, pair.peer_name: pair.make_peer}
        rows = {key: figures(row, size.batch, pair.iterations, per_pass)
                for key, row in time_sides(sides, size, device).items()}
        entry: dict[str, Any] = {"settings": pair.settings, "sides": rows}
        if all("seconds" in r for r in rows.values()):
            entry["advbench_over_peer"] = rows["advbench"]["seconds"] / rows[pair.peer_name]["seconds"]
        into["attacks"][name] = entry
        for key, row in rows.items():
            _print(precision, f"{name} {key}", row)
        report()


def _print(precision: str, label: str, row: dict[str, Any]) -> None:
    text = row.get("error") or (f"{row['seconds']:.4f} s, {row['samples_per_s']:,.1f} samples/s, "
                                f"{row['per_iter_s'] * 1e3:.2f} ms/iter, {row['x_forward_backward']:.2f}x fwd+bwd")
    print(f"[{precision}] {label}: {text}", flush=True)


def describe(args: argparse.Namespace, size: Size, model: nn.Module, device: torch.device) -> dict[str, Any]:
    """What was run, on what: the settings, the network and the environment."""
    versions = {}
    for package in ORIGINAL_AUTOATTACK:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    env = environment(device) | versions | {"torch_cuda_build": torch.version.cuda, "batch": size.batch, "dtypes": list(size.dtypes)}
    if device.type == "cuda":
        env.update(cudnn_tf32=torch.backends.cudnn.allow_tf32, matmul_tf32=torch.backends.cuda.matmul.allow_tf32)
    return {
        "what": ("throughput only: random weights (no checkpoint is read), uniform noise labelled with the model's "
                 f"own predictions, l-inf eps {TINY_EPS} so that no sample is broken and every side pays every "
                 "iteration for every sample; no figure here says anything about robustness"),
        "timing": (f"median of {size.rounds} alternating rounds (advbench, peer, ...) after {size.warmup} warm-up "
                   "run(s) per side, the device synchronised around each call; x_forward_backward is seconds per "
                   "iteration over one forward+backward to the input of the same batch, timed in the same run"),
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "size": asdict(size),
        "model": {"arch": size.arch, "options": size.options, "weights": "random",
                  "parameters": sum(p.numel() for p in model.parameters()), "input_shape": [size.batch, 3, 32, 32]},
        "environment": env,
        "dtypes": {},
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    device = resolve_device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    size = plan(args)
    started = time.perf_counter()
    model, x = build(size, args.seed, device)
    result = describe(args, size, model, device)

    def report() -> None:
        result["wall_s"] = time.perf_counter() - started
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2))

    for precision in size.dtypes:
        result["dtypes"][precision] = {}
        measure_dtype(precision, size, args.attacks, model, x, device, report, result["dtypes"][precision])
    report()
    return result


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        measure(args)
    except AdvbenchError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
