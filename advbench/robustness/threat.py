"""Threat models: norm, goal, knowledge and budget, plus the distances records report."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from advbench.core.errors import AdvbenchError
from advbench.core.norms import L0_NORM, L1_NORM, L2_NORM, LINF, PATCH, Norm
from advbench.core.norms import norm as norm_of
from advbench.robustness.naming import GOALS

NORMS = (LINF.name, L2_NORM.name, L1_NORM.name, L0_NORM.name, PATCH.name)
"""The norms threats are measured in today (their YAMLs exist); `core.norms` holds every norm."""
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
        norm_of(self.norm)  # an unknown norm is refused here, in one line
        for value, valid, what in ((self.norm, NORMS, "norm"), (self.goal, GOALS, "goal"),
                                   (self.knowledge, KNOWLEDGE, "knowledge")):
            if value not in valid:
                raise AdvbenchError(f"unknown threat {what} '{value}'; valid: {', '.join(valid)}")
        if not (math.isfinite(self.eps) and self.eps > 0):
            raise AdvbenchError(f"threat budget eps must be a positive finite number, got {self.eps}")
        self.ball.check_budget(self.eps)
        if self.normalized_l2 and not self.ball.normalizable:
            raise AdvbenchError("normalized_l2 applies to the l2 norm only")

    @property
    def ball(self) -> Norm:
        """The norm the budget is measured in (`core.norms`)."""
        return norm_of(self.norm)

    @property
    def targeted(self) -> bool:
        return self.goal == "targeted"

    def scale(self, x: torch.Tensor) -> float:
        """Factor from threat units to the raw ℓp norm of a perturbation of `x`'s shape."""
        return self.ball.normalized_scale(x[0].numel()) if self.normalized_l2 else 1.0

    def distance(self, x_adv: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Per-sample distance in threat units."""
        d = self.ball.distance(x_adv, x)
        return d / self.ball.normalized_scale(x[0].numel()) if self.normalized_l2 else d


def distances(x_adv: torch.Tensor, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """The records' distance columns per sample: each of `RECORDED`'s norms by name, and normalised ℓ2
    (‖δ‖₂/√d) as `l2_norm`."""
    delta = (x_adv - x).flatten(1)
    d = {n.name: n.size(delta) for n in RECORDED}
    d[f"{L2_NORM.name}_norm"] = d[L2_NORM.name] / L2_NORM.normalized_scale(delta.shape[1])
    return d


RECORDED = (LINF, L2_NORM)
"""The norms every record reports a distance in (`dist_<name>` columns), whatever its threat's norm."""


def goal_met(pred: torch.Tensor, labels: torch.Tensor, target: torch.Tensor | None) -> torch.Tensor:
    """Untargeted: pred != label. Targeted: pred == target."""
    return pred == target if target is not None else pred != labels
