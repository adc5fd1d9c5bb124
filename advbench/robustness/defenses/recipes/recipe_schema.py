"""The `recipe:` schema of a `conf/defense` YAML and the registry of training recipes.

One `Recipe` dataclass holds the union of every recipe's keys, so a typo in any recipe is an
error and the checkpoint cache keys (which hash the recipe block) do not depend on how the
losses are organised. Each loss module registers its recipe once, as a `RecipeSpec`, in
`REGISTRY` (`@REGISTRY.register` on its loss); validation reads the registry, so a new recipe
needs no edit here. This module imports no loss module (they import it), which keeps the
package free of import cycles.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

from advbench.core.errors import AdvbenchError
from advbench.core.keys import plain
from advbench.core.registry import Registry
from advbench.robustness.defenses.inner import SINGLE_STEPS

Loss = Callable[..., torch.Tensor]
"""(model, x, y, recipe, **extra) -> the scalar training loss of one batch."""


@dataclass(frozen=True)
class RecipeSpec:
    """One training recipe: its `type:` name, its loss, and what its keys must satisfy.

    `inner_attack`: the loss crafts ℓ∞ adversaries, so it needs eps, step_size and steps;
    `ensemble`: it trains `members` (at least 2) models as one `Ensemble`.
    """

    name: str
    loss: Loss
    inner_attack: bool = False
    ensemble: bool = False


REGISTRY: Registry[RecipeSpec] = Registry("training recipe", RecipeSpec)
"""Every recipe by `type:` name, in registration order (the order `recipes/__init__` imports them).

Each loss module registers its loss beside its definition: `@REGISTRY.register("pgd_at", inner_attack=True)`
stores `RecipeSpec("pgd_at", pgd_at_loss, inner_attack=True)`; a name is registered once.
"""


OPTIMIZERS: dict[str, Callable[[Any, Recipe], torch.optim.Optimizer]] = {
    "adam": lambda params, r: torch.optim.Adam(params, lr=r.lr, weight_decay=r.weight_decay),
    "sgd": lambda params, r: torch.optim.SGD(params, lr=r.lr, momentum=r.momentum, weight_decay=r.weight_decay),
}
"""The `optimizer:` choices, built from the recipe's lr, momentum and weight_decay."""


@dataclass
class Recipe:
    """The `recipe:` block of a `conf/defense` YAML, type-checked before training starts."""

    type: str = None  # type: ignore[assignment]  # required
    epochs: int = None  # type: ignore[assignment]  # required
    batch_size: int = None  # type: ignore[assignment]  # required
    lr: float = None  # type: ignore[assignment]  # required
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
        """Check the block against the schema: unknown keys, wrong types and missing values are errors."""
        given = plain(cfg)
        hints = typing.get_type_hints(cls)
        unknown = sorted(set(given) - set(hints))
        if unknown:
            raise AdvbenchError(f"bad training recipe: Key '{unknown[0]}' not in 'Recipe'; valid: {', '.join(hints)}")
        missing = [k for k in REQUIRED if k not in given]
        if missing:
            raise AdvbenchError(f"bad training recipe: Missing mandatory value: {', '.join(missing)}")
        recipe = cls(**{k: _typed(v, hints[k]) for k, v in given.items()})
        recipe.validate()
        return recipe

    def validate(self) -> None:
        spec = REGISTRY.lookup(self.type)
        if self.epochs < 1 or self.batch_size < 1 or self.lr <= 0:
            raise AdvbenchError(f"recipe needs epochs >= 1, batch_size >= 1, lr > 0; got {self.epochs}, {self.batch_size}, {self.lr}")
        if self.optimizer not in OPTIMIZERS:
            raise AdvbenchError(f"unknown optimizer '{self.optimizer}'; valid: {', '.join(sorted(OPTIMIZERS))}")
        if self.members < 1 or (self.members > 1) != spec.ensemble:
            many = "at least 2 members" if spec.ensemble else "one model"
            raise AdvbenchError(f"recipe '{self.type}' trains {many}; got members={self.members}")
        if self.init is not None and spec.ensemble:
            raise AdvbenchError(f"recipe '{self.type}' trains an ensemble and cannot start from one model's checkpoint (init)")
        if self.single_step not in SINGLE_STEPS:
            raise AdvbenchError(f"unknown single_step '{self.single_step}'; valid: {', '.join(sorted(SINGLE_STEPS))}")
        if self.deepfool_steps < 1:
            raise AdvbenchError(f"recipe needs deepfool_steps >= 1, got {self.deepfool_steps}")
        if spec.inner_attack and (self.eps <= 0 or self.inner_step <= 0 or self.steps < 1):
            raise AdvbenchError(
                f"recipe '{self.type}' needs eps > 0, step_size > 0, steps >= 1; got {self.eps}, {self.step_size}, {self.steps}"
            )

    @property
    def inner_step(self) -> float:
        """PGD step; `step_size: null` means eps / 4 (Madry's 2/255 at eps 8/255)."""
        return self.eps / 4 if self.step_size is None else self.step_size


REQUIRED = ("type", "epochs", "batch_size", "lr")
"""Recipe keys without a default: every recipe says what it trains, how long and how fast."""


_TYPE_NAMES = {int: "Integer", float: "Float", str: "String", bool: "Boolean", list: "List"}


def _typed(value: Any, hint: Any) -> Any:
    """`value` as the schema's type (an int, or a string of one, is a float too), or a one-line error."""
    options = typing.get_args(hint) if typing.get_origin(hint) is typing.Union else (hint,)
    kinds = [typing.get_origin(o) or o for o in options if o is not type(None)]
    if value is None:
        if type(None) in options:
            return None
        raise AdvbenchError(f"bad training recipe: Incompatible value 'None' for field of type '{kinds[0].__name__}'")
    for kind in kinds:
        if isinstance(value, kind) and not (isinstance(value, bool) and kind is not bool):
            return float(value) if kind is float else value
        if kind in (int, float) and not isinstance(value, (bool, list, dict)):
            try:
                return kind(value) if kind is float or not isinstance(value, float) else _whole(value)
            except (TypeError, ValueError):
                pass
    raise AdvbenchError(f"bad training recipe: Value '{value}' of type '{type(value).__name__}' could not be "
                        f"converted to {_TYPE_NAMES.get(kinds[0], kinds[0].__name__)}")


def _whole(value: float) -> int:
    if not float(value).is_integer():
        raise ValueError(value)
    return int(value)
