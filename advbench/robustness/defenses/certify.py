"""Interval bound propagation (IBP, Gowal et al. 2018): certified ℓ∞ robustness and its training loss.

The seed's Convex defense (Wong & Kolter) certifies with an LP relaxation; advbench uses IBP
instead: the same certified quantity (a sample whose prediction provably cannot change
anywhere in the ℓ∞ ball), computed batched in a few lines per layer, exactly enough to train
with. An input box goes through the network layer by layer and every rule returns a box that
contains the layer's output for every input in its box:

- affine layers (Conv2d, Linear, BatchNorm in eval mode, the model's normalisation) map the
  centre and the radius (radius through |W|);
- monotone layers (ReLU, max and average pooling, Flatten, Identity) map both ends.

The last Linear layer is folded into the margins z_y − z_j (Gowal's elision of the
specification), which bounds them tighter than subtracting logit bounds. A layer without a
rule is an AdvbenchError naming it: bounds are never guessed.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch import nn
from torch.nn import functional as F

from advbench.core.errors import AdvbenchError
from advbench.core.norms import LINF
from advbench.core.norms import norm as norm_of
from advbench.core.steps import per_sample
from advbench.robustness.models.classifier import Classifier
from advbench.robustness.models.pool import PoolTo

Box = tuple[torch.Tensor, torch.Tensor]


def _normalise(layer: Classifier, lo: torch.Tensor, hi: torch.Tensor) -> Box:
    """(x − mean) / std with std > 0: increasing per channel, so both ends map directly."""
    mean, std = layer.mean.to(lo), layer.std.to(lo)
    return (lo - mean) / std, (hi - mean) / std


def _affine(linear: Callable[[torch.Tensor], torch.Tensor], magnitude: Callable[[torch.Tensor], torch.Tensor],
            lo: torch.Tensor, hi: torch.Tensor) -> Box:
    """Centre through the layer, radius through its absolute weights (no bias)."""
    mid, rad = (hi + lo) / 2, (hi - lo) / 2
    mid, rad = linear(mid), magnitude(rad)
    return mid - rad, mid + rad


def _linear(layer: nn.Linear, lo: torch.Tensor, hi: torch.Tensor) -> Box:
    w = layer.weight.to(lo)
    b = None if layer.bias is None else layer.bias.to(lo)
    return _affine(lambda t: F.linear(t, w, b), lambda t: F.linear(t, w.abs()), lo, hi)


def _conv2d(layer: nn.Conv2d, lo: torch.Tensor, hi: torch.Tensor) -> Box:
    w = layer.weight.to(lo)
    b = None if layer.bias is None else layer.bias.to(lo)
    kw = {"stride": layer.stride, "padding": layer.padding, "dilation": layer.dilation, "groups": layer.groups}
    return _affine(lambda t: F.conv2d(t, w, b, **kw), lambda t: F.conv2d(t, w.abs(), None, **kw), lo, hi)


def _batch_norm(layer: nn.modules.batchnorm._BatchNorm, lo: torch.Tensor, hi: torch.Tensor) -> Box:
    """Eval-mode batch norm is a per-channel affine map with the running statistics."""
    scale = torch.rsqrt(layer.running_var.to(lo) + layer.eps)
    shift = -layer.running_mean.to(lo) * scale
    if layer.affine:
        scale, shift = scale * layer.weight.to(lo), shift * layer.weight.to(lo) + layer.bias.to(lo)
    shape = (1, -1) + (1,) * (lo.dim() - 2)
    scale, shift = scale.view(shape), shift.view(shape)
    return _affine(lambda t: t * scale + shift, lambda t: t * scale.abs(), lo, hi)


def _monotone(layer: nn.Module, lo: torch.Tensor, hi: torch.Tensor) -> Box:
    """Non-decreasing element-wise or pooling maps keep the order of the box's ends."""
    return layer(lo), layer(hi)


Rule = Callable[[Any, torch.Tensor, torch.Tensor], Box]
RULES: dict[type[nn.Module], Rule] = {
    nn.Linear: _linear,
    nn.Conv2d: _conv2d,
    nn.BatchNorm1d: _batch_norm,
    nn.BatchNorm2d: _batch_norm,
    nn.ReLU: _monotone,
    nn.Flatten: _monotone,
    nn.Identity: _monotone,
    nn.MaxPool2d: _monotone,
    nn.AvgPool2d: _monotone,
    nn.AdaptiveAvgPool2d: _monotone,
    PoolTo: _monotone,
}
"""Interval rules by exact layer type (a subclass may change `forward`, so it is not assumed)."""


def _unsupported(name: str, layer: nn.Module) -> AdvbenchError:
    kinds = ", ".join(sorted(t.__name__ for t in RULES))
    return AdvbenchError(f"interval bound propagation cannot bound layer '{name}' ({type(layer).__name__}); "
                         f"it needs a Classifier around an nn.Sequential of: {kinds}")


def layers(model: nn.Module) -> list[tuple[Rule, nn.Module]]:
    """The model as a chain of (rule, layer), checked before any bound is computed.

    A `Classifier` contributes its normalisation, then its network; nested `nn.Sequential`
    blocks are flattened. BatchNorm counts only in eval mode (training-mode statistics depend
    on the batch, so a box has no fixed image), convolutions only with zero padding.
    """
    if type(model) is not Classifier:  # a subclass may normalise differently
        raise _unsupported("model", model)
    chain: list[tuple[Rule, nn.Module]] = [(_normalise, model)]

    def visit(name: str, layer: nn.Module) -> None:
        if type(layer) is nn.Sequential:
            for child_name, child in layer.named_children():
                visit(f"{name}.{child_name}", child)
            return
        rule = RULES.get(type(layer))
        if rule is None or (isinstance(layer, nn.Conv2d) and layer.padding_mode != "zeros"):
            raise _unsupported(name, layer)
        if isinstance(layer, nn.modules.batchnorm._BatchNorm) and (layer.training or layer.running_var is None):
            raise AdvbenchError(f"interval bound propagation needs layer '{name}' ({type(layer).__name__}) "
                                "in eval mode with running statistics")
        chain.append((rule, layer))

    visit("net", model.net)
    return chain


def supports(model: nn.Module) -> bool:
    """Whether IBP can bound `model` (the engine's `certified` column is NaN where it cannot)."""
    try:
        layers(model)
    except AdvbenchError:
        return False
    return True


def input_box(x: torch.Tensor, eps: float | torch.Tensor, bounds: tuple[float, float] = (0.0, 1.0)) -> Box:
    """The ℓ∞ ball of radius `eps` (a float or one per sample) around `x`, cut to the input bounds."""
    eps_t = torch.as_tensor(eps, dtype=x.dtype, device=x.device)
    if eps_t.dim() == 1:
        eps_t = per_sample(eps_t, x)
    return (x - eps_t).clamp(*bounds), (x + eps_t).clamp(*bounds)


def interval_bounds(model: nn.Module, lo: torch.Tensor, hi: torch.Tensor) -> Box:
    """Lower and upper bounds of every logit over the input box [lo, hi]."""
    for rule, layer in layers(model):
        lo, hi = rule(layer, lo, hi)
    return lo, hi


def margin_bounds(model: nn.Module, x: torch.Tensor, y: torch.Tensor, eps: float | torch.Tensor) -> torch.Tensor:
    """Lower bounds (N, K) of z_y − z_j over the ℓ∞ ball of radius `eps`; column y is 0.

    Computed in the input's dtype; with a final Linear layer its rows are combined into
    w_y − w_j before the bound (elision), else logit bounds are subtracted.
    """
    chain = layers(model)
    lo, hi = input_box(x, eps, getattr(model, "bounds", (0.0, 1.0)))
    last_rule, last = chain[-1]
    elide = last_rule is _linear
    for rule, layer in chain[:-1] if elide else chain:
        lo, hi = rule(layer, lo, hi)
    if elide:
        w = last.weight.to(lo)
        diff_w = w[y].unsqueeze(1) - w.unsqueeze(0)  # (N, K, H): w_y − w_j
        mid, rad = (hi + lo) / 2, (hi - lo) / 2
        margin = torch.einsum("nkh,nh->nk", diff_w, mid) - torch.einsum("nkh,nh->nk", diff_w.abs(), rad)
        if last.bias is not None:
            b = last.bias.to(lo)
            margin = margin + (b[y].unsqueeze(1) - b.unsqueeze(0))
    else:
        margin = lo.gather(1, y[:, None]) - hi
    return margin.scatter(1, y[:, None], 0.0)


def certified(model: nn.Module, x: torch.Tensor, y: torch.Tensor, eps: float | torch.Tensor) -> torch.Tensor:
    """Per sample: the model provably predicts `y` everywhere in the ℓ∞ ball of radius `eps`.

    Bounds are computed in float64 so that float32 rounding in the bound cannot certify a
    margin that is not there. A certified sample is classified correctly (x is in its ball)
    and no ℓ∞ attack within `eps`, targeted or not, can change its prediction.
    """
    with torch.no_grad():
        margin = margin_bounds(model, x.double(), y, eps)
    margin = margin.scatter(1, y[:, None], math.inf)
    return (margin > 0).all(dim=1)


def certified_column(model: nn.Module, x: torch.Tensor, y: torch.Tensor, norm: str, eps: float) -> torch.Tensor:
    """The records' `certified` column: 1.0 where IBP verifies the ℓ∞ ball of radius `eps`
    (raw units), 0.0 where it does not, NaN for ℓ2 threats and models it cannot bound."""
    if norm_of(norm) is not LINF or not supports(model):
        return torch.full((x.shape[0],), math.nan, dtype=torch.float64)
    return certified(model, x, y, eps).double().cpu()


class IBPRecipe(Protocol):
    """The recipe fields the IBP loss reads (`recipes.base.Recipe` has them)."""

    eps: float
    kappa: float
    warmup_steps: int
    rampup_steps: int


def check_recipe(recipe: IBPRecipe) -> None:
    """The schedule's settings, checked before the first step."""
    if recipe.eps <= 0 or not 0 <= recipe.kappa <= 1 or recipe.warmup_steps < 0 or recipe.rampup_steps < 0:
        raise AdvbenchError("recipe 'convex' needs eps > 0, 0 <= kappa <= 1, warmup_steps >= 0, rampup_steps >= 0; "
                            f"got {recipe.eps}, {recipe.kappa}, {recipe.warmup_steps}, {recipe.rampup_steps}")


def ibp_schedule(step: int, recipe: IBPRecipe) -> tuple[float, float]:
    """(ε, κ) at optimizer step `step` (from 0), as in Gowal et al.

    `warmup_steps` of clean training (ε = 0, κ = 1), then over `rampup_steps` ε grows
    linearly to `recipe.eps` and κ falls linearly to `recipe.kappa`; both stay there.
    """
    ramp = min(max(step - recipe.warmup_steps, 0) / max(recipe.rampup_steps, 1), 1.0)
    return ramp * recipe.eps, 1.0 - ramp * (1.0 - recipe.kappa)


_STEPS: weakref.WeakKeyDictionary[nn.Module, int] = weakref.WeakKeyDictionary()
"""Optimizer steps taken per model: the training loop calls the loss once per step."""


def ibp_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor, recipe: IBPRecipe) -> torch.Tensor:
    """κ·CE(z(x), y) + (1 − κ)·CE(ẑ, y), ẑ_j the upper bound of z_j − z_y over the ε-ball.

    ε and κ follow `ibp_schedule` on the number of times this model's loss was taken.
    """
    step = _STEPS.get(model, 0)
    _STEPS[model] = step + 1
    if step == 0:  # a bad recipe or an unsupported model fails at the first batch, not after the warm-up
        check_recipe(recipe)
        layers(model)
    eps, kappa = ibp_schedule(step, recipe)
    nominal = F.cross_entropy(model(x), y)
    if eps == 0.0:
        return nominal
    worst = -margin_bounds(model, x, y, eps)
    return kappa * nominal + (1.0 - kappa) * F.cross_entropy(worst, y)
