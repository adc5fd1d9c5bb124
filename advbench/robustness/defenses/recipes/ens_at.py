"""Recipe `ens_at` (Tramèr et al. 2018): ensemble adversarial training on single-step examples.

The single steps (`single_step: fgsm | step_ll`) are objectives of the inner maximisation and
live with it in `defenses.inner` (`SINGLE_STEPS`), where the recipe schema validates
`single_step:` without importing this module. The static source models are loaded
by the checkpoint cache (`defenses.trained`) and passed to the loss as `static_models`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from advbench.robustness.defenses.inner import SINGLE_STEPS, eval_mode, pgd_linf
from advbench.robustness.defenses.recipes.recipe_schema import REGISTRY, Recipe


@REGISTRY.register("ens_at", inner_attack=True)
def ens_at_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor, recipe: Recipe,
                static_models: Sequence[nn.Module] = ()) -> torch.Tensor:
    """Tramèr et al.: half of each batch replaced by single-step examples from the current
    model or one static pre-trained model (drawn uniformly per batch), weighted as Kurakin
    et al.: (Σ_clean CE + λ·Σ_adv CE) / (m − k + λ·k)."""
    half = x.shape[0] // 2
    sources = [model, *static_models]
    source = sources[int(torch.randint(len(sources), ()))]
    x_adv, y_adv = x[half:], y[half:]
    with eval_mode(model):
        objective = SINGLE_STEPS[recipe.single_step](source, x_adv, y_adv)
        x_adv = pgd_linf(objective, x_adv, recipe.eps, recipe.eps, 1, start="none")
    clean = F.cross_entropy(model(x[:half]), y[:half], reduction="sum") if half else x.new_zeros(())
    adversarial = F.cross_entropy(model(x_adv), y_adv, reduction="sum")
    return (clean + recipe.adv_weight * adversarial) / (half + recipe.adv_weight * (x.shape[0] - half))
