"""Per-iteration work of PGD outside the model, counted on the CPU: ATen operations and host syncs.

On a GPU every ATen operation is a kernel launch the host pays for, and a host sync (`nonzero`,
`.item()`, `bool(t)`, a boolean-mask gather) drains the device's queue, so the host's launches of
the next pass are no longer hidden behind the device's work. Neither depends on the device, so
both are counted here without one, by intercepting every ATen call (`TorchDispatchMode`): for
advbench's PGD through its white-box oracle, torchattacks' PGD and the bare forward+backward to
the input (the limit), at two step counts at a budget no sample breaks at, so the difference over
the extra steps is the cost of one iteration, and what the limit does per pass is subtracted.
A sync is named by its operation: `nonzero` waits for everything queued on the device;
`_local_scalar_dense` is a read of a scalar, which advbench's PGD makes of the count of unbroken
rows that on CUDA it has copied to pinned host memory behind the verdict (`gradient._Screen`), so
there the host waits for the verdict alone, not for the backward queued after it.

    python scripts/bench_step_ops.py
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torchattacks
from bench_attacks import TINY_EPS, calibrate_batchnorm, forward_backward, write_result
from torch.utils._python_dispatch import TorchDispatchMode

from advbench.robustness.attacks.gradient import PGD
from advbench.robustness.attacks.oracles import WhiteBoxOracle
from advbench.robustness.models import build_model

SYNCS = {"aten::nonzero", "aten::_local_scalar_dense", "aten::is_nonzero", "aten::masked_select"}
VIEWS = {"aten::view", "aten::_unsafe_view", "aten::reshape", "aten::detach", "aten::alias", "aten::expand",
         "aten::t", "aten::unsqueeze", "aten::squeeze", "aten::slice", "aten::select", "aten::as_strided",
         "aten::split", "aten::split_with_sizes", "aten::unbind"}


class Ops(TorchDispatchMode):
    """Counts ATen calls that run a kernel (views excluded) and the host syncs among them."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()
        self.syncs = 0
        self.sync_names: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        name = func._schema.name
        masked = name in ("aten::index", "aten::index_put_") and any(
            i is not None and i.dtype == torch.bool for i in args[1])
        if name in SYNCS or masked:
            self.syncs += 1
            self.sync_names[name] += 1
        if name not in VIEWS:
            self.ops[name] += 1
        return func(*args, **(kwargs or {}))


def counted(fn: Callable[[], Any]) -> Ops:
    with Ops() as ops:
        fn()
    return ops


def per_iteration(make: Callable[[int], Callable[[], Any]], low: int,
                  high: int) -> tuple[float, float, Counter[str], dict[str, float]]:
    """Operations, syncs, operations by name and syncs by name per iteration: the difference between two step counts."""
    a, b = counted(make(low)), counted(make(high))
    steps = high - low
    by_name = Counter({k: (b.ops[k] - a.ops[k]) / steps for k in b.ops if b.ops[k] != a.ops[k]})
    syncs = {k: (b.sync_names[k] - a.sync_names[k]) / steps for k in b.sync_names if b.sync_names[k] != a.sync_names[k]}
    return (sum(b.ops.values()) - sum(a.ops.values())) / steps, (b.syncs - a.syncs) / steps, by_name, syncs


def measure(args: argparse.Namespace) -> dict[str, Any]:
    torch.manual_seed(0)
    model = build_model("resnet56", num_classes=10, in_channels=3, depth=8, base_width=4)
    x = torch.rand(args.batch, 3, 32, 32)
    calibrate_batchnorm(model, x)
    model.requires_grad_(False)
    with torch.no_grad():
        y = model(x).argmax(dim=1)
    eps = torch.full((args.batch,), TINY_EPS)
    sides = {
        "forward+backward": lambda k: lambda: [forward_backward(model, x, y) for _ in range(k)],
        "advbench PGD": lambda k: lambda: PGD(steps=k)(WhiteBoxOracle(model, args.batch), x, y, eps=eps, norm="linf"),
        "torchattacks PGD": lambda k: lambda: torchattacks.PGD(model, eps=TINY_EPS, alpha=0.125 * TINY_EPS, steps=k,
                                                               random_start=True)(x, y),
    }
    rows = {name: per_iteration(make, args.low, args.high) for name, make in sides.items()}
    limit = rows["forward+backward"][2]
    out = {}
    for name, (ops, syncs, by_name, sync_names) in rows.items():
        outside = {k: v - limit.get(k, 0) for k, v in by_name.items() if v != limit.get(k, 0)}
        out[name] = {"ops_per_iteration": ops, "syncs_per_iteration": syncs, "syncs_by_name": sync_names,
                     "ops_outside_the_model": sum(outside.values()), "outside_by_name": outside}
        print(f"{name:18s} {ops:6.1f} ops/iter  {syncs:3.1f} syncs/iter {sync_names or ''}  "
              f"{sum(outside.values()):5.1f} ops/iter beyond one forward+backward")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--low", type=int, default=4)
    p.add_argument("--high", type=int, default=8)
    p.add_argument("--out", type=Path, default=Path("bench_step_ops.json"))
    args = p.parse_args(argv)
    if not 1 <= args.low < args.high:
        p.error("need 1 <= --low < --high")
    return write_result(args.out, measure(args))


if __name__ == "__main__":
    sys.exit(main())
