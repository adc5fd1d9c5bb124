"""Recipe `rse` (Liu et al. 2018): train with the random self-ensemble's noise, as it is deployed.

The noise layers are the forward pre-hooks of `defenses.noise_layers` (`conv_noise`); training draws
with torch's generator, seeded by the trainer.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from advbench.robustness.defenses.noise_layers import conv_noise
from advbench.robustness.defenses.recipes.recipe_schema import REGISTRY, Recipe


@REGISTRY.register("rse")
def rse_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor, recipe: Recipe) -> torch.Tensor:
    """Cross-entropy of one noisy pass: the network learns with the noise it is deployed with."""
    with conv_noise(model, lambda a, _layer: recipe.inner_noise * torch.randn_like(a)):
        return F.cross_entropy(model(x + recipe.init_noise * torch.randn_like(x)), y)
