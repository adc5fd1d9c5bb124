"""Scoring images with a metric: its goodness and signed gains, scores in batches, throughput, the device.

Every job of the quality half (UAP training and Table 1, the stability job, the attacks on
metrics) measures "better" the same way: towards the metric's better end, whatever its direction.
"""

from __future__ import annotations

import time

import torch

from advbench.core.runtime import resolve_device
from advbench.quality.metrics.metric_contract import QualityMetric


def device_of(name: str | torch.device | None) -> torch.device:
    """The quality jobs' `device` (None: `auto`) by the one rule of both halves (`core.runtime.resolve_device`)."""
    return resolve_device("auto" if name is None else str(name))


def sync_device(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def goodness(metric: QualityMetric, scores: torch.Tensor) -> torch.Tensor:
    """Scores mapped so that 1 means the best end of the metric's range and 0 the worst."""
    lo, hi = metric.score_range
    width = metric.range_width
    return (scores - lo) / width if metric.higher_better else (hi - scores) / width


def signed_gain(metric: QualityMetric, before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
    """after - before in the metric's units, sign flipped for lower-better metrics (positive = "better")."""
    diff = after - before
    return diff if metric.higher_better else -diff


def metric_throughput(metric: QualityMetric, batch: torch.Tensor, repeats: int = 3,
                      device: str | torch.device | None = None) -> float:
    """Images per second of the metric's own forward + backward (w.r.t. the input) on `batch`.

    The upper bound for UAP training speed: one UAP step is exactly one such pass plus Adam.
    """
    dev = device_of(device)
    metric = metric.to(dev).eval()
    x = batch.to(dev).requires_grad_(True)
    torch.autograd.grad(metric(x).sum(), x)  # warm-up (allocator, cuDNN autotune)
    sync_device(dev)
    start = time.perf_counter()
    for _ in range(repeats):
        torch.autograd.grad(metric(x).sum(), x)
    sync_device(dev)
    return repeats * len(batch) / (time.perf_counter() - start)


@torch.no_grad()
def score(metric: QualityMetric, images: torch.Tensor, batch_size: int = 8,
          device: str | torch.device | None = None) -> torch.Tensor:
    """Metric scores of (N, 3, H, W) images in batches, on CPU."""
    dev = device_of(device)
    metric = metric.to(dev).eval()
    return torch.cat([metric(b.to(dev)).float().cpu() for b in images.split(batch_size)])
