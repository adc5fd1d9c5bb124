"""Recipe `natural`: plain cross-entropy training, the undefended baseline every defense is compared with."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from advbench.robustness.defenses.recipes.recipe_schema import REGISTRY, Recipe


@REGISTRY.register("natural")
def natural_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor, recipe: Recipe) -> torch.Tensor:
    return F.cross_entropy(model(x), y)
