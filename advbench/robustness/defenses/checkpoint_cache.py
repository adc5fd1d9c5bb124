"""The checkpoint cache: where a trained model is kept, and the key that names it.

A cache entry is keyed by the content of everything training depends on (`checkpoint_key`),
including the checkpoints a recipe starts from (`init:`, Ens-AT's static models), so changing
any of them trains anew; `train_command` is the `advbench train` line that makes an entry.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from advbench.core.keys import content_key
from advbench.robustness.specs import TargetSpec


def checkpoint_path(cache_dir: str | Path, dataset_name: str, model_name: str, defense_name: str, key: str) -> Path:
    """Where `advbench train` stores (and the benchmark looks up) a trained model."""
    return Path(cache_dir).expanduser() / "checkpoints" / dataset_name / model_name / f"{defense_name}-{key}.pt"


def checkpoint_key(target: TargetSpec) -> str:
    """Content key of a cached checkpoint: everything training depends on, not option names.

    The training data (class, root, split; not the evaluation-only `n_samples`), the model
    config, the whole recipe (epochs included) and the seed; changing any of them trains anew.
    """
    parts = {
        "dataset": target.dataset.identity(evaluation=False),
        "model": target.model.identity(),
        "recipe": target.defense.recipe_identity(),  # as written, as ever: not the typed recipe's defaults
        "seed": target.seed,
        "training_threads": target.training_threads,
    }
    # A checkpoint trained from other checkpoints (its init, Ens-AT's static models) changes with them.
    depends = [checkpoint_key(other) for other in target.trained_from]
    return content_key({**parts, "depends_on": depends} if depends else parts)


def cache_entry(target: TargetSpec) -> Path:
    """The cache entry holding `target`'s trained weights (which need not exist yet)."""
    return checkpoint_path(target.cache_dir, target.dataset.name, target.model.name, target.defense.trained,
                           checkpoint_key(target))


def train_command(target: TargetSpec) -> str:
    """The `advbench train` line that creates the checkpoint `target` asks for."""
    seed = f" seed={target.seed}" if target.seed != 0 else ""
    key = {"torchvision": "arch", "python": "target", "robustbench": "name"}.get(target.model.kind)
    option = "robustbench" if target.model.kind == "robustbench" else target.model.name  # its model.name is the zoo's name
    model = f"{option} model.{key}={target.model.argument(key)}" if key else target.model.name
    line = f"advbench train dataset={target.dataset.name} model={model} defense={target.defense.trained}{seed}"
    return " ".join([line, *(shlex.quote(o) for o in target.train_overrides)])
