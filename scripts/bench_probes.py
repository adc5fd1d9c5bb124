"""Big calls in pieces: HopSkipJump's probe calls on digits and DeepFool's candidate backwards on
ResNet-56, this tree against a checkout of the code before the change and/or Foolbox, in one run.

Every measurement runs in a fresh subprocess that imports advbench from the root it is given
(this tree, or `--before`: e.g. a `git worktree add --detach /tmp/before <rev>` of the commit
before), or with `--peer` runs Foolbox's HopSkipJumpAttack and L2DeepFoolAttack on the same
model and inputs, one torch thread each, the variants interleaved over `--rounds` (medians):

  * HopSkipJump (ℓ2, untargeted) on the benchmark's `small_cnn` trained for a few seconds on
    scikit-learn's digits (trained once here, its weights handed to every worker), `--batch`
    held-out digits, `--queries` a sample: wall time, and µs/row and minor page faults per
    call of the attack's probe calls (`QueryLog.adversarial`, whatever the oracle calls below
    it), grouped by the call's rows;
  * DeepFool (ℓ2, 10 candidates: 9 a sample) on ResNet-56 with random weights, `--df-batch`
    CIFAR-size uniform-noise images labelled with the model's own predictions, `--df-steps`
    iterations: wall time and the worker's peak resident memory (`ru_maxrss`), next to its
    peak and its current resident memory before the attack.

Each variant's results are hashed (x_adv, success, first_success, queries or grad_evals) and the
run says whether they agree.

Foolbox's HopSkipJump has no query budget, only `steps`: it gets the number of steps whose
model rows (counted by bench_attacks' `RowCounter`, its start's blend search and every check
included) come closest to the queries this tree's run counted, found by an untimed run that
stops at the first step past them. Its DeepFool gets this tree's steps, candidates and overshoot.

    git worktree add --detach /tmp/before HEAD~2
    python scripts/bench_probes.py --before /tmp/before --out bench_probes.json
    python scripts/bench_probes.py --peer --df-steps 3 --out bench_peers.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parents[1]
BUCKETS = ((0, 512), (512, 3201), (3201, 12800), (12800, 1 << 40))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", type=Path, help="a checkout of the code before the change")
    p.add_argument("--peer", action="store_true", help="also run Foolbox's HopSkipJump and DeepFool")
    p.add_argument("--queries", type=int, default=2000, help="HopSkipJump's queries per sample")
    p.add_argument("--batch", type=int, default=64, help="held-out digits HopSkipJump attacks at once")
    p.add_argument("--df-batch", type=int, default=64, help="noise images DeepFool attacks at once")
    p.add_argument("--df-steps", type=int, default=2, help="DeepFool's iterations")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds per variant (median)")
    p.add_argument("--out", type=Path, default=Path("bench_probes.json"))
    p.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    p.add_argument("--fb-steps", type=int, help=argparse.SUPPRESS)
    p.add_argument("--fb-rows", type=int, help=argparse.SUPPRESS)
    p.add_argument("--root", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--weights", type=Path, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def digest(*tensors: torch.Tensor) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def digits(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The digits and labels (all of them; callers slice the held-out ones after 1,297)."""
    from sklearn.datasets import load_digits
    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0
    return x, torch.tensor(d.target, dtype=torch.long)


def train_digits(path: Path) -> None:
    """bench_square's model (small_cnn, 10 epochs on the first 1,297 digits), saved to `path`."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_square import digits_model

    model, _, _ = digits_model(0)
    torch.save(model.state_dict(), path)


def memory_before() -> dict[str, float]:
    """Resident memory before an attack: the peak so far (`ru_maxrss`, what the attack's peak is
    compared with) and the current resident set (what the attack's own allocations add to)."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return {"rss_before_attack_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "rss_now_before_attack_mb": pages * os.sysconf("SC_PAGE_SIZE") / 2**20}


def digits_batch(args: argparse.Namespace) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    """The trained small_cnn from `--weights` and `--batch` held-out digits with their labels."""
    from advbench.robustness.models import build_model
    model = build_model("small_cnn", num_classes=10, in_channels=1)
    model.load_state_dict(torch.load(args.weights))
    x, y = digits(0)
    return model.eval(), x[1297:1297 + args.batch], y[1297:1297 + args.batch]


def noise_batch(args: argparse.Namespace) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    """ResNet-56 (random weights, seed 0) and `--df-batch` uniform-noise images labelled with its predictions."""
    from advbench.robustness.models import build_model
    torch.manual_seed(0)
    model = build_model("resnet56", num_classes=10, in_channels=3).eval()
    x = torch.rand(args.df_batch, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        y = model(x).argmax(dim=1)
    return model, x, y


def hsj_worker(args: argparse.Namespace) -> dict[str, Any]:
    from advbench.robustness.attacks import queries
    from advbench.robustness.attacks.decision import HopSkipJump
    from advbench.robustness.attacks.oracles import DecisionOracle
    model, x, y = digits_batch(args)
    calls: list[tuple[int, float, int]] = []
    inner = queries.QueryLog.adversarial

    def timed(self: Any, x_cand: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        faults, t0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
        out = inner(self, x_cand, idx)
        calls.append((x_cand.shape[0], time.perf_counter() - t0,
                      resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults))
        return out

    queries.QueryLog.adversarial = timed  # type: ignore[method-assign]
    oracle = DecisionOracle(model, len(y))
    t0 = time.perf_counter()
    res = HopSkipJump(max_queries=args.queries)(oracle, x, y, eps=torch.full((len(y),), 1.0), norm="l2",
                                                 target=None, sample_id=torch.arange(len(y)))
    wall = time.perf_counter() - t0
    norms = (res.x_adv - x).flatten(1).norm(dim=1)[res.success]
    buckets = {}
    for lo, hi in BUCKETS:
        sel = [c for c in calls if lo <= c[0] < hi]
        rows = sum(c[0] for c in sel)
        buckets[f"{lo}-{hi - 1}" if hi < 1 << 40 else f"{lo}+"] = {
            "calls": len(sel), "rows": rows,
            "us_per_row": 1e6 * sum(c[1] for c in sel) / rows if rows else None,
            "faults_per_call": sum(c[2] for c in sel) / len(sel) if sel else None}
    return {"wall_s": wall, "queries": int(oracle.queries.sum()), "median_l2": float(norms.median()),
            "probe_calls": buckets, "results": digest(res.x_adv, res.success, res.first_success, oracle.queries)}


def deepfool_worker(args: argparse.Namespace) -> dict[str, Any]:
    from advbench.robustness.attacks.minimum_norm import DeepFool
    from advbench.robustness.attacks.oracles import WhiteBoxOracle
    model, x, y = noise_batch(args)
    before = memory_before()
    oracle = WhiteBoxOracle(model, len(y))
    t0 = time.perf_counter()
    res = DeepFool(steps=args.df_steps)(oracle, x, y, eps=torch.full((len(y),), 1.0), norm="l2",
                                        target=None, sample_id=torch.arange(len(y)))
    wall = time.perf_counter() - t0
    return {"wall_s": wall, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            **before, "grad_evals": int(oracle.grad_evals.sum()), "found": float(res.success.float().mean()),
            "results": digest(res.x_adv, res.success, res.first_success, oracle.grad_evals)}


class _Enough(Exception):
    """Raised at the first Foolbox HopSkipJump step that starts past the counted rows wanted."""


def foolbox_hsj_worker(args: argparse.Namespace) -> dict[str, Any]:
    """Foolbox's HopSkipJump (ℓ2) on the digits: `--fb-steps` steps timed, or with `--fb-rows` an
    untimed run that records the model rows each step starts at, until one starts past them."""
    import foolbox
    from bench_attacks import RowCounter
    model, x, y = digits_batch(args)
    counted = RowCounter(model).eval()
    fmodel = foolbox.PyTorchModel(counted, bounds=(0.0, 1.0))
    attack = foolbox.attacks.HopSkipJumpAttack(steps=args.fb_steps or 1 << 20, constraint="l2")
    if args.fb_rows is not None:
        starts: list[int] = []
        estimate = attack.approximate_gradients

        def counting(*a: Any, **kw: Any) -> Any:
            starts.append(counted.rows)  # rows of the steps before this one (and of the start)
            if counted.rows > args.fb_rows:
                raise _Enough
            return estimate(*a, **kw)

        attack.approximate_gradients = counting  # type: ignore[method-assign]
        try:
            attack(fmodel, x, y, epsilons=None)
        except _Enough:
            pass
        steps = min(range(len(starts)), key=lambda j: abs(starts[j] - args.fb_rows))
        return {"steps": steps, "rows": starts[steps]}
    t0 = time.perf_counter()
    _, x_adv, success = attack(fmodel, x, y, epsilons=None)
    wall = time.perf_counter() - t0
    norms = (x_adv - x).flatten(1).norm(dim=1)[success]
    return {"wall_s": wall, "queries": counted.rows, "steps": args.fb_steps, "median_l2": float(norms.median()),
            "found": float(success.float().mean())}


def foolbox_deepfool_worker(args: argparse.Namespace) -> dict[str, Any]:
    """Foolbox's L2DeepFoolAttack with this tree's DeepFool settings, timed, with peak RSS."""
    import foolbox

    from advbench.robustness.attacks.minimum_norm import DeepFool
    model, x, y = noise_batch(args)
    rows = [0]  # not bench_attacks' RowCounter: importing it adds ~110 MB (rich, torchattacks) to the RSS measured
    model.register_forward_pre_hook(lambda _, inp: rows.__setitem__(0, rows[0] + inp[0].shape[0]))
    ours = DeepFool(steps=args.df_steps)
    attack = foolbox.attacks.L2DeepFoolAttack(steps=ours.steps, candidates=ours.candidates, overshoot=ours.overshoot)
    fmodel = foolbox.PyTorchModel(model, bounds=(0.0, 1.0))
    before = memory_before()
    t0 = time.perf_counter()
    _, x_adv, success = attack(fmodel, x, y, epsilons=None)
    wall = time.perf_counter() - t0
    return {"wall_s": wall, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            **before, "model_rows": rows[0], "found": float(success.float().mean()),
            "results": digest(x_adv, success)}


WORKERS = {"hsj": hsj_worker, "deepfool": deepfool_worker, "foolbox-hsj": foolbox_hsj_worker,
           "foolbox-deepfool": foolbox_deepfool_worker}


def worker(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(args.root))
    import advbench
    if not Path(advbench.__file__).resolve().is_relative_to(args.root.resolve()):
        raise SystemExit(f"advbench imported from {advbench.__file__}, not from {args.root}")
    torch.set_num_threads(1)
    print(json.dumps(WORKERS[args.worker](args)))


def spawn(kind: str, root: Path, args: argparse.Namespace, weights: Path, *extra: str) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--worker", kind, "--root", str(root), "--weights", str(weights),
           "--queries", str(args.queries), "--batch", str(args.batch),
           "--df-batch", str(args.df_batch), "--df-steps", str(args.df_steps), *extra]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True, env={"OMP_NUM_THREADS": "1",
                                                                                "PATH": "/usr/bin:/bin"})
    return json.loads(done.stdout.strip().splitlines()[-1])


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians of the numbers over the rounds; the rest (results, counts) from the first round."""
    out = dict(runs[0])
    for key, value in runs[0].items():
        if isinstance(value, float):
            out[key] = statistics.median(r[key] for r in runs)
    if "probe_calls" in out:
        out["probe_calls"] = {
            b: {**v, "us_per_row": None if v["us_per_row"] is None
                else statistics.median(r["probe_calls"][b]["us_per_row"] for r in runs)}
            for b, v in runs[0]["probe_calls"].items()}
    out["rounds"], out["walls"] = len(runs), [r["wall_s"] for r in runs]
    return out


def rounds(args: argparse.Namespace, variants: dict[str, Path], weights: Path) -> dict[str, list[dict[str, Any]]]:
    """Every variant's runs, interleaved round by round; Foolbox's HopSkipJump steps are found
    (untimed) after this tree's first run, whose counted queries they are matched to."""
    runs: dict[str, list[dict[str, Any]]] = {}
    steps: list[str] = []
    for _ in range(args.rounds):
        for kind in ("hsj", "deepfool"):
            for name, root in variants.items():
                runs.setdefault(f"{kind}/{name}", []).append(spawn(kind, root, args, weights))
            if not args.peer:
                continue
            if kind == "hsj" and not steps:
                target = runs["hsj/after"][0]["queries"]
                found = spawn("foolbox-hsj", HERE, args, weights, "--fb-rows", str(target))
                steps = ["--fb-steps", str(found["steps"])]
            runs.setdefault(f"{kind}/foolbox", []).append(
                spawn(f"foolbox-{kind}", HERE, args, weights, *(steps if kind == "hsj" else [])))
    return runs


def ratios(result: dict[str, Any], other: str) -> None:
    """This tree's wall time (and DeepFool's peak RSS) over variant `other`'s, into `result`: the
    median of the rounds' ratios (a round's runs follow each other, under nearly the same load)."""
    for kind in ("hsj", "deepfool"):
        theirs, after = result[f"{kind}/{other}"], result[f"{kind}/after"]
        per_round = [a / b for a, b in zip(after["walls"], theirs["walls"])]
        result[f"{kind}/wall_ratio_after_over_{other}"] = statistics.median(per_round)
        result[f"{kind}/wall_ratios_after_over_{other}_per_round"] = per_round
    theirs, after = result[f"deepfool/{other}"], result["deepfool/after"]
    result[f"deepfool/peak_rss_ratio_after_over_{other}"] = after["peak_rss_mb"] / theirs["peak_rss_mb"]
    # What the attack added over the memory resident before it (meaningful where it set a new peak).
    grown = [r["peak_rss_mb"] - r["rss_now_before_attack_mb"] for r in (after, theirs)]
    result[f"deepfool/attack_rss_ratio_after_over_{other}"] = grown[0] / grown[1] if grown[1] > 0 else None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    variants = {"after": HERE} | ({"before": args.before.resolve()} if args.before else {})
    with tempfile.TemporaryDirectory() as tmp:
        weights = Path(tmp) / "small_cnn.pt"
        sys.path.insert(0, str(HERE))
        train_digits(weights)
        result: dict[str, Any] = {key: summarise(r) for key, r in rounds(args, variants, weights).items()}
    if args.before:
        for kind in ("hsj", "deepfool"):
            result[f"{kind}/same_results"] = result[f"{kind}/before"]["results"] == result[f"{kind}/after"]["results"]
        ratios(result, "before")
    if args.peer:
        ratios(result, "foolbox")
    result["settings"] = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                          if k not in ("worker", "root", "weights", "fb_steps", "fb_rows")}
    args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
