"""Per-image gradient attack in the spirit of MAD competition (Wang & Simoncelli 2008).

MADC pits two metrics against each other: push one as far as possible while holding the
other fixed. The seed uses it as the slow, image-specific reference for its UAP (Table 1):
raise the target metric while the MSE to the original stays below the amplitude level,
1,000 gradient steps per image. Here every image of a batch is attacked at once, with a
per-image step size t:

    candidate = P(delta + t * g / rms(g))     (g: gradient of the metric's goodness)
    P: scale back onto the MSE ball mse <= budget, then clip x + delta to [0, 1]
    accept the candidate if the metric improved (t *= 1.2), else keep delta (t /= 2)

Accepting only improvements makes the attack monotone even on metrics whose score is
rough at the pixel scale (NIQE's patch statistics change abruptly); each step costs one
forward and backward pass, the same as plain gradient ascent. The start step is a fraction
`lr` of the ball's radius. `budget = amplitude ** mse_power`: the seed's text bounds the MSE
by the amplitude itself (`mse_power=1`); `mse_power=2` bounds the RMS change by the amplitude
instead, the same scale as a UAP of that amplitude.
"""

from __future__ import annotations

import time

import torch

from advbench.core.errors import AdvbenchError
from advbench.quality.metrics.base import QualityMetric
from advbench.quality.uap import check_amplitude, device_of, goodness, sync_device


def _goodness_and_grad(metric: QualityMetric, x: torch.Tensor, delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    delta = delta.detach().requires_grad_(True)
    good = goodness(metric, metric(x + delta))
    (grad,) = torch.autograd.grad(good.sum(), delta)
    return good.detach(), grad


def madc_batch(metric: QualityMetric, images: torch.Tensor, budget: float | torch.Tensor, steps: int, lr: float,
               linf: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Attack one batch (on the metric's device): images with MSE <= budget (per image when a tensor)
    and a higher metric; `linf` bounds every pixel's change as well.

    Returns the attacked images and the goodness of the kept candidate after each of the
    `steps - 1` candidate steps, (N, steps - 1).
    """
    x = images
    dims = tuple(range(1, x.dim()))
    shape = (-1,) + (1,) * (x.dim() - 1)
    budget = torch.as_tensor(budget, dtype=x.dtype, device=x.device).expand(len(x))
    delta = torch.zeros_like(x)
    good, grad = _goodness_and_grad(metric, x, delta)
    step = lr * budget.sqrt()
    kept = []
    for _ in range(steps - 1):
        with torch.no_grad():
            rms = grad.pow(2).mean(dims).sqrt().clamp_min(1e-12)
            cand = delta + (step / rms).view(shape) * grad
            mse = cand.pow(2).mean(dims).clamp_min(1e-20)
            cand = cand * (budget / mse).sqrt().clamp(max=1.0).view(shape)
            if linf is not None:
                cand = torch.maximum(torch.minimum(cand, linf.view(shape)), -linf.view(shape))
            cand = (x + cand).clamp(0, 1) - x
        cand_good, cand_grad = _goodness_and_grad(metric, x, cand)
        better = cand_good > good
        keep = better.view(shape)
        delta = torch.where(keep, cand, delta)
        grad = torch.where(keep, cand_grad, grad)
        good = torch.where(better, cand_good, good)
        step = torch.where(better, step * 1.2, step * 0.5)
        kept.append(good)
    trace = torch.stack(kept, 1) if kept else good.unsqueeze(1)
    return (x + delta).detach(), trace


def madc_attack(metric: QualityMetric, images: torch.Tensor, amplitude: float, *, steps: int = 1000,
                lr: float = 0.05, mse_power: float = 1.0, batch_size: int = 8,
                device: str | torch.device | None = None, progress: bool = True) -> tuple[torch.Tensor, float]:
    """Attacked copies of (N, 3, H, W) images (on CPU) and the seconds the attack took."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    a = check_amplitude(amplitude)
    if steps < 1 or not lr > 0 or not mse_power > 0:
        raise AdvbenchError(f"MADC needs steps >= 1, lr > 0 and mse_power > 0; got {steps}, {lr}, {mse_power}")
    dev = device_of(device)
    metric = metric.to(dev).eval()
    out, seconds = [], 0.0
    columns = (TextColumn(f"MADC a={a:g}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with Progress(*columns, disable=not progress) as bar:
        task = bar.add_task("madc", total=len(images))
        for batch in images.split(batch_size):
            batch = batch.to(dev)
            sync_device(dev)
            start = time.perf_counter()
            adv, _ = madc_batch(metric, batch, a ** mse_power, steps, lr)
            sync_device(dev)
            seconds += time.perf_counter() - start
            out.append(adv.cpu())
            bar.advance(task, len(batch))
    return torch.cat(out), seconds
