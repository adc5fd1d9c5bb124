"""Recipe `alp` (Kannan et al. 2018): adversarial logit pairing on clean/PGD pairs."""

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


def logit_pairing(clean: torch.Tensor, adversarial: torch.Tensor) -> torch.Tensor:
    """ALP's pairing term: squared ℓ2 distance between paired logits, averaged over pairs."""
    return (clean - adversarial).pow(2).sum(dim=1).mean()


@REGISTRY.register("alp", inner_attack=True)
def alp_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor, recipe: Recipe) -> torch.Tensor:
    """Kannan et al.: mixed clean/PGD cross-entropy + λ·‖Z(x) − Z(x_adv)‖² over each clean/adversarial pair."""
    with eval_mode(model):
        x_adv = pgd_linf(cross_entropy_objective(model, y), x, recipe.eps, recipe.inner_step, recipe.steps)
    clean, adversarial = model(x), model(x_adv)
    mixed = (F.cross_entropy(clean, y) + F.cross_entropy(adversarial, y)) / 2
    return mixed + recipe.pairing_weight * logit_pairing(clean, adversarial)
