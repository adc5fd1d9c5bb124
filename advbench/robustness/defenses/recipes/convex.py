"""Recipe `convex`: certified training with interval bound propagation (Gowal et al. 2018).

The loss and its ε/κ schedule live with the bounds they train in `defenses.certify`
(`ibp_loss`, which also checks the recipe's kappa and ramp settings at the first step).
"""

from __future__ import annotations

import torch
from torch import nn

from advbench.robustness.defenses.certify import ibp_loss
from advbench.robustness.defenses.recipes.recipe_schema import REGISTRY, Recipe


@REGISTRY.register("convex")
def convex_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor, recipe: Recipe) -> torch.Tensor:
    """`certify.ibp_loss`: κ·CE on the clean logits plus (1 − κ)·CE on the IBP worst-case logits."""
    return ibp_loss(model, x, y, recipe)
