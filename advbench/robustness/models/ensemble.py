"""An ensemble of classifiers judged as one model (ADP's three members).

The members' softmax outputs are averaged, as Pang et al. predict. The forward pass returns
log of that mean (log-probabilities, not logits): cross-entropy on it is exactly the
ensemble's negative log-likelihood and argmax is the ensemble's prediction, so attacks that
take gradients of margins or CE see the deployed decision rule rather than one member's, or
logits averaged in a way the defense never uses.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from advbench.robustness.models.classifier import Classifier


class Ensemble(nn.Module):
    """`log(mean_k softmax(member_k(x)))`; `member_logits` keeps the members apart for training."""

    bounds: tuple[float, float] = (0.0, 1.0)
    randomized: bool = False

    def __init__(self, members: Sequence[Classifier]) -> None:
        super().__init__()
        if len(members) < 2:
            raise ValueError(f"an ensemble needs at least 2 members, got {len(members)}")
        self.members = nn.ModuleList(members)
        self.arch = f"{members[0].arch}x{len(members)}"

    def member_logits(self, x: torch.Tensor) -> torch.Tensor:
        """(K, N, C): every member's logits."""
        return torch.stack([member(x) for member in self.members])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        log_probs = torch.log_softmax(self.member_logits(x), dim=-1)
        return torch.logsumexp(log_probs, dim=0) - math.log(len(self.members))
