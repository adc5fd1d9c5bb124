"""The training recipes: the `recipe:` schema, the registry, and one module per loss.

Importing this package imports every loss module, and each registers its loss once in
`REGISTRY` (`@REGISTRY.register` beside the loss); `LOSSES`, `INNER_ATTACK` and
`ENSEMBLE_RECIPES` are views of the registry taken after all of them have registered. A new
recipe is a new module here plus one import line below (the order of the imports is the
order recipes are listed in).
"""

from __future__ import annotations

from types import MappingProxyType

# The order of these imports is the order of the registry, and of the recipes in messages.
# isort: off
from advbench.robustness.defenses.recipes import (  # noqa: F401 - each module registers its recipe
    natural,
    pgd_at,
    trades,
    deepdefense,
    alp,
    ens_at,
    adp,
    rse,
    convex,
)
# isort: on
from advbench.robustness.defenses.recipes.recipe_schema import (
    OPTIMIZERS,
    REGISTRY,
    SINGLE_STEPS,
    Loss,
    Recipe,
    RecipeSpec,
)

__all__ = ["ENSEMBLE_RECIPES", "INNER_ATTACK", "LOSSES", "OPTIMIZERS", "REGISTRY", "SINGLE_STEPS", "Loss", "Recipe",
           "RecipeSpec"]

LOSSES = MappingProxyType({name: spec.loss for name, spec in REGISTRY.items()})
"""Each recipe's loss by name."""
INNER_ATTACK = frozenset(name for name, spec in REGISTRY.items() if spec.inner_attack)
"""Recipes whose inner ℓ∞ attack needs eps, step_size and steps."""
ENSEMBLE_RECIPES = frozenset(name for name, spec in REGISTRY.items() if spec.ensemble)
"""Recipes that train `members` models as one `Ensemble`."""
