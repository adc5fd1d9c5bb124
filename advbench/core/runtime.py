"""Where and how a job runs: device, CPU thread count, and the model's precision, memory
format and batch size on the device."""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable, Iterator
from typing import Any

import torch

from advbench.core.errors import AdvbenchError

ONEDNN_PRIMITIVES = 8192
"""Compiled oneDNN primitives a process keeps (oneDNN's own default is 1024), set below unless the
user set ONEDNN_PRIMITIVE_CACHE_CAPACITY.

torch's CPU convolutions compile a primitive per layer, pass (forward, backward) and batch
size. An attack that drops broken samples calls the model at hundreds of batch sizes, about six
primitives each for the digits net, so 1,024 entries thrash and every call recompiles: 256
distinct sizes, forward+backward, took 1.5 s on every repeat against 0.75 s once cached, for
about 20 MB more memory (docs/performance.md). oneDNN reads the variable when it builds its
first primitive, so it takes effect here, before any model runs. Cached or compiled anew, a
primitive computes the same bits.
"""
os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", str(ONEDNN_PRIMITIVES))


def resolve_device(name: str) -> torch.device:
    """`auto` picks CUDA when present; asking for CUDA without one is a one-line error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise AdvbenchError(f"device '{name}' requested but no CUDA device is available; use device=cpu")
    return torch.device(name)


def set_threads(threads: int | None) -> None:
    """Cap torch's CPU threads (null keeps torch's default of one per core).

    Tiny models (the digits net) spend more in thread hand-offs than in arithmetic, and
    parallel sweeps (joblib launcher) oversubscribe the cores; one thread per job is faster.
    """
    if threads is None:
        return
    if threads < 1:
        raise AdvbenchError(f"threads must be >= 1 or null, got {threads}")
    torch.set_num_threads(int(threads))


@contextlib.contextmanager
def threads_for(threads: int) -> Iterator[None]:
    """torch's CPU threads set to `threads` inside the block, restored after it."""
    before = torch.get_num_threads()
    set_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# ---- the GPU fast path: precision, memory format, batch size ------------------------------

PRECISIONS = ("fp32", "bf16")
"""`precision`: the arithmetic of the model's forward and backward passes (never the attack's)."""

CPU_AUTO_BATCH = 256
"""`batch_size=auto` on the CPU: host memory is not the limit there, and a forward+backward is
compute-bound, so the cost per sample barely moves beyond a few hundred samples
(docs/performance.md, "batch_size=auto"), while larger batches coarsen progress and resumption."""

AUTO_START = 256
"""The first batch `batch_size=auto` tries on CUDA, doubled while it fits, then bisected."""

AUTO_MARGIN = 0.8
"""The fraction of the largest fitting forward+backward batch that `batch_size=auto` uses: headroom
for the attack's own per-sample state (iterate, gradient, APGD's best point) and fragmentation."""


CPU_PROBE_ROWS = 8 * CPU_AUTO_BATCH
"""The most rows one forward-only call of probes (a decision attack's labels) takes on the CPU.
The cost per row is flat from a few hundred to a few thousand rows (12-17 µs on the digits net,
one thread) and 2-3× that from 12,800 rows, where a call's activations outgrow the memory the
allocator reuses and are paged in afresh on every call (90k page faults a call)."""

PROBE_ELEMENTS = 1 << 24
"""On CUDA, one forward-only call of probes takes as many rows as hold this many input elements
(64 MB of float32): HopSkipJump's probe tensors were already bounded so, so device calls keep
their size, which keeps the device full."""


def probe_rows(sample: torch.Tensor) -> int:
    """The most rows of inputs like `sample` (one row) that one forward-only call of probes takes."""
    if sample.device.type != "cuda":
        return CPU_PROBE_ROWS
    return max(1, PROBE_ELEMENTS // max(1, sample.numel()))


def grad_rows(batch: int, device: torch.device) -> int:
    """The most rows one forward+backward takes when an attack evaluates several rows a sample
    (DeepFool's candidate classes): on the CPU `CPU_AUTO_BATCH` (beyond it the cost per row does
    not fall, the memory grows); on CUDA the batch itself, `batch` samples: `batch_size=auto` fit
    one forward+backward a sample, so k rows a sample would need k times the memory it found."""
    if device.type != "cuda":
        return CPU_AUTO_BATCH
    return max(1, batch)


def pieces(rows: int, size: int) -> list[slice]:
    """Consecutive slices of at most `size` rows covering `rows` rows, as few as may be and of
    near-equal length: no small remainder, whose kernels (a BLAS path for few rows) may round a
    row differently from a big call's. One (empty) slice for no rows: the call still runs once."""
    count = max(1, math.ceil(rows / size))
    step = max(1, math.ceil(rows / count))
    return [slice(s, s + step) for s in range(0, count * step, step)]


def call_slices(rows: int, call_rows: int | None) -> list[slice]:
    """Consecutive slices of at most `call_rows` rows covering `rows` (a cell's batches, when the
    rows are its pool); one slice for no rows, so a call still runs once."""
    size = max(1, rows if call_rows is None else call_rows)
    return [slice(s, s + size) for s in range(0, max(rows, 1), size)]


def deploy(model: torch.nn.Module, *, precision: str = "fp32", channels_last: bool = False) -> torch.nn.Module:
    """Set how the model runs wherever the benchmark evaluates it (oracles and the engine's
    success judgement, through `forward`): bf16 autocast or fp32, channels_last or contiguous.

    Stored as attributes on the model, like `grad_mode` and `randomized` of the defense wrappers,
    so every oracle reads them without extra arguments. Returns the model.
    """
    if precision not in PRECISIONS:
        raise AdvbenchError(f"unknown precision '{precision}'; valid: {', '.join(PRECISIONS)}")
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    model.precision = precision
    model.channels_last = bool(channels_last)
    return model


def autocast(precision: str, device: torch.device | str) -> contextlib.AbstractContextManager[Any]:
    """bf16 autocast on the device's type for `bf16`, nothing for `fp32`."""
    if precision == "bf16":
        return torch.autocast(torch.device(device).type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def as_input(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """`x` in the memory format the model was deployed with (a no-op when it already is)."""
    if getattr(model, "channels_last", False) and x.dim() == 4:
        return x.contiguous(memory_format=torch.channels_last)
    return x


def forward(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The model's logits at `x` in its deployed precision and memory format, in `x`'s dtype.

    Inputs, perturbations and everything computed from the logits keep their precision
    (float32, or float64 where a test or user asks for it): only the model's own arithmetic
    (and its backward) runs under autocast, and bf16 logits come back widened.
    """
    device = x.device
    with autocast(str(getattr(model, "precision", "fp32")), device):
        out = model(as_input(model, x))
    return out if out.dtype == x.dtype else out.to(torch.promote_types(out.dtype, x.dtype))


def fit_batch(trial: Callable[[int], None], cap: int, *, start: int = AUTO_START,
              margin: float = AUTO_MARGIN) -> tuple[int, int]:
    """The batch size to use and the largest batch `trial` ran without running out of memory.

    Doubles from `start` while a batch fits (up to `cap`), then bisects between the largest
    fitting and the smallest failing size until they are within 1/16 of each other; the result
    is `margin` of the largest fitting (at least 1), or `cap` itself when nothing up to it
    failed. Not even one sample fitting is a one-line error.
    """
    ok, bad = 0, cap + 1   # largest size known to fit, smallest known not to
    size = max(1, min(start, cap))
    while bad - ok > max(1, ok // 16):
        try:
            trial(size)
            ok = size
        except torch.OutOfMemoryError:
            bad = size
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        size = min(2 * ok, cap) if bad > cap else (ok + bad) // 2
        if size <= ok:
            break
    if ok == 0:
        raise AdvbenchError("batch_size=auto: not even one sample's forward+backward fits in device memory")
    return (ok if bad > cap else max(1, int(ok * margin))), ok


def auto_batch_size(model: torch.nn.Module, sample: torch.Tensor, cap: int, device: torch.device) -> int:
    """`batch_size=auto`: on CUDA, `fit_batch` over the deployed model's forward+backward to the
    input (what one attack iteration allocates) on copies of `sample`; on the CPU, `CPU_AUTO_BATCH`.
    Never more than `cap` (the samples to evaluate)."""
    if device.type != "cuda":
        return max(1, min(CPU_AUTO_BATCH, cap))

    def trial(size: int) -> None:
        x = sample.to(device).expand(size, *sample.shape).clone().requires_grad_(True)
        logits = forward(model, x)
        grad, = torch.autograd.grad(logits.logsumexp(dim=1).sum(), x)
        del logits, grad, x
        torch.cuda.synchronize(device)

    with torch.enable_grad():
        size, _ = fit_batch(trial, cap)
    torch.cuda.empty_cache()
    return size


def batch_size(value: int | str, model: torch.nn.Module, sample: torch.Tensor, cap: int, device: torch.device) -> int:
    """The batch size of a cell: `value` itself, or for `auto` what `auto_batch_size` finds for
    one input like `sample` and at most `cap` samples."""
    if value == "auto":
        return auto_batch_size(model, sample, max(1, cap), device)
    return int(value)


def execution_identity(precision: str, channels_last: bool) -> dict[str, Any]:
    """What precision and memory format add to a cell's key: both change the model's rounding,
    so the numbers; nothing for fp32 contiguous, so cells run before the options existed keep their key."""
    if precision == "fp32" and not channels_last:
        return {}
    return {"precision": precision, "channels_last": bool(channels_last)}
