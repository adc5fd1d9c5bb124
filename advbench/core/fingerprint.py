"""A user's network by what it computes: its outputs on a fixed, seeded probe batch, hashed.

The code digests (`digests.code_digest`) see the files a network's classes come from, not
what the running process holds: a module-level flag set after import, a value captured in a
closure, a helper patched at run time all change what `forward` computes while every file
stays the same. The outputs on a fixed input change with them, so their digest goes into the
cell key beside the code's: records of another behaviour are another cell, never a skip.

Why a digest in the key rather than outputs stored and compared with a tolerance: the key is
what every reuse is checked against (`core.cells.claim_cell`, against the part's `cell_key`),
before any record is read, and two behaviours get two part files side by side instead of
overwriting each other's. For the digest to be the same on every rerun of the same network on
one machine, the probe is computed the same way each time: the same inputs (drawn from a
generator seeded with PROBE_SEED, not torch's global one), torch's global RNG seeded inside
`fork_rng` (a randomized network draws the same noise, and the caller's random state is left as
it was), the network in the mode the cell runs it in (the callers' eval mode, which keeps a
randomized model's dropout drawing; every `training` flag as it was after), one CPU thread (a
reduction split over threads may round differently from one thread count to another, and
`threads=` changes it between two calls of one process) and cuDNN's deterministic algorithms
without TF32. The outputs are then rounded to DIGITS significant digits of their largest
magnitude, so that the last bits of a GPU's arithmetic do not make a new cell: an edit that
moves no output by that much keeps the key (it changes no number a record states to that
precision), and outputs that land on either side of a rounding step only make one cell
computed twice, never old records reused.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import math
from collections.abc import Iterator, Sequence

import torch
from torch import nn

from advbench.core.errors import AdvbenchError, first_line

PROBE_SEED = 0
"""Seeds the probe's inputs and the random draws a network makes on them."""

DIGITS = 5
"""Significant digits (of the largest output) the fingerprint keeps."""


def behaviour_digest(module: nn.Module, input_shape: Sequence[int], what: str, samples: int = 4) -> str:
    """sha256 of `module`'s outputs, rounded, on `samples` uniform images of `input_shape` (C, H, W).

    `module` is run in the mode it is in: the caller puts it in the one its cell evaluates it in
    (`robustness.models.classifier.evaluation_mode`, `QualityMetric.eval`). The inputs go to the device
    and dtype of its first floating tensor; `what` names it in the one-line error of a failing pass.
    """
    device, dtype = _placement(module)
    shape = (int(samples), *(int(s) for s in input_shape))
    probe = torch.rand(shape, generator=torch.Generator().manual_seed(PROBE_SEED)).to(device, dtype)
    modes = [(sub, sub.training) for sub in module.modules()]
    try:
        with _reproducible(device), torch.no_grad():
            out = module(probe)
    except Exception as exc:  # the user's network on the probe: its message is the diagnosis
        raise AdvbenchError(f"{what} fails on a probe batch of {'x'.join(map(str, shape))} inputs: "
                            f"{type(exc).__name__}: {first_line(exc)}") from None
    finally:
        for sub, training in modes:
            sub.training = training
    if not isinstance(out, torch.Tensor):
        raise AdvbenchError(f"{what} must return a tensor, got {type(out).__name__}")
    return rounded_digest(out)


def rounded_digest(out: torch.Tensor) -> str:
    """sha256 of a tensor's shape and values on a grid of DIGITS significant digits of its largest
    finite magnitude (the grid's step in the digest, so outputs scaled by ten differ), NaN and
    infinities by kind."""
    values = out.detach().to("cpu", torch.float64)
    finite = torch.isfinite(values)
    scale = float(values[finite].abs().max()) if bool(finite.any()) else 0.0
    exponent = math.floor(math.log10(scale)) - DIGITS + 1 if scale > 0 else 0
    grid = torch.where(finite, torch.round(values / 10.0 ** exponent), torch.zeros_like(values)).to(torch.int64)
    kinds = torch.where(values.isnan(), 1, torch.where(values == math.inf, 2, torch.where(values == -math.inf, 3, 0)))
    digest = hashlib.sha256(repr((tuple(values.shape), exponent)).encode())
    digest.update(grid.contiguous().numpy().tobytes())
    digest.update(kinds.to(torch.int8).contiguous().numpy().tobytes())
    return digest.hexdigest()


def _placement(module: nn.Module) -> tuple[torch.device, torch.dtype]:
    for tensor in itertools.chain(module.parameters(), module.buffers()):
        if tensor.is_floating_point():
            return tensor.device, tensor.dtype
    return torch.device("cpu"), torch.float32


@contextlib.contextmanager
def _reproducible(device: torch.device) -> Iterator[None]:
    """One CPU thread, cuDNN deterministic without TF32, full-precision float32 matmuls and torch's
    RNG seeded with PROBE_SEED inside; the caller's settings and random state back after."""
    threads, precision = torch.get_num_threads(), torch.get_float32_matmul_precision()
    cuda = list(range(torch.cuda.device_count())) if device.type == "cuda" else []
    torch.set_num_threads(1)
    torch.set_float32_matmul_precision("highest")
    try:
        with torch.random.fork_rng(devices=cuda), \
                torch.backends.cudnn.flags(enabled=torch.backends.cudnn.enabled, benchmark=False, deterministic=True,
                                           allow_tf32=False):
            torch.random.default_generator.manual_seed(PROBE_SEED)
            if cuda:  # only then: seeding would otherwise queue a seed for a CUDA not yet started
                torch.cuda.manual_seed_all(PROBE_SEED)
            yield
    finally:
        torch.set_num_threads(threads)
        torch.set_float32_matmul_precision(precision)
