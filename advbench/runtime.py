"""Where and how wide a job runs: device choice and CPU thread count."""

from __future__ import annotations

import torch

from advbench.errors import AdvbenchError


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
