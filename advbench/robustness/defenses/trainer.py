"""The training loop: one recipe on one data set, to one checkpoint file with its meta.

The recipes (`defenses.recipes`) say what a batch's loss is; this module does everything
around it that every recipe shares: seeding, the model (one network or an ADP ensemble),
the data loader, the optimizer and learning-rate schedule, the divergence check, progress
on stderr, the clean accuracy and the checkpoint. Where checkpoints live and when they are
trained is the cache's business (`defenses.trained`).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)
from torch import nn
from torch.utils.data import DataLoader, Dataset

from advbench.core.errors import AdvbenchError
from advbench.core.runtime import resolve_device
from advbench.core.version import __version__
from advbench.robustness.data.image_dataset import ImageDataset
from advbench.robustness.defenses.recipes import LOSSES, OPTIMIZERS, Recipe
from advbench.robustness.models.checkpoint_files import save_checkpoint
from advbench.robustness.models.ensemble import Ensemble
from advbench.robustness.specs import ModelSpec

BatchLoss = Callable[[nn.Module, torch.Tensor, torch.Tensor, Recipe], torch.Tensor]


def _progress(console: Console) -> Progress:
    """A live bar, drawn on a terminal only; rich draws nothing into logs and pipes."""
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    )


def _say(console: Console, line: str) -> None:
    console.print(line, markup=False, highlight=False, soft_wrap=True)


def evaluate_accuracy(model: nn.Module, data: Dataset, device: str = "cpu", batch_size: int = 512) -> float:
    """Top-1 accuracy on a data set whose items start with `(x, y)`."""
    model.eval()
    correct = total = 0
    with torch.inference_mode():
        for batch in DataLoader(data, batch_size=batch_size):
            x, y = batch[0].to(device), batch[1].to(device)
            correct += int((model(x).argmax(1) == y).sum())
            total += len(y)
    if total == 0:
        raise AdvbenchError("cannot evaluate accuracy on an empty evaluation set")
    return correct / total


def build_defended_model(model: ModelSpec, recipe: Recipe | None, num_classes: int,
                         in_channels: int) -> nn.Module:
    """The network a recipe trains: one `model`, or an `Ensemble` of `members` of them."""
    members = 1 if recipe is None else recipe.members
    if members == 1:
        return model.build(num_classes, in_channels)
    return Ensemble([model.build(num_classes, in_channels) for _ in range(members)])


def _optimizers(model: nn.Module, recipe: Recipe) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    """The recipe's optimizer over the model's parameters and its step-wise learning-rate decay."""
    optimizer = OPTIMIZERS[recipe.optimizer](model.parameters(), recipe)
    return optimizer, torch.optim.lr_scheduler.MultiStepLR(optimizer, list(recipe.lr_milestones), recipe.lr_gamma)


def _batch_loss(recipe: Recipe, static_models: Sequence[nn.Module], device: str) -> BatchLoss:
    """The recipe's loss; Ens-AT's static sources go to the device, frozen, bound to it."""
    loss_of = LOSSES[recipe.type]
    if static_models:
        loss_of = partial(loss_of, static_models=[m.to(device).eval().requires_grad_(False) for m in static_models])
    return loss_of


def _step(model: nn.Module, optimizer: torch.optim.Optimizer, loss_of: BatchLoss, x: torch.Tensor, y: torch.Tensor,
          recipe: Recipe, epoch: int) -> float:
    """One optimizer step on a batch; returns its loss, an error if the loss is not finite."""
    loss = loss_of(model, x, y, recipe)
    value = float(loss.detach())  # one device sync per batch, for the check and the bar
    if not math.isfinite(value):
        raise AdvbenchError(f"training diverged: loss {value} in epoch {epoch + 1}; lower defense.recipe.lr")
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return value


def _run_epochs(model: nn.Module, loader: DataLoader, recipe: Recipe, loss_of: BatchLoss, console: Console,
                title: str, device: str) -> float:
    """Train for `recipe.epochs` with a bar (terminal) or a line per epoch (elsewhere); returns the seconds."""
    optimizer, schedule = _optimizers(model, recipe)
    started = time.perf_counter()
    with _progress(console) as bar:
        epochs = bar.add_task(f"{title}: epochs", total=recipe.epochs, status="")
        batches = bar.add_task("batches", total=len(loader), status="")
        for epoch in range(recipe.epochs):
            model.train()
            bar.reset(batches)
            for x, y in loader:
                value = _step(model, optimizer, loss_of, x.to(device), y.to(device), recipe, epoch)
                bar.update(batches, advance=1, status=f"loss {value:.3f}")
            schedule.step()
            bar.update(epochs, advance=1)
            if not console.is_terminal:
                _say(console, f"  epoch {epoch + 1}/{recipe.epochs}: loss {value:.3f}, {time.perf_counter() - started:.1f} s")
    return time.perf_counter() - started


def _meta(dataset: ImageDataset, model: nn.Module, recipe: Recipe, spec: ModelSpec,
          seed: int, device: str, seconds: float) -> dict[str, Any]:
    """The checkpoint's meta: what was trained, how, its clean accuracy, when and by which advbench."""
    return {
        "dataset": dataset.name,
        "architecture": model.arch,
        "recipe": recipe.type,
        "clean_accuracy": evaluate_accuracy(model, dataset.eval_set(), device),
        "config": {"model": {"name": spec.name, **spec.identity()}, "recipe": dataclasses.asdict(recipe), "seed": seed,
                   "budgets": dict(dataset.budgets)},
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "advbench_version": __version__,
        "train_seconds": round(seconds, 3),
    }


def train_defense(
    dataset: ImageDataset,
    spec: ModelSpec,
    recipe: Recipe,
    out: Path,
    device: str = "cpu",
    *,
    seed: int = 0,
    progress: bool = True,
    reason: str = "",
    static_models: Sequence[nn.Module] = (),
    init_state: Mapping[str, torch.Tensor] | None = None,
    extra_meta: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Train the `spec` model on `dataset` with `recipe`, save a checkpoint at `out`, return its meta (which
    records every value of the recipe, its defaults too).

    With `progress`, stderr says what trains and why (`reason`) before the first batch, then
    shows a live bar on a terminal or one line per epoch elsewhere (logs, pipes, CI), so a
    run that trains a defense on first use is never silent. `static_models` are Ens-AT's
    frozen sources of adversarial examples; `init_state` the weights fine-tuning starts from;
    `extra_meta` goes into the checkpoint's meta as given.
    """
    device = resolve_device(device)
    torch.manual_seed(seed)
    model = build_defended_model(spec, recipe, dataset.num_classes, dataset.input_shape[0])
    if init_state is not None:
        model.load_state_dict(init_state)
    model = model.to(device)
    loader = DataLoader(
        dataset.train_set(augment=recipe.augment),
        batch_size=recipe.batch_size,
        shuffle=True,
        generator=torch.Generator().manual_seed(seed),
    )
    loss_of = _batch_loss(recipe, static_models, device)
    console = Console(stderr=True, quiet=not progress)
    why = f" ({reason})" if reason else ""
    _say(console, f"training {recipe.type} {model.arch} on {dataset.name}{why}: {recipe.epochs} epochs "
                  f"of {len(loader)} batches on {device}")
    seconds = _run_epochs(model, loader, recipe, loss_of, console, f"{recipe.type} {model.arch} on {dataset.name}", device)
    meta = {**_meta(dataset, model, recipe, spec, seed, device, seconds), **(extra_meta or {})}
    save_checkpoint(out, model, meta)
    return meta
