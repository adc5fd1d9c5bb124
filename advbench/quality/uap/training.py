"""Training a UAP (seed, section 3.1), and the job of `advbench uap train`.

A UAP is trained like network weights (Adam, lr 1e-3, 5 epochs, batch 8) so that
`metric(image + delta)` rises for every training image. The loss is the seed's equation (1),
`loss = 1 - metric(batch + p) / a`, with a the width of the metric's score range. Written with
the metric's *goodness* g = (s - lo) / a (for higher-better metrics, identical to the seed's
s / a when lo = 0) the loss is `1 - g`; a lower-better metric such as NIQE has g = (hi - s) / a
instead, i.e. the sign of the score flips, so minimising the same loss always pushes the
metric towards "better quality".
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from rich.console import Console
from rich.table import Table
from torch.utils.data import DataLoader, Dataset

from advbench.core.errors import AdvbenchError
from advbench.core.records import write_part
from advbench.quality.images import as_batch, uap_images
from advbench.quality.iqa.guard import user_metric_failures
from advbench.quality.metrics.metric_contract import QualityMetric
from advbench.quality.metrics.scoring import device_of, goodness, metric_throughput, signed_gain
from advbench.quality.uap.evaluation import evaluate_uap
from advbench.quality.uap.perturbation import CLAMP, SIZE, save_uap


def uap_loss(metric: QualityMetric, images: torch.Tensor) -> torch.Tensor:
    """The seed's loss 1 - metric(batch + p) / a, in goodness form (see the module docstring)."""
    return 1 - goodness(metric, metric(images)).mean()


def _loader(images: torch.Tensor | Dataset, batch_size: int, seed: int, shuffle: bool) -> DataLoader:
    return DataLoader(images, batch_size=batch_size, shuffle=shuffle,
                      generator=torch.Generator().manual_seed(seed))


def _check_images(images: torch.Tensor | Dataset, size: int) -> None:
    if len(images) == 0:
        raise AdvbenchError("no training images: expected at least one image")
    shape = tuple(images[0].shape)
    if shape != (3, size, size):
        raise AdvbenchError(f"UAP images must be (3, {size}, {size}), got {shape}")


def progress_columns() -> tuple:
    """The training bar: epoch, bar, steps, the last step's loss (`loss_field`), time left."""
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn

    return (TextColumn("UAP epoch {task.fields[epoch]}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[loss]}"), TimeRemainingColumn())


def loss_field(loss: float | None) -> str:
    """The bar's loss text: nothing before the first step has a loss to show (not `loss nan`)."""
    return "" if loss is None else f"loss {loss:.4f}"


def train_uap(metric: QualityMetric, images: torch.Tensor | Dataset, *, size: int = SIZE, clamp: float = CLAMP,
              lr: float = 1e-3, epochs: int = 5, batch_size: int = 8, seed: int = 0,
              device: str | torch.device | None = None, progress: bool = True) -> torch.Tensor:
    """Train a size x size UAP on `images` ((N, 3, size, size) tensor or a data set of such).

    Adam on p (zero start), loss 1 - goodness(metric(clip(batch + p))), p clamped to
    [-clamp, clamp] after every step, images shuffled each epoch with `seed`. Returns p on CPU.
    """
    from rich.progress import Progress

    if epochs < 1 or batch_size < 1 or not clamp > 0:
        raise AdvbenchError(f"UAP training needs epochs >= 1, batch_size >= 1, clamp > 0; "
                            f"got {epochs}, {batch_size}, {clamp}")
    _check_images(images, size)
    dev = device_of(device)
    metric = metric.to(dev).eval()
    torch.manual_seed(seed)
    p = torch.zeros(3, size, size, device=dev, requires_grad=True)
    opt = torch.optim.Adam([p], lr=lr)
    loader = _loader(images, batch_size, seed, shuffle=True)
    with Progress(*progress_columns(), disable=not progress) as bar:
        task = bar.add_task("uap", total=epochs * len(loader), epoch=1, loss=loss_field(None))
        for epoch in range(epochs):
            for batch in loader:
                loss = uap_loss(metric, (batch.to(dev, non_blocking=True) + p).clamp(0, 1))
                (p.grad,) = torch.autograd.grad(loss, p)
                opt.step()
                with torch.no_grad():
                    p.clamp_(-clamp, clamp)
                bar.update(task, advance=1, epoch=epoch + 1, loss=loss_field(loss.item()))
    return p.detach().cpu()


@dataclass(frozen=True)
class UapSettings:
    """The UAP's hyperparameters (`conf/uap/<option>.yaml`, whose defaults these are not: the YAML's are);
    the fields in the YAML's order, as the .pt's metadata lists them."""

    size: int
    clamp: float
    lr: float
    epochs: int
    batch_size: int


@dataclass(frozen=True)
class HeldOut:
    """The held-out images the trained UAP's gains are measured on (`validate:`): folder (None: the sample
    photos' test crops), how many (None: all), the amplitudes."""

    data: str | None
    n_images: int | None
    amplitudes: tuple[float, ...]


@dataclass(frozen=True)
class TrainSpec:
    """What `advbench uap train` runs: the plain values of its config (`conf/uap_train.yaml`)."""

    metric: str                  # the metric option's name: folder and records
    data: str | None             # image folder; None: the sample photos' crops
    subset: int | None
    seed: int
    device: str
    out_dir: str
    progress: bool
    uap: UapSettings
    validate: HeldOut


def source_name(data: Any) -> str:
    """The images' source as records show it: the folder, or `sample-photos`."""
    return str(data) if data else "sample-photos"


def train_job(spec: TrainSpec, metric: QualityMetric) -> Path:
    """Train, save (.pt + .png), measure throughput, record held-out gains; returns the .pt path."""
    name, hp, device = spec.metric, spec.uap, device_of(spec.device)
    images = uap_images(spec.data, split="train", size=hp.size, limit=spec.subset)
    start = time.perf_counter()
    with user_metric_failures(metric, name, f"training the UAP on {len(images)} images"):
        p = train_uap(metric, images, size=hp.size, clamp=hp.clamp, lr=hp.lr, epochs=hp.epochs,
                      batch_size=hp.batch_size, seed=spec.seed, device=device, progress=spec.progress)
    seconds = time.perf_counter() - start
    train_rate = hp.epochs * len(images) / seconds
    with user_metric_failures(metric, name, "timing its forward and backward pass"):
        limit_rate = metric_throughput(metric, as_batch(images, hp.batch_size), device=device)
    data_tag = Path(str(spec.data)).name if spec.data else "photos"
    base = Path(spec.out_dir).expanduser() / name / f"{data_tag}-seed{spec.seed}-n{len(images)}-ep{hp.epochs}"
    meta = {"metric": name, "data": source_name(spec.data), "n_train": len(images), "seed": spec.seed,
            **asdict(hp), "train_seconds": seconds, "device": device.type}
    pt, png = save_uap(p, base, meta)

    check = spec.validate
    val = as_batch(uap_images(check.data, split="test", size=hp.size, limit=check.n_images))
    with user_metric_failures(metric, name, f"scoring the trained UAP's {len(val)} held-out images"):
        clean, attacked, _ = evaluate_uap(metric, val, p, check.amplitudes, batch_size=hp.batch_size,
                                          device=device)
    gains = signed_gain(metric, clean, attacked)
    amps = torch.tensor(list(check.amplitudes), dtype=torch.float64)
    records = pd.DataFrame({
        "metric": name, "data": source_name(spec.data), "seed": spec.seed, "n_train": len(images),
        "epochs": hp.epochs, "lr": hp.lr, "batch_size": hp.batch_size, "device": device.type,
        "amplitude": amps.repeat_interleave(len(val)).numpy(),
        "image": torch.arange(len(val)).repeat(len(amps)).numpy(),
        "score_clean": clean.repeat(len(amps)).numpy(), "score_attacked": attacked.flatten().numpy(),
        "gain": gains.flatten().numpy(), "train_seconds": seconds,
        "train_images_per_s": train_rate, "metric_images_per_s": limit_rate,
    })
    parquet = write_part(records, base.with_suffix(".parquet"))
    _report(name, spec, len(images), seconds, device, train_rate, limit_rate, amps, gains, len(val))
    for path in (pt, png, parquet):
        Console().print(f"wrote {path}")
    return pt


def _report(name: str, spec: TrainSpec, n_images: int, seconds: float, device: torch.device, train_rate: float,
            limit_rate: float, amps: torch.Tensor, gains: torch.Tensor, n_val: int) -> None:
    """The training's lines on the terminal: what was trained, how fast, the held-out gains."""
    hp = spec.uap
    console = Console()
    console.print(f"trained UAP for [bold]{name}[/] on {n_images} images ({source_name(spec.data)}), "
                  f"{hp.epochs} epochs, {seconds:.1f} s on {device.type}")
    console.print(f"throughput: UAP training {train_rate:.1f} images/s; metric forward+backward "
                  f"{limit_rate:.1f} images/s (batch {hp.batch_size})")
    summary = Table(title=f"held-out gain ({n_val} images)")
    for a in amps.tolist():
        summary.add_column(f"a={a:g}", justify="right")
    summary.add_row(*(f"{g:.3f}" for g in gains.mean(1).tolist()))
    console.print(summary)
