"""Threat models: norm, goal, knowledge and budget, plus the distances records report."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from advbench.core.errors import AdvbenchError
from advbench.robustness.naming import GOALS

NORMS = ("linf", "l2")
KNOWLEDGE = ("white", "transfer", "score", "decision")
CORRUPTION = "corruption"
CONFIG_NORMS = (*NORMS, CORRUPTION)
"""What a `conf/threat` option's `norm` may be: an ℓp ball, or `corruption` (`threat=corruptions`:
no attack, the model on corrupted inputs; `evaluation/corruption_cell.py`)."""


@dataclass(frozen=True)
class ThreatModel:
    """Budgets are in the threat model's own units: for normalised ℓ2 that is ‖δ‖₂/√d."""

    norm: str
    goal: str
    eps: float
    knowledge: str = "white"
    normalized_l2: bool = False

    def __post_init__(self) -> None:
        for value, valid, what in ((self.norm, NORMS, "norm"), (self.goal, GOALS, "goal"),
                                   (self.knowledge, KNOWLEDGE, "knowledge")):
            if value not in valid:
                raise AdvbenchError(f"unknown threat {what} '{value}'; valid: {', '.join(valid)}")
        if not (math.isfinite(self.eps) and self.eps > 0):
            raise AdvbenchError(f"threat budget eps must be a positive finite number, got {self.eps}")
        if self.normalized_l2 and self.norm != "l2":
            raise AdvbenchError("normalized_l2 applies to the l2 norm only")

    @property
    def targeted(self) -> bool:
        return self.goal == "targeted"

    def scale(self, x: torch.Tensor) -> float:
        """Factor from threat units to the raw ℓp norm of a perturbation of `x`'s shape."""
        return math.sqrt(x[0].numel()) if self.normalized_l2 else 1.0

    def distance(self, x_adv: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Per-sample distance in threat units."""
        d = distances(x_adv, x)
        if self.norm == "linf":
            return d["linf"]
        return d["l2_norm"] if self.normalized_l2 else d["l2"]


def distances(x_adv: torch.Tensor, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """ℓ∞, ℓ2 and normalised ℓ2 (‖δ‖₂/√d) per sample."""
    delta = (x_adv - x).flatten(1)
    l2 = delta.norm(p=2, dim=1)
    return {"linf": delta.abs().amax(dim=1), "l2": l2, "l2_norm": l2 / math.sqrt(delta.shape[1])}


def goal_met(pred: torch.Tensor, labels: torch.Tensor, target: torch.Tensor | None) -> torch.Tensor:
    """Untargeted: pred != label. Targeted: pred == target."""
    return pred == target if target is not None else pred != labels
