"""The models a cell attacks: a target spec loaded (`load_target`) and named in cell keys (`weights_identity`).

A target's weights are an explicit `checkpoint=` file, else the checkpoint cache's entry
(`defenses.trained`, trained on demand); the defense's `wrapper:` goes in front (the cache
entry is then its `base:`'s). A substitute of transfer attacks is loaded the same way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from advbench.core.errors import AdvbenchError
from advbench.core.keys import file_digest
from advbench.robustness.defenses.checkpoint_cache import checkpoint_key
from advbench.robustness.defenses.trained import load_trained_model
from advbench.robustness.defenses.trainer import build_defended_model
from advbench.robustness.defenses.wrappers import wrap
from advbench.robustness.models.checkpoint_files import load_checkpoint
from advbench.robustness.models.classifier import evaluation_mode
from advbench.robustness.models.user_models import check_forward, check_randomized, source_identity
from advbench.robustness.specs import TargetSpec


def check_checkpoint(target: TargetSpec) -> None:
    """An explicit `checkpoint=` must be a file. A run checks it before it loads the data set: a
    user missing both the data and the weights would else learn of the weights only once the data
    are there."""
    if target.checkpoint and not Path(target.checkpoint).is_file():
        raise AdvbenchError(f"checkpoint '{target.checkpoint}' not found: checkpoint= takes a file holding the "
                            "network's state dict (torch.save(net.state_dict(), PATH))")


def weights_identity(target: TargetSpec) -> dict[str, str]:
    """The bytes of an explicit `checkpoint=`, else the content key of the cache entry (with a
    Python model's source file, whose code may hold its weights)."""
    if target.checkpoint:
        check_checkpoint(target)
        return {"checkpoint_sha256": file_digest(Path(target.checkpoint))}
    return {"cache_key": checkpoint_key(target), **source_identity(target.model)}


def load_target(target: TargetSpec, dataset: Any) -> torch.nn.Module:
    """The defended model: an explicit `checkpoint=` path, else the cache (trained on demand),
    behind the defense's `wrapper:` if it has one.

    A user's network (`models.user_models`) is built under torch's RNG seeded with `seed`
    (and the global RNG left as it was), so a factory that initialises at random builds the
    same net on every run, and its output is checked once on the data set's input shape.
    """
    users = target.model.user_given
    with torch.random.fork_rng(devices=[], enabled=users):
        if users:
            torch.manual_seed(target.seed)
        if target.checkpoint:
            model = build_defended_model(target.model, target.defense.recipe, dataset.num_classes,
                                         dataset.input_shape[0])
            load_checkpoint(Path(target.checkpoint), model)
            model = evaluation_mode(model).requires_grad_(False)
        else:
            model = load_trained_model(target, dataset)
        if users:
            what = f"{target.model.kind} '{getattr(model, 'arch', target.model.kind)}'"
            check_forward(model, dataset.input_shape, dataset.num_classes, what)
            check_randomized(model, dataset.input_shape, what)
    return wrap(model, target.defense.wrapper, seed=target.seed)
