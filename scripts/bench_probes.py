"""Big calls in pieces: HopSkipJump's probe calls on digits and DeepFool's candidate backwards on
ResNet-56, this tree against a checkout of the code before the change, in one run.

Every measurement runs in a fresh subprocess that imports advbench from the root it is given
(this tree, or `--before`: e.g. a `git worktree add --detach /tmp/before <rev>` of the commit
before), one torch thread each, the variants interleaved over `--rounds` (medians):

  * HopSkipJump (ℓ2, untargeted) on the benchmark's `small_cnn` trained for a few seconds on
    scikit-learn's digits (trained once here, its weights handed to every worker), `--batch`
    held-out digits, `--queries` a sample: wall time, and µs/row and minor page faults per
    call of the attack's probe calls (`QueryLog.adversarial`, whatever the oracle calls below
    it), grouped by the call's rows;
  * DeepFool (ℓ2, 10 candidates: 9 a sample) on ResNet-56 with random weights, `--df-batch`
    CIFAR-size uniform-noise images labelled with the model's own predictions, `--df-steps`
    iterations: wall time and the worker's peak resident memory (`ru_maxrss`), next to its
    resident memory before the attack.

Each variant's results are hashed (x_adv, success, first_success, queries or grad_evals) and the
run says whether they agree.

    git worktree add --detach /tmp/before HEAD~2
    python scripts/bench_probes.py --before /tmp/before --out bench_probes.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
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
    p.add_argument("--before", type=Path, required=True, help="a checkout of the code before the change")
    p.add_argument("--queries", type=int, default=2000, help="HopSkipJump's queries per sample")
    p.add_argument("--batch", type=int, default=64, help="held-out digits HopSkipJump attacks at once")
    p.add_argument("--df-batch", type=int, default=64, help="noise images DeepFool attacks at once")
    p.add_argument("--df-steps", type=int, default=2, help="DeepFool's iterations")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds per variant (median)")
    p.add_argument("--out", type=Path, default=Path("bench_probes.json"))
    p.add_argument("--worker", choices=["hsj", "deepfool"], help=argparse.SUPPRESS)
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


def hsj_worker(args: argparse.Namespace) -> dict[str, Any]:
    from advbench.robustness.attacks import queries
    from advbench.robustness.attacks.decision import HopSkipJump
    from advbench.robustness.attacks.oracles import DecisionOracle
    from advbench.robustness.models import build_model
    model = build_model("small_cnn", num_classes=10, in_channels=1)
    model.load_state_dict(torch.load(args.weights))
    model.eval()
    x, y = digits(0)
    x, y = x[1297:1297 + args.batch], y[1297:1297 + args.batch]
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
    from advbench.robustness.attacks.optimized import DeepFool
    from advbench.robustness.attacks.oracles import WhiteBoxOracle
    from advbench.robustness.models import build_model
    torch.manual_seed(0)
    model = build_model("resnet56", num_classes=10, in_channels=3).eval()
    x = torch.rand(args.df_batch, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        y = model(x).argmax(dim=1)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    oracle = WhiteBoxOracle(model, len(y))
    t0 = time.perf_counter()
    res = DeepFool(steps=args.df_steps)(oracle, x, y, eps=torch.full((len(y),), 1.0), norm="l2",
                                        target=None, sample_id=torch.arange(len(y)))
    wall = time.perf_counter() - t0
    return {"wall_s": wall, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "rss_before_attack_mb": rss_before / 1024, "grad_evals": int(oracle.grad_evals.sum()),
            "results": digest(res.x_adv, res.success, res.first_success, oracle.grad_evals)}


def worker(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(args.root))
    import advbench
    if not Path(advbench.__file__).resolve().is_relative_to(args.root.resolve()):
        raise SystemExit(f"advbench imported from {advbench.__file__}, not from {args.root}")
    torch.set_num_threads(1)
    out = hsj_worker(args) if args.worker == "hsj" else deepfool_worker(args)
    print(json.dumps(out))


def spawn(kind: str, root: Path, args: argparse.Namespace, weights: Path) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--worker", kind, "--root", str(root), "--weights", str(weights),
           "--before", str(args.before), "--queries", str(args.queries), "--batch", str(args.batch),
           "--df-batch", str(args.df_batch), "--df-steps", str(args.df_steps)]
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
    out["rounds"] = len(runs)
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    variants = {"before": args.before.resolve(), "after": HERE}
    with tempfile.TemporaryDirectory() as tmp:
        weights = Path(tmp) / "small_cnn.pt"
        sys.path.insert(0, str(HERE))
        train_digits(weights)
        runs: dict[str, list[dict[str, Any]]] = {f"{k}/{v}": [] for k in ("hsj", "deepfool") for v in variants}
        for _ in range(args.rounds):
            for kind in ("hsj", "deepfool"):
                for name, root in variants.items():
                    runs[f"{kind}/{name}"].append(spawn(kind, root, args, weights))
    result = {key: summarise(r) for key, r in runs.items()}
    for kind in ("hsj", "deepfool"):
        before, after = result[f"{kind}/before"], result[f"{kind}/after"]
        result[f"{kind}/same_results"] = before["results"] == after["results"]
        result[f"{kind}/wall_ratio_after_over_before"] = after["wall_s"] / before["wall_s"]
    result["settings"] = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                          if k not in ("worker", "root", "weights")}
    args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
