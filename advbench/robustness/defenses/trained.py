"""Trained models of the checkpoint cache: training one (`advbench train`), finding or making
an entry, and loading it.

`load_trained_model` is the cache's reader: digits models are trained on first use (seconds
on a CPU); any other missing entry is an error naming the exact `advbench train ...` line
that makes it. A recipe that starts from other checkpoints (`init:`, Ens-AT's static models)
loads them here too, trained on first use in turn.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch import nn

from advbench.core.errors import AdvbenchError
from advbench.core.resume import file_lock
from advbench.core.runtime import set_threads, threads_for
from advbench.robustness.data.image_dataset import ImageDataset
from advbench.robustness.defenses.checkpoint_cache import cache_entry, train_command
from advbench.robustness.defenses.recipes import LOSSES
from advbench.robustness.defenses.trainer import build_defended_model, train_defense
from advbench.robustness.models.checkpoint_files import load_checkpoint
from advbench.robustness.models.classifier import evaluation_mode
from advbench.robustness.models.user_models import own_weights
from advbench.robustness.specs import TargetSpec


def train_target(target: TargetSpec, reason: str = "") -> Path:
    """`advbench train`: build the data set, train the recipe, save, print one line.

    `reason` says on stderr why a model is trained when the user did not ask for it.
    """
    recipe = target.defense.recipe
    if recipe is None:
        raise AdvbenchError(f"defense '{target.defense.name}' has no training recipe; recipes: {', '.join(LOSSES)}")
    # Clean accuracy in the checkpoint is over the whole evaluation set, whatever smoke-run
    # `n_samples` the triggering config carried.
    set_threads(target.threads)
    dataset = target.dataset.build(n_samples=None)
    path = cache_entry(target)
    init_state = None if target.init is None else load_trained_model(target.init, dataset).state_dict()
    with threads_for(target.training_threads):
        meta = train_defense(dataset, target.model, recipe, path, device=target.device, seed=target.seed,
                             reason=reason, static_models=[load_trained_model(s, dataset) for s in target.static_models],
                             init_state=init_state, extra_meta={"training_threads": target.training_threads})
    print(
        f"trained {target.model.name}/{target.defense.trained} on {dataset.name}: clean accuracy "
        f"{meta['clean_accuracy']:.2%} in {meta['train_seconds']:.1f} s -> {path}"
    )
    return path


def ensure_checkpoint(target: TargetSpec) -> Path:
    """The checkpoint for (dataset, model, defense); digits models are trained on first use."""
    path = cache_entry(target)
    if path.is_file():
        return path
    if getattr(target.dataset.builder.factory, "trains_on_first_use", False):
        # Parallel jobs needing the same model: one trains, the others wait and load it.
        with file_lock(path.with_name(f".{path.name}.lock"), f"the training of {path.name}"):
            return path if path.is_file() else train_target(target, reason=f"first use: no cached checkpoint at {path}")
    other = "; or give checkpoint=<file> (a state dict of the network)" if target.model.user_given else ""
    raise AdvbenchError(f"no trained model at '{path}'; create it with: {train_command(target)}{other}")


def has_weights(target: TargetSpec) -> bool:
    """Whether `target` loads without an `advbench train` first: an explicit checkpoint, pretrained
    or its own weights, a cache entry, or a data set whose models train on first use."""
    return bool(target.checkpoint) or _uses_pretrained_weights(target) or cache_entry(target).is_file() \
        or bool(getattr(target.dataset.builder.factory, "trains_on_first_use", False))


def _uses_pretrained_weights(target: TargetSpec) -> bool:
    """A natural model with a `weights_path` (torchvision ImageNet nets) or its own weights (a
    user's Python model) needs no checkpoint."""
    recipe = target.defense.recipe
    natural = recipe is not None and recipe.type == "natural"
    return natural and (target.model.argument("weights_path") is not None or own_weights(target.model))


def load_trained_model(target: TargetSpec, dataset: ImageDataset) -> nn.Module:
    """`target`'s model with its defense's trained weights, on the CPU, in eval mode, frozen.

    Frozen parameters keep attack gradients (w.r.t. the input) from also filling weight grads;
    the caller moves the model to its device.
    """
    model = build_defended_model(target.model, target.defense.recipe, dataset.num_classes,
                                 dataset.input_shape[0])
    if not _uses_pretrained_weights(target):
        path = ensure_checkpoint(target)
        meta = load_checkpoint(path, model, make_command=train_command(target))
        _check_cache_entry(path, meta, target, dataset)
    return evaluation_mode(model).requires_grad_(False)


def _check_cache_entry(path: Path, meta: Mapping[str, Any], target: TargetSpec, dataset: ImageDataset) -> None:
    """A cache entry must be the checkpoint its name promises: the data set and recipe its meta records.

    Another defense's checkpoint of the same architecture, copied over the entry, would load
    without complaint and change every number of the cell.
    """
    recipe = None if target.defense.recipe is None else target.defense.recipe.type
    expected = {"dataset": dataset.name, "recipe": recipe}
    found = {k: meta.get(k) for k in expected}
    if any(found[k] != v for k, v in expected.items() if v is not None and found[k] is not None):
        raise AdvbenchError(f"the cached checkpoint '{path}' was trained as {found['recipe']} on {found['dataset']}, not "
                            f"{recipe} on {dataset.name}: it is not this cache entry; delete it and advbench trains "
                            f"the right one ({train_command(target)})")
