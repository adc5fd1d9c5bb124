"""Recipe `deepdefense` (Yan et al. 2018): a regulariser on the size of an unrolled, differentiable DeepFool step.

The DeepFool perturbation is computed with the benchmark's own boundary step
(`attacks.minimum_norm.nearest_boundary_step`) but keeps its graph, so the penalty's gradient
flows through every unrolled step into the weights.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from advbench.core.norms import L2_NORM
from advbench.core.steps import per_sample
from advbench.robustness.attacks.minimum_norm import goal_margin, nearest_boundary_step
from advbench.robustness.defenses.inner import eval_mode
from advbench.robustness.defenses.recipes.recipe_schema import REGISTRY, Recipe


def unrolled_deepfool(model: nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int,
                      overshoot: float) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepDefense's ℓ2 DeepFool perturbation (1 + overshoot)·r, differentiable in the weights,
    and which samples the model classifies correctly.

    Correctly classified samples step to the nearest linearised boundary of any other class;
    misclassified ones towards their true class (the authors' correction). Every boundary is
    f_c = Z_c − max_{j≠c} Z_j, so both cases are one batched computation; the step is the
    benchmark's DeepFool step (`nearest_boundary_step`), with gradients kept for double
    backward. A sample stops moving once its (overshot) iterate crosses, as in the original;
    iterates are not clipped to the image range (neither are the authors').
    """
    with torch.no_grad():
        logits = model(x)
    (n, num_classes), pred = logits.shape, logits.argmax(1)
    correct = pred == y
    others = torch.arange(num_classes, device=x.device).expand(n, -1)
    others = others[others != pred[:, None]].view(n, num_classes - 1)
    classes = torch.where(correct[:, None], others, y[:, None].expand_as(others))
    k = classes.shape[1]
    flat = classes.reshape(-1)
    r = torch.zeros_like(x)
    moving = torch.ones(n, dtype=x.dtype, device=x.device)
    for _ in range(steps):
        xt = (x + r).repeat_interleave(k, dim=0)
        if not xt.requires_grad:
            xt.requires_grad_(True)
        f = -goal_margin(model(xt), flat, flat)
        (grad,) = torch.autograd.grad(f.sum(), xt, create_graph=True)
        step = nearest_boundary_step(f.view(n, k), grad.view(n, k, *x.shape[1:]), L2_NORM)
        r = r + per_sample(moving, x) * step
        with torch.no_grad():
            now = model(x + (1 + overshoot) * r).argmax(1)
            crossed = torch.where(correct, now != pred, now == y)
        moving = moving * (~crossed).to(x.dtype)
        if not moving.any():
            break
    return (1 + overshoot) * r, correct


@REGISTRY.register("deepdefense")
def deepdefense_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor, recipe: Recipe) -> torch.Tensor:
    """Yan et al.: CE + λ·mean over the batch of exp(−c·ρ) (correct) or exp(d·ρ) (wrong), ρ = ‖r‖₂/‖x‖₂.

    Correct samples are pushed to need larger DeepFool perturbations, wrong ones towards the
    boundary of their true class; the gradient flows through every unrolled DeepFool step.
    """
    with eval_mode(model):
        r, correct = unrolled_deepfool(model, x, y, recipe.deepfool_steps, recipe.overshoot)
    ratio = r.flatten(1).norm(dim=1) / x.flatten(1).norm(dim=1).clamp_min(1e-12)
    penalty = torch.where(correct, torch.exp(-recipe.reg_c * ratio), torch.exp(recipe.reg_d * ratio))
    return F.cross_entropy(model(x), y) + recipe.reg_weight * penalty.mean()
