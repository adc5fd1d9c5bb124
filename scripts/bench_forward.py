"""What one forward+backward of the digits net costs per row, by call size, in one run.

The floor every attack iteration on digits stands on (`bench_square.digits_model`'s small_cnn,
one torch thread): the call sizes are timed round-robin over `--rounds` (medians), each call
repeated to about 2,048 rows. Run it with `PYTHONPATH=<another checkout>` to time that one's
models beside this one's figures.

    OMP_NUM_THREADS=1 python scripts/bench_forward.py --rounds 5
    OMP_NUM_THREADS=1 python scripts/bench_forward.py --rounds 5 --scale 4
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable

import torch
from bench_attacks import forward_backward, interleaved
from bench_square import digits_model

SIZES = (8, 16, 32, 64, 128, 256)
ROWS = 2048


def loop(net: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, size: int) -> Callable[[], None]:
    xb, yb = x[:size].contiguous(), y[:size]
    return lambda: [forward_backward(net, xb, yb) for _ in range(max(1, ROWS // size))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="round-robin rounds (median)")
    parser.add_argument("--scale", type=int, default=1, help="digits enlarged this many times (4: 32 x 32)")
    args = parser.parse_args(argv)
    rounds = args.rounds
    torch.set_num_threads(1)
    net, x, y = digits_model(max(SIZES), args.scale)
    timed = interleaved({size: loop(net, x, y, size) for size in SIZES}, torch.device("cpu"), 1, rounds)
    for size in SIZES:
        per_row = statistics.median(timed[size][0]) / (max(1, ROWS // size) * size)
        print(f"{size:4d} rows: {per_row * 1e6:6.1f} µs/row")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
