"""Recipe `adp` (Pang et al. 2019): adaptive diversity promoting training of an ensemble.

The recipe trains `members` models as one `models.ensemble.Ensemble` and regularises the
ensemble's entropy and the diversity of its members' non-true-class predictions.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from advbench.robustness.defenses.recipes.recipe_schema import REGISTRY, Recipe

# ADP's numerical guards, the authors' values: log(p + 1e-20) in the entropy, + 1e-6·I under the log-det.
_LOG_OFFSET = 1e-20
_DET_OFFSET = 1e-6


def adp_regularizer(member_probs: torch.Tensor, y: torch.Tensor, alpha: float, beta: float) -> torch.Tensor:
    """−α·H(mean_k p_k) − β·log det(M̃ᵀM̃ + 1e-6·I), averaged over the batch (Pang et al. 2019).

    `member_probs` is (K, N, C). M̃ holds each member's non-true-class probabilities, each
    column scaled to unit ℓ2 norm; its Gram determinant is the ensemble diversity.
    """
    mean = member_probs.mean(dim=0)
    entropy = -(mean * torch.log(mean + _LOG_OFFSET)).sum(dim=1)
    k, n, c = member_probs.shape
    keep = ~F.one_hot(y, c).bool()
    non_true = member_probs.permute(1, 0, 2)[keep[:, None, :].expand(n, k, c)].view(n, k, c - 1)
    non_true = non_true / non_true.norm(dim=2, keepdim=True)
    gram = non_true @ non_true.transpose(1, 2)
    log_det = torch.logdet(gram + _DET_OFFSET * torch.eye(k, dtype=gram.dtype, device=gram.device))
    return (-alpha * entropy - beta * log_det).mean()


@REGISTRY.register("adp", ensemble=True)
def adp_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor, recipe: Recipe) -> torch.Tensor:
    """Pang et al.: Σ_k CE(member_k) − α·ensemble entropy − β·log ensemble diversity."""
    logits = model.member_logits(x)
    ce = sum(F.cross_entropy(member, y) for member in logits)
    return ce + adp_regularizer(F.softmax(logits, dim=-1), y, recipe.alpha, recipe.beta)
