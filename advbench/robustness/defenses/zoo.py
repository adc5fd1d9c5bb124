"""The models a cell attacks, and the checkpoint cache they come from.

`advbench train` calls `train_main`; the benchmark calls `load_defended_model`: an explicit
checkpoint, or the cache entry (`load_trained_model`, which trains the digits models on
first use, seconds on a CPU, and otherwise names the exact `advbench train ...` command that
makes a missing checkpoint), behind the defense's wrapper. `weights_identity` names those
weights in cell keys. A cache entry is keyed by the content of everything training depends
on (`checkpoint_key`), including the checkpoints a recipe starts from (`init:`, Ens-AT's
static models), so changing any of them trains anew.
"""

from __future__ import annotations

import copy
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import hydra.utils
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf, open_dict
from torch import nn

from advbench.core.catalog import load_option
from advbench.core.errors import AdvbenchError
from advbench.core.keys import (
    content_key,
    dataset_identity,
    file_digest,
    model_identity,
    plain,
)
from advbench.core.resume import file_lock
from advbench.core.runtime import set_threads, threads_for
from advbench.robustness.data.base import ImageDataset
from advbench.robustness.data.digits import Digits
from advbench.robustness.defenses.recipes import LOSSES
from advbench.robustness.defenses.trainer import build_defended_model, train_defense
from advbench.robustness.defenses.wrappers import wrap
from advbench.robustness.models.base import evaluation_mode
from advbench.robustness.models.checkpoint import load_checkpoint
from advbench.robustness.models.user_models import check_forward, check_randomized, own_weights, source_identity, user_kind

# ---------------------------------------------------------------- the checkpoint cache


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
        "recipe": plain(cfg.defense.get("recipe")),
        "seed": int(cfg.seed),
        "training_threads": training_threads(cfg),
    }
    # A checkpoint trained from other checkpoints (its init, Ens-AT's static models) changes with them.
    depends = [checkpoint_key(other) for other in _trained_from(cfg)]
    return content_key({**parts, "depends_on": depends} if depends else parts)


TRAINING_THREADS = 1
"""CPU threads a model trains on unless `training_threads` says otherwise: fixed, because the
thread count changes the order of float sums and so the weights; with it fixed (and in the key)
one machine gives one set of weights whichever command trained a model first."""


def training_threads(cfg: DictConfig) -> int:
    return int(cfg.get("training_threads") or TRAINING_THREADS)


def trained_defense(cfg: DictConfig) -> str:
    """The defense whose checkpoint `cfg` uses: a wrapper's `base:` (JPEG wraps natural's
    model, whose recipe its YAML pulls in), else the defense itself."""
    return str(cfg.defense.get("base") or cfg.defense.name)


def train_command(cfg: DictConfig) -> str:
    """The `advbench train` line that creates the checkpoint `cfg` asks for."""
    seed = f" seed={cfg.seed}" if int(cfg.seed) != 0 else ""
    kind = user_kind(cfg.model)
    key = {"torchvision": "arch", "python": "target", "robustbench": "name"}.get(kind or "")
    option = "robustbench" if kind == "robustbench" else cfg.model.name  # its model.name is the zoo's name
    model = f"{option} model.{key}={cfg.model.get(key)}" if key else cfg.model.name
    line = f"advbench train dataset={cfg.dataset.name} model={model} defense={trained_defense(cfg)}{seed}"
    return " ".join([line, *_training_overrides()])


_TRAINING_KEYS = ("dataset.", "model.", "defense.recipe.", "hydra.searchpath=", "cache_dir=", "training_threads=",
                  "device=")
"""Overrides of a run that an `advbench train` line for its model needs too (where the data is, ...)."""


def _training_overrides() -> list[str]:
    """The running Hydra job's overrides a train line must repeat (none outside a Hydra job)."""
    if not HydraConfig.initialized():
        return []
    given = HydraConfig.get().overrides
    typed = [*OmegaConf.to_container(given.hydra), *OmegaConf.to_container(given.task)]  # as typed: not resolved
    return [shlex.quote(o) for o in typed if o.startswith(_TRAINING_KEYS)
            and not o.startswith(("model.arch=", "model.target=", "model.name="))]


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
    with threads_for(training_threads(cfg)):
        meta = train_defense(dataset, cfg.model, recipe, path, device=cfg.device, seed=cfg.seed, reason=reason,
                             static_models=load_static_models(cfg, dataset), init_state=init_state,
                             extra_meta={"training_threads": training_threads(cfg)})
    print(
        f"trained {cfg.model.name}/{trained_defense(cfg)} on {dataset.name}: clean accuracy "
        f"{meta['clean_accuracy']:.2%} in {meta['train_seconds']:.1f} s -> {path}"
    )
    return path


def _with_defense(cfg: DictConfig, defense: str, model: Any = None, seed: int | None = None) -> DictConfig:
    """A copy of `cfg` training `defense` (a conf/defense option with a recipe), optionally
    on another model config or seed: how a recipe names the checkpoints it trains from."""
    recipe_defense = load_option("defense", defense)
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
    spec = dict(plain(entry))
    option = spec.pop("model", None)
    seed = spec.pop("seed", None)
    model = load_option("model", option) if isinstance(option, str) else None
    if model is None:
        raise AdvbenchError(f"static model {plain(entry)} needs 'model:' naming a conf/model option")
    return _with_defense(cfg, "natural", OmegaConf.merge(model, spec), seed)


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
    other = "; or give checkpoint=<file> (a state dict of the network)" if user_kind(cfg.model) else ""
    raise AdvbenchError(f"no trained model at '{path}'; create it with: {train_command(cfg)}{other}")


def _uses_pretrained_weights(cfg: DictConfig) -> bool:
    """A natural model with a `weights_path` (torchvision ImageNet nets) or its own weights (a
    user's Python model) needs no checkpoint."""
    recipe = cfg.defense.get("recipe")
    natural = recipe is not None and recipe.get("type") == "natural"
    return natural and (cfg.model.get("weights_path") is not None or own_weights(cfg.model))


def load_trained_model(cfg: DictConfig, dataset: ImageDataset) -> nn.Module:
    """Model of `cfg.model` with the weights of `cfg.defense`, on the CPU, in eval mode, frozen.

    Frozen parameters keep attack gradients (w.r.t. the input) from also filling weight grads;
    the caller moves the model to its device.
    """
    model = build_defended_model(cfg.model, cfg.defense.get("recipe"), dataset.num_classes, dataset.input_shape[0])
    if not _uses_pretrained_weights(cfg):
        path = ensure_checkpoint(cfg)
        _check_cache_entry(path, load_checkpoint(path, model, make_command=train_command(cfg)), cfg, dataset)
    return evaluation_mode(model).requires_grad_(False)


def _check_cache_entry(path: Path, meta: Mapping[str, Any], cfg: DictConfig, dataset: ImageDataset) -> None:
    """A cache entry must be the checkpoint its name promises: the data set and recipe its meta records.

    Another defense's checkpoint of the same architecture, copied over the entry, would load
    without complaint and change every number of the cell.
    """
    recipe = (cfg.defense.get("recipe") or {}).get("type")
    expected = {"dataset": dataset.name, "recipe": recipe}
    found = {k: meta.get(k) for k in expected}
    if any(found[k] != v for k, v in expected.items() if v is not None and found[k] is not None):
        raise AdvbenchError(f"the cached checkpoint '{path}' was trained as {found['recipe']} on {found['dataset']}, not "
                            f"{recipe} on {dataset.name}: it is not this cache entry; delete it and advbench trains "
                            f"the right one ({train_command(cfg)})")


# ---------------------------------------------------------------- the models a cell attacks


def weights_identity(cfg: DictConfig) -> dict[str, str]:
    """The bytes of an explicit `checkpoint=`, else the content key of the cache entry (with a
    Python model's source file, whose code may hold its weights)."""
    if cfg.get("checkpoint"):
        path = Path(cfg.checkpoint)
        if not path.is_file():
            raise AdvbenchError(f"checkpoint '{path}' not found")
        return {"checkpoint_sha256": file_digest(path)}
    return {"cache_key": checkpoint_key(cfg), **source_identity(cfg.model)}


def load_defended_model(cfg: DictConfig, dataset: Any) -> torch.nn.Module:
    """The defense's model: an explicit `checkpoint=` path, else the cache (trained on demand),
    behind the defense's `wrapper:` if it has one (the cache entry is then its `base:`'s).

    A user's network (`models.user_models`) is built under torch's RNG seeded with `seed`
    (and the global RNG left as it was), so a factory that initialises at random builds the
    same net on every run, and its output is checked once on the data set's input shape.
    """
    kind = user_kind(cfg.model)
    with torch.random.fork_rng(devices=[], enabled=kind is not None):
        if kind is not None:
            torch.manual_seed(int(cfg.seed))
        if cfg.get("checkpoint"):
            model = build_defended_model(cfg.model, cfg.defense.get("recipe"), dataset.num_classes,
                                         dataset.input_shape[0])
            load_checkpoint(Path(cfg.checkpoint), model)
            model = evaluation_mode(model).requires_grad_(False)
        else:
            model = load_trained_model(cfg, dataset)
        if kind is not None:
            what = f"{kind} '{getattr(model, 'arch', kind)}'"
            check_forward(model, dataset.input_shape, dataset.num_classes, what)
            check_randomized(model, dataset.input_shape, what)
    return wrap(model, plain(cfg.defense.get("wrapper")), seed=int(cfg.seed))
