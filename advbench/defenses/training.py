"""Training recipes (natural, PGD-AT, TRADES, DeepDefense, ALP, Ens-AT, ADP, ...) and the checkpoint cache.

`advbench train` calls `train_main`; the benchmark calls `load_trained_model`, which trains
the digits models on first use (seconds on a CPU) and otherwise names the exact
`advbench train ...` command that makes a missing checkpoint.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Optional

import hydra.utils
import torch
from omegaconf import MISSING, DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset

import advbench
from advbench.attacks.optimized import goal_margin, nearest_boundary_step
from advbench.attacks.steps import per_sample
from advbench.config import conf_dir
from advbench.data.base import ImageDataset
from advbench.data.digits import Digits
from advbench.defenses.certify import ibp_loss
from advbench.defenses.inner import cross_entropy_objective, kl_objective, pgd_linf
from advbench.defenses.rse import rse_loss
from advbench.errors import AdvbenchError
from advbench.keys import content_key, dataset_identity, model_identity
from advbench.keys import plain as _plain
from advbench.models import instantiate_model
from advbench.models.checkpoint import load_checkpoint, save_checkpoint
from advbench.models.ensemble import Ensemble
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
    beta: float = 6.0  # TRADES's KL weight; ADP's log-ensemble-diversity weight (each paper's beta)
    # DeepDefense (Yan et al.): lambda * exp(-c * ratio) on correct, lambda * exp(d * ratio) on wrong samples.
    reg_weight: float = 15.0
    reg_c: float = 25.0
    reg_d: float = 5.0
    deepfool_steps: int = 5
    overshoot: float = 0.02
    pairing_weight: float = 0.5  # ALP's lambda on ||Z(x) - Z(x_adv)||^2
    # Ens-AT: the static sources (conf/model option, seed, model overrides), the single step, the adversarial weight.
    static_models: list[Any] = field(default_factory=list)
    single_step: str = "fgsm"
    adv_weight: float = 0.3
    members: int = 1  # ADP's ensemble size
    init: Optional[str] = None  # a recipe defense (natural) whose checkpoint of this model, data and seed training starts from
    alpha: float = 2.0  # ADP's ensemble-entropy weight
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
        if self.members < 1 or (self.members > 1) != (self.type in ENSEMBLE_RECIPES):
            many = "at least 2 members" if self.type in ENSEMBLE_RECIPES else "one model"
            raise AdvbenchError(f"recipe '{self.type}' trains {many}; got members={self.members}")
        if self.init is not None and self.type in ENSEMBLE_RECIPES:
            raise AdvbenchError(f"recipe '{self.type}' trains an ensemble and cannot start from one model's checkpoint (init)")
        if self.single_step not in SINGLE_STEPS:
            raise AdvbenchError(f"unknown single_step '{self.single_step}'; valid: {', '.join(sorted(SINGLE_STEPS))}")
        if self.deepfool_steps < 1:
            raise AdvbenchError(f"recipe needs deepfool_steps >= 1, got {self.deepfool_steps}")
        if self.type in INNER_ATTACK and (self.eps <= 0 or self.inner_step <= 0 or self.steps < 1):
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


def unrolled_deepfool(model: nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int,
                      overshoot: float) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepDefense's ℓ2 DeepFool perturbation (1 + overshoot)·r, differentiable in the weights,
    and which samples the model classifies correctly.

    Correctly classified samples step to the nearest linearised boundary of any other class;
    misclassified ones towards their true class (the authors' correction). Every boundary is
    f_c = Z_c − max_{j≠c} Z_j, so both cases are one batched computation; the step is the
    benchmark's DeepFool step (`nearest_boundary_step`), with gradients kept for double
    backward. A sample stops moving once its (overshot) iterate crosses, as in the original;
    iterates are not clipped to the image range (neither are the authors').
    """
    with torch.no_grad():
        logits = model(x)
    (n, num_classes), pred = logits.shape, logits.argmax(1)
    correct = pred == y
    others = torch.arange(num_classes, device=x.device).expand(n, -1)
    others = others[others != pred[:, None]].view(n, num_classes - 1)
    classes = torch.where(correct[:, None], others, y[:, None].expand_as(others))
    k = classes.shape[1]
    flat = classes.reshape(-1)
    r = torch.zeros_like(x)
    moving = torch.ones(n, dtype=x.dtype, device=x.device)
    for _ in range(steps):
        xt = (x + r).repeat_interleave(k, dim=0)
        if not xt.requires_grad:
            xt.requires_grad_(True)
        f = -goal_margin(model(xt), flat, flat)
        (grad,) = torch.autograd.grad(f.sum(), xt, create_graph=True)
        step = nearest_boundary_step(f.view(n, k), grad.view(n, k, *x.shape[1:]), "l2")
        r = r + per_sample(moving, x) * step
        with torch.no_grad():
            now = model(x + (1 + overshoot) * r).argmax(1)
            crossed = torch.where(correct, now != pred, now == y)
        moving = moving * (~crossed).to(x.dtype)
        if not moving.any():
            break
    return (1 + overshoot) * r, correct


def _deepdefense_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor, recipe: Recipe) -> torch.Tensor:
    """Yan et al.: CE + λ·mean over the batch of exp(−c·ρ) (correct) or exp(d·ρ) (wrong), ρ = ‖r‖₂/‖x‖₂.

    Correct samples are pushed to need larger DeepFool perturbations, wrong ones towards the
    boundary of their true class; the gradient flows through every unrolled DeepFool step.
    """
    with _eval_mode(model):
        r, correct = unrolled_deepfool(model, x, y, recipe.deepfool_steps, recipe.overshoot)
    ratio = r.flatten(1).norm(dim=1) / x.flatten(1).norm(dim=1).clamp_min(1e-12)
    penalty = torch.where(correct, torch.exp(-recipe.reg_c * ratio), torch.exp(recipe.reg_d * ratio))
    return F.cross_entropy(model(x), y) + recipe.reg_weight * penalty.mean()


def logit_pairing(clean: torch.Tensor, adversarial: torch.Tensor) -> torch.Tensor:
    """ALP's pairing term: squared ℓ2 distance between paired logits, averaged over pairs."""
    return (clean - adversarial).pow(2).sum(dim=1).mean()


def _alp_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor, recipe: Recipe) -> torch.Tensor:
    """Kannan et al.: mixed clean/PGD cross-entropy + λ·‖Z(x) − Z(x_adv)‖² over each clean/adversarial pair."""
    with _eval_mode(model):
        x_adv = pgd_linf(cross_entropy_objective(model, y), x, recipe.eps, recipe.inner_step, recipe.steps)
    clean, adversarial = model(x), model(x_adv)
    mixed = (F.cross_entropy(clean, y) + F.cross_entropy(adversarial, y)) / 2
    return mixed + recipe.pairing_weight * logit_pairing(clean, adversarial)


def _fgsm_objective(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    return cross_entropy_objective(model, y)


def _step_ll_objective(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """Step-LL: descend the cross-entropy of the least likely class (Kurakin et al., Tramèr et al.'s choice)."""
    with torch.no_grad():
        least = model(x).argmin(1)
    return lambda x_adv: -F.cross_entropy(model(x_adv), least, reduction="sum")


SINGLE_STEPS: dict[str, Callable[[nn.Module, torch.Tensor, torch.Tensor], Callable[[torch.Tensor], torch.Tensor]]] = {
    "fgsm": _fgsm_objective,
    "step_ll": _step_ll_objective,
}


def _ens_at_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor, recipe: Recipe,
                 static_models: Sequence[nn.Module] = ()) -> torch.Tensor:
    """Tramèr et al.: half of each batch replaced by single-step examples from the current
    model or one static pre-trained model (drawn uniformly per batch), weighted as Kurakin
    et al.: (Σ_clean CE + λ·Σ_adv CE) / (m − k + λ·k)."""
    half = x.shape[0] // 2
    sources = [model, *static_models]
    source = sources[int(torch.randint(len(sources), ()))]
    x_adv, y_adv = x[half:], y[half:]
    with _eval_mode(model):
        objective = SINGLE_STEPS[recipe.single_step](source, x_adv, y_adv)
        x_adv = pgd_linf(objective, x_adv, recipe.eps, recipe.eps, 1, start="none")
    clean = F.cross_entropy(model(x[:half]), y[:half], reduction="sum") if half else x.new_zeros(())
    adversarial = F.cross_entropy(model(x_adv), y_adv, reduction="sum")
    return (clean + recipe.adv_weight * adversarial) / (half + recipe.adv_weight * (x.shape[0] - half))


# ADP's numerical guards, the authors' values: log(p + 1e-20) in the entropy, + 1e-6·I under the log-det.
_LOG_OFFSET = 1e-20
_DET_OFFSET = 1e-6


def adp_regularizer(member_probs: torch.Tensor, y: torch.Tensor, alpha: float, beta: float) -> torch.Tensor:
    """−α·H(mean_k p_k) − β·log det(M̃ᵀM̃ + 1e-6·I), averaged over the batch (Pang et al. 2019).

    `member_probs` is (K, N, C). M̃ holds each member's non-true-class probabilities, each
    column scaled to unit ℓ2 norm; its Gram determinant is the ensemble diversity.
    """
    mean = member_probs.mean(dim=0)
    entropy = -(mean * torch.log(mean + _LOG_OFFSET)).sum(dim=1)
    k, n, c = member_probs.shape
    keep = ~F.one_hot(y, c).bool()
    non_true = member_probs.permute(1, 0, 2)[keep[:, None, :].expand(n, k, c)].view(n, k, c - 1)
    non_true = non_true / non_true.norm(dim=2, keepdim=True)
    gram = non_true @ non_true.transpose(1, 2)
    log_det = torch.logdet(gram + _DET_OFFSET * torch.eye(k, dtype=gram.dtype, device=gram.device))
    return (-alpha * entropy - beta * log_det).mean()


def _adp_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor, recipe: Recipe) -> torch.Tensor:
    """Pang et al.: Σ_k CE(member_k) − α·ensemble entropy − β·log ensemble diversity."""
    logits = model.member_logits(x)
    ce = sum(F.cross_entropy(member, y) for member in logits)
    return ce + adp_regularizer(F.softmax(logits, dim=-1), y, recipe.alpha, recipe.beta)


LOSSES: dict[str, Callable[..., torch.Tensor]] = {
    "natural": _natural_loss,
    "pgd_at": _pgd_at_loss,
    "trades": _trades_loss,
    "deepdefense": _deepdefense_loss,
    "alp": _alp_loss,
    "ens_at": _ens_at_loss,
    "adp": _adp_loss,
    "rse": rse_loss,
    "convex": ibp_loss,
}
# Recipes whose inner ℓ∞ attack needs eps, step_size and steps.
INNER_ATTACK = {"pgd_at", "trades", "alp", "ens_at"}
# Recipes that train `members` models as one `Ensemble`.
ENSEMBLE_RECIPES = {"adp"}
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


def build_defended_model(arch_cfg: Mapping[str, Any], recipe_cfg: Mapping[str, Any] | None, num_classes: int,
                         in_channels: int) -> nn.Module:
    """The network a recipe trains: one `arch_cfg` model, or an `Ensemble` of `members` of them."""
    members = int((recipe_cfg or {}).get("members", 1))
    if members == 1:
        return instantiate_model(arch_cfg, num_classes, in_channels)
    return Ensemble([instantiate_model(arch_cfg, num_classes, in_channels) for _ in range(members)])


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
    static_models: Sequence[nn.Module] = (),
    init_state: Mapping[str, torch.Tensor] | None = None,
) -> dict[str, Any]:
    """Train `arch_cfg` on `dataset` with a recipe, save a checkpoint at `out`, return its meta.

    With `progress`, stderr says what trains and why (`reason`) before the first batch, then
    shows a live bar on a terminal or one line per epoch elsewhere (logs, pipes, CI), so a
    run that trains a defense on first use is never silent. `static_models` are Ens-AT's
    frozen sources of adversarial examples; `init_state` the weights fine-tuning starts from.
    """
    recipe = Recipe.from_config(recipe_cfg)
    device = resolve_device(device)
    torch.manual_seed(seed)
    model = build_defended_model(arch_cfg, recipe_cfg, dataset.num_classes, dataset.input_shape[0])
    if init_state is not None:
        model.load_state_dict(init_state)
    model = model.to(device)
    loader = DataLoader(
        dataset.train_set(augment=recipe.augment),
        batch_size=recipe.batch_size,
        shuffle=True,
        generator=torch.Generator().manual_seed(seed),
    )
    optimizer = OPTIMIZERS[recipe.optimizer](model.parameters(), recipe)
    schedule = torch.optim.lr_scheduler.MultiStepLR(optimizer, list(recipe.lr_milestones), recipe.lr_gamma)
    loss_of = LOSSES[recipe.type]
    if static_models:
        loss_of = partial(loss_of, static_models=[m.to(device).eval().requires_grad_(False) for m in static_models])
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
    parts = {
        "dataset": dataset_identity(cfg.dataset, evaluation=False),
        "model": model_identity(cfg.model),
        "recipe": _plain(cfg.defense.get("recipe")),
        "seed": int(cfg.seed),
    }
    # A checkpoint trained from other checkpoints (its init, Ens-AT's static models) changes with them.
    depends = [checkpoint_key(other) for other in _trained_from(cfg)]
    return content_key({**parts, "depends_on": depends} if depends else parts)


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
        raise AdvbenchError(f"defense '{cfg.defense.name}' has no training recipe; recipes: {', '.join(LOSSES)}")
    # Clean accuracy in the checkpoint is over the whole evaluation set, whatever smoke-run
    # `n_samples` the triggering config carried.
    set_threads(cfg.get("threads"))
    dataset = hydra.utils.instantiate(cfg.dataset, n_samples=None)
    path = _cfg_checkpoint_path(cfg)
    init = _init_config(cfg)
    init_state = None if init is None else load_trained_model(init, dataset).state_dict()
    meta = train_defense(dataset, cfg.model, recipe, path, device=cfg.device, seed=cfg.seed, reason=reason,
                         static_models=load_static_models(cfg, dataset), init_state=init_state)
    print(
        f"trained {cfg.model.name}/{trained_defense(cfg)} on {dataset.name}: clean accuracy "
        f"{meta['clean_accuracy']:.2%} in {meta['train_seconds']:.1f} s -> {path}"
    )
    return path


def _with_defense(cfg: DictConfig, defense: str, model: Any = None, seed: int | None = None) -> DictConfig:
    """A copy of `cfg` training `defense` (a conf/defense option with a recipe), optionally
    on another model config or seed: how a recipe names the checkpoints it trains from."""
    defense_file = conf_dir() / "defense" / f"{defense}.yaml"
    recipe_defense = OmegaConf.load(defense_file) if defense_file.is_file() else None
    if recipe_defense is None or recipe_defense.get("recipe") is None or recipe_defense.recipe.get("init") is not None:
        raise AdvbenchError(f"'{defense}' is not a defense whose recipe trains from scratch, to start from")
    out = copy.deepcopy(cfg)
    with open_dict(out):
        out.defense = recipe_defense
        if model is not None:
            out.model = model
        if seed is not None:
            out.seed = int(seed)
    return out


def static_model_config(cfg: DictConfig, entry: Mapping[str, Any]) -> DictConfig:
    """The run config of one Ens-AT static source: `entry` names a conf/model option, a training
    seed and overrides of that model's keys; the recipe is natural's, so the source is cached
    (and on digits trained on first use) like any natural checkpoint."""
    spec = dict(_plain(entry))
    option = spec.pop("model", None)
    seed = spec.pop("seed", None)
    model_file = conf_dir() / "model" / f"{option}.yaml"
    if not isinstance(option, str) or not model_file.is_file():
        raise AdvbenchError(f"static model {_plain(entry)} needs 'model:' naming a conf/model option")
    return _with_defense(cfg, "natural", OmegaConf.merge(OmegaConf.load(model_file), spec), seed)


def _init_config(cfg: DictConfig) -> DictConfig | None:
    """The config whose checkpoint a recipe with `init:` fine-tunes (same model, data, seed)."""
    init = cfg.defense.recipe.get("init")
    return None if init is None else _with_defense(cfg, str(init))


def _trained_from(cfg: DictConfig) -> list[DictConfig]:
    recipe = cfg.defense.get("recipe")
    if recipe is None:
        return []
    init = _init_config(cfg)
    statics = [static_model_config(cfg, entry) for entry in recipe.get("static_models") or []]
    return ([] if init is None else [init]) + statics


def load_static_models(cfg: DictConfig, dataset: ImageDataset) -> list[nn.Module]:
    """Ens-AT's static pre-trained models for `cfg.defense.recipe.static_models` (none elsewhere)."""
    entries = cfg.defense.recipe.get("static_models") or []
    return [load_trained_model(static_model_config(cfg, entry), dataset) for entry in entries]


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


def load_trained_model(cfg: DictConfig, dataset: ImageDataset) -> nn.Module:
    """Model of `cfg.model` with the weights of `cfg.defense`, on the CPU, in eval mode, frozen.

    Frozen parameters keep attack gradients (w.r.t. the input) from also filling weight grads;
    the caller moves the model to its device.
    """
    model = build_defended_model(cfg.model, cfg.defense.get("recipe"), dataset.num_classes, dataset.input_shape[0])
    if not _uses_pretrained_weights(cfg):
        load_checkpoint(ensure_checkpoint(cfg), model, make_command=train_command(cfg))
    return model.eval().requires_grad_(False)
