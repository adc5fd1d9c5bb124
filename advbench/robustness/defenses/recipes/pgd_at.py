"""Recipe `pgd_at` (Madry et al. 2018): adversarial training on ℓ∞ PGD examples."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from advbench.robustness.defenses.inner import (
    cross_entropy_objective,
    eval_mode,
    pgd_linf,
)
from advbench.robustness.defenses.recipes.recipe_schema import REGISTRY, Recipe


@REGISTRY.register("pgd_at", inner_attack=True)
def pgd_at_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor, recipe: Recipe) -> torch.Tensor:
    """Madry et al.: cross-entropy on ℓ∞ PGD examples from a uniform random start."""
    with eval_mode(model):
        x_adv = pgd_linf(cross_entropy_objective(model, y), x, recipe.eps, recipe.inner_step, recipe.steps)
    return F.cross_entropy(model(x_adv), y)
