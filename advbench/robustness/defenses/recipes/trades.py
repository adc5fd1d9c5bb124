"""Recipe `trades` (Zhang et al. 2019): clean cross-entropy plus a KL robustness term on adversaries."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from advbench.robustness.defenses.inner import eval_mode, kl_objective, pgd_linf
from advbench.robustness.defenses.recipes.recipe_schema import REGISTRY, Recipe


@REGISTRY.register("trades", inner_attack=True)
def trades_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor, recipe: Recipe) -> torch.Tensor:
    """Zhang et al.: CE(f(x), y) + beta * KL(f(x) || f(x_adv)), x_adv maximising the KL."""
    with eval_mode(model):
        clean_probs = F.softmax(model(x), dim=1).detach()
        x_adv = pgd_linf(kl_objective(model, clean_probs), x, recipe.eps, recipe.inner_step, recipe.steps, start="gaussian")
    logits = model(x)
    robust = F.kl_div(F.log_softmax(model(x_adv), dim=1), F.softmax(logits, dim=1), reduction="batchmean")
    return F.cross_entropy(logits, y) + recipe.beta * robust
