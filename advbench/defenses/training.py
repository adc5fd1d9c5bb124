"""Training recipes (natural, Madry PGD-AT, TRADES) and the checkpoint cache.

`advbench train` calls `train_main`; the benchmark calls `load_trained_model`, which trains
the digits models on first use (seconds on a CPU) and otherwise names the exact
`advbench train ...` command that makes a missing checkpoint.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Optional

import hydra.utils
import torch
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset

import advbench
from advbench.data.base import ImageDataset
from advbench.data.digits import Digits
from advbench.defenses.certify import ibp_loss
from advbench.defenses.inner import cross_entropy_objective, kl_objective, pgd_linf
from advbench.defenses.rse import rse_loss
from advbench.errors import AdvbenchError
from advbench.keys import content_key, dataset_identity, model_identity
from advbench.keys import plain as _plain
from advbench.models import Classifier, instantiate_model
from advbench.models.checkpoint import load_checkpoint, save_checkpoint
from advbench.resume import file_lock
from advbench.runtime import resolve_device, set_threads


@dataclass
class Recipe:
    """The `recipe:` block of a `conf/defense` YAML, type-checked before training starts."""

    type: str = MISSING
    epochs: int = MISSING
    batch_size: int = MISSING
    lr: float = MISSING
    optimizer: str = "adam"
    momentum: float = 0.9
    weight_decay: float = 0.0
    lr_milestones: list[int] = field(default_factory=list)
    lr_gamma: float = 0.1
    augment: bool = True
    eps: float = 0.0
    step_size: Optional[float] = None
    steps: int = 0
    beta: float = 6.0
    init_noise: float = 0.0
    inner_noise: float = 0.0
    kappa: float = 0.5  # convex (IBP): final weight of the clean loss, falling from 1 during the ramp-up
    warmup_steps: int = 0  # convex: clean steps before the ramp-up
    rampup_steps: int = 0  # convex: steps over which the bound's eps grows from 0 to eps

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> Recipe:
        """Merge onto the schema: unknown keys, wrong types and missing values are errors."""
        try:
            recipe = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(cls), _plain(cfg)))
        except OmegaConfBaseException as exc:
            raise AdvbenchError(f"bad training recipe: {str(exc).splitlines()[0]}") from None
        recipe.validate()
        return recipe

    def validate(self) -> None:
        if self.type not in LOSSES:
            raise AdvbenchError(f"unknown training recipe '{self.type}'; valid: {', '.join(sorted(LOSSES))}")
        if self.epochs < 1 or self.batch_size < 1 or self.lr <= 0:
            raise AdvbenchError(f"recipe needs epochs >= 1, batch_size >= 1, lr > 0; got {self.epochs}, {self.batch_size}, {self.lr}")
        if self.optimizer not in OPTIMIZERS:
            raise AdvbenchError(f"unknown optimizer '{self.optimizer}'; valid: {', '.join(sorted(OPTIMIZERS))}")
        if self.type not in ("natural", "rse", "convex") and (self.eps <= 0 or self.inner_step <= 0 or self.steps < 1):
            raise AdvbenchError(
                f"recipe '{self.type}' needs eps > 0, step_size > 0, steps >= 1; got {self.eps}, {self.step_size}, {self.steps}"
            )

    @property
    def inner_step(self) -> float:
        """PGD step; `step_size: null` means eps / 4 (Madry's 2/255 at eps 8/255)."""
        return self.eps / 4 if self.step_size is None else self.step_size


@contextmanager
def _eval_mode(model: nn.Module) -> Iterator[None]:
    """Craft training adversaries with frozen batch-norm statistics, then resume training."""
    model.eval()
    try:
        yield
    finally:
        model.train()


def _natural_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor, recipe: Recipe) -> torch.Tensor:
    return F.cross_entropy(model(x), y)


def _pgd_at_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor, recipe: Recipe) -> torch.Tensor:
    """Madry et al.: cross-entropy on ℓ∞ PGD examples from a uniform random start."""
    with _eval_mode(model):
        x_adv = pgd_linf(cross_entropy_objective(model, y), x, recipe.eps, recipe.inner_step, recipe.steps)
    return F.cross_entropy(model(x_adv), y)


def _trades_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor, recipe: Recipe) -> torch.Tensor:
    """Zhang et al.: CE(f(x), y) + beta * KL(f(x) || f(x_adv)), x_adv maximising the KL."""
    with _eval_mode(model):
        clean_probs = F.softmax(model(x), dim=1).detach()
        x_adv = pgd_linf(kl_objective(model, clean_probs), x, recipe.eps, recipe.inner_step, recipe.steps, start="gaussian")
    logits = model(x)
    robust = F.kl_div(F.log_softmax(model(x_adv), dim=1), F.softmax(logits, dim=1), reduction="batchmean")
    return F.cross_entropy(logits, y) + recipe.beta * robust


LOSSES: dict[str, Callable[[nn.Module, torch.Tensor, torch.Tensor, Recipe], torch.Tensor]] = {
    "natural": _natural_loss,
    "pgd_at": _pgd_at_loss,
    "trades": _trades_loss,
    "rse": rse_loss,
    "convex": ibp_loss,
}
OPTIMIZERS: dict[str, Callable[[Any, Recipe], torch.optim.Optimizer]] = {
    "adam": lambda params, r: torch.optim.Adam(params, lr=r.lr, weight_decay=r.weight_decay),
    "sgd": lambda params, r: torch.optim.SGD(params, lr=r.lr, momentum=r.momentum, weight_decay=r.weight_decay),
}


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


def train_defense(
    dataset: ImageDataset,
    arch_cfg: Mapping[str, Any],
    recipe_cfg: Mapping[str, Any],
    out: Path,
    device: str = "cpu",
    *,
    seed: int = 0,
    progress: bool = True,
    reason: str = "",
) -> dict[str, Any]:
    """Train `arch_cfg` on `dataset` with a recipe, save a checkpoint at `out`, return its meta.

    With `progress`, stderr says what trains and why (`reason`) before the first batch, then
    shows a live bar on a terminal or one line per epoch elsewhere (logs, pipes, CI), so a
    run that trains a defense on first use is never silent.
    """
    recipe = Recipe.from_config(recipe_cfg)
    device = resolve_device(device)
    torch.manual_seed(seed)
    model = instantiate_model(arch_cfg, dataset.num_classes, dataset.input_shape[0]).to(device)
    loader = DataLoader(
        dataset.train_set(augment=recipe.augment),
        batch_size=recipe.batch_size,
        shuffle=True,
        generator=torch.Generator().manual_seed(seed),
    )
    optimizer = OPTIMIZERS[recipe.optimizer](model.parameters(), recipe)
    schedule = torch.optim.lr_scheduler.MultiStepLR(optimizer, list(recipe.lr_milestones), recipe.lr_gamma)
    loss_of = LOSSES[recipe.type]
    console = Console(stderr=True, quiet=not progress)
    why = f" ({reason})" if reason else ""
    console.print(f"training {recipe.type} {model.arch} on {dataset.name}{why}: {recipe.epochs} epochs "
                  f"of {len(loader)} batches on {device}", markup=False, highlight=False, soft_wrap=True)
    started = time.perf_counter()
    with _progress(console) as bar:
        epochs = bar.add_task(f"{recipe.type} {model.arch} on {dataset.name}: epochs", total=recipe.epochs, status="")
        batches = bar.add_task("batches", total=len(loader), status="")
        for epoch in range(recipe.epochs):
            model.train()
            bar.reset(batches)
            for x, y in loader:
                loss = loss_of(model, x.to(device), y.to(device), recipe)
                value = float(loss.detach())  # one device sync per batch, for the check and the bar
                if not math.isfinite(value):
                    raise AdvbenchError(f"training diverged: loss {value} in epoch {epoch + 1}; lower defense.recipe.lr")
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                bar.update(batches, advance=1, status=f"loss {value:.3f}")
            schedule.step()
            bar.update(epochs, advance=1)
            if not console.is_terminal:
                console.print(f"  epoch {epoch + 1}/{recipe.epochs}: loss {value:.3f}, {time.perf_counter() - started:.1f} s",
                              markup=False, highlight=False, soft_wrap=True)
    seconds = time.perf_counter() - started
    meta = {
        "dataset": dataset.name,
        "architecture": model.arch,
        "recipe": recipe.type,
        "clean_accuracy": evaluate_accuracy(model, dataset.eval_set(), device),
        "config": {"model": _plain(arch_cfg), "recipe": _plain(recipe_cfg), "seed": seed, "budgets": dict(dataset.budgets)},
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "advbench_version": advbench.__version__,
        "train_seconds": round(seconds, 3),
    }
    save_checkpoint(out, model, meta)
    return meta


def checkpoint_path(cache_dir: str | Path, dataset_name: str, model_name: str, defense_name: str, key: str) -> Path:
    """Where `advbench train` stores (and the benchmark looks up) a trained model."""
    return Path(cache_dir).expanduser() / "checkpoints" / dataset_name / model_name / f"{defense_name}-{key}.pt"


def checkpoint_key(cfg: DictConfig) -> str:
    """Content key of a cached checkpoint: everything training depends on, not option names.

    The training data (class, root, split; not the evaluation-only `n_samples`), the model
    config, the whole recipe (epochs included) and the seed; changing any of them trains anew.
    """
    return content_key({
        "dataset": dataset_identity(cfg.dataset, evaluation=False),
        "model": model_identity(cfg.model),
        "recipe": _plain(cfg.defense.get("recipe")),
        "seed": int(cfg.seed),
    })


def trained_defense(cfg: DictConfig) -> str:
    """The defense whose checkpoint `cfg` uses: a wrapper's `base:` (JPEG wraps natural's
    model, whose recipe its YAML pulls in), else the defense itself."""
    return str(cfg.defense.get("base") or cfg.defense.name)


def train_command(cfg: DictConfig) -> str:
    """The `advbench train` line that creates the checkpoint `cfg` asks for."""
    seed = f" seed={cfg.seed}" if int(cfg.seed) != 0 else ""
    return f"advbench train dataset={cfg.dataset.name} model={cfg.model.name} defense={trained_defense(cfg)}{seed}"


def _cfg_checkpoint_path(cfg: DictConfig) -> Path:
    return checkpoint_path(cfg.cache_dir, cfg.dataset.name, cfg.model.name, trained_defense(cfg), checkpoint_key(cfg))


def train_main(cfg: DictConfig, reason: str = "") -> Path:
    """`advbench train`: instantiate the data set, train the recipe, save, print one line.

    `reason` says on stderr why a model is trained when the user did not ask for it.
    """
    recipe = cfg.defense.get("recipe")
    if recipe is None:
        raise AdvbenchError(f"defense '{cfg.defense.name}' has no training recipe; trainable: natural, pgd_at, trades")
    # Clean accuracy in the checkpoint is over the whole evaluation set, whatever smoke-run
    # `n_samples` the triggering config carried.
    set_threads(cfg.get("threads"))
    dataset = hydra.utils.instantiate(cfg.dataset, n_samples=None)
    path = _cfg_checkpoint_path(cfg)
    meta = train_defense(dataset, cfg.model, recipe, path, device=cfg.device, seed=cfg.seed, reason=reason)
    print(
        f"trained {cfg.model.name}/{trained_defense(cfg)} on {dataset.name}: clean accuracy "
        f"{meta['clean_accuracy']:.2%} in {meta['train_seconds']:.1f} s -> {path}"
    )
    return path


def ensure_checkpoint(cfg: DictConfig) -> Path:
    """The checkpoint for (dataset, model, defense); digits models are trained on first use."""
    path = _cfg_checkpoint_path(cfg)
    if path.is_file():
        return path
    if issubclass(hydra.utils.get_class(cfg.dataset._target_), Digits):
        # Parallel jobs needing the same model: one trains, the others wait and load it.
        with file_lock(path.with_name(f".{path.name}.lock"), f"the training of {path.name}"):
            return path if path.is_file() else train_main(cfg, reason=f"first use: no cached checkpoint at {path}")
    raise AdvbenchError(f"no trained model at '{path}'; create it with: {train_command(cfg)}")


def _uses_pretrained_weights(cfg: DictConfig) -> bool:
    """A natural model with a `weights_path` (torchvision ImageNet nets) needs no checkpoint."""
    recipe = cfg.defense.get("recipe")
    return cfg.model.get("weights_path") is not None and recipe is not None and recipe.get("type") == "natural"


def load_trained_model(cfg: DictConfig, dataset: ImageDataset) -> Classifier:
    """Model of `cfg.model` with the weights of `cfg.defense`, on the CPU, in eval mode, frozen.

    Frozen parameters keep attack gradients (w.r.t. the input) from also filling weight grads;
    the caller moves the model to its device.
    """
    model = instantiate_model(cfg.model, dataset.num_classes, dataset.input_shape[0])
    if not _uses_pretrained_weights(cfg):
        load_checkpoint(ensure_checkpoint(cfg), model, make_command=train_command(cfg))
    return model.eval().requires_grad_(False)
