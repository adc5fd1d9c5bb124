"""What every attack sees (an oracle) and returns (an AttackResult).

The base class owns `__call__`: it checks inputs once, so subclasses implement `run` and
never see a raw model. A white-box oracle hands out logits and input gradients and counts
gradient evaluations per sample; later knowledge levels (score, decision) expose less.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from advbench.errors import AdvbenchError
from advbench.threat import goal_met


@dataclass
class AttackResult:
    """Per-sample outcome of one batched attack call.

    `first_success` is the iteration after which the sample first met the goal (0: already
    adversarial before any step, -1: never); `success` refers to the returned `x_adv`.
    """

    x_adv: torch.Tensor
    success: torch.Tensor
    first_success: torch.Tensor
    grad_evals: torch.Tensor


class WhiteBoxOracle:
    """Logits and cross-entropy input gradients of a model, with per-sample cost counting."""

    knowledge = "white"

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.bounds: tuple[float, float] = tuple(getattr(model, "bounds", (0.0, 1.0)))  # type: ignore[assignment]

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            return self.model(x)

    def loss_grad(self, x: torch.Tensor, labels: torch.Tensor, targeted: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits at x and the gradient of the attacker's objective (to be ascended).

        Untargeted: CE(logits, y). Targeted: −CE(logits, target), so ascending it moves
        towards the target class. Per-sample losses are summed, so each sample's gradient is
        its own (models are in eval mode).
        """
        x = x.detach().requires_grad_(True)
        with torch.enable_grad():
            logits = self.model(x)
            loss = F.cross_entropy(logits, labels, reduction="sum")
            grad, = torch.autograd.grad(-loss if targeted else loss, x)
        return logits.detach(), grad


class Attack:
    """Base class: hyperparameters in `__init__`, data at call time."""

    kind: ClassVar[str] = "budgeted"
    knowledge: ClassVar[tuple[str, ...]] = ("white",)
    norms: ClassVar[tuple[str, ...]] = ("linf", "l2")

    def __call__(self, oracle: WhiteBoxOracle, x: torch.Tensor, y: torch.Tensor, *, eps: torch.Tensor,
                 norm: str, target: torch.Tensor | None = None) -> AttackResult:
        if norm not in self.norms:
            raise AdvbenchError(f"{type(self).__name__} supports norms {', '.join(self.norms)}, got '{norm}'")
        if oracle.knowledge not in self.knowledge:
            raise AdvbenchError(f"{type(self).__name__} needs {'/'.join(self.knowledge)} access, got a {oracle.knowledge} oracle")
        n = x.shape[0]
        if eps.shape != (n,):
            raise ValueError(f"eps must have shape ({n},), got {tuple(eps.shape)}")
        if bool((eps < 0).any()) or not bool(torch.isfinite(eps).all()):
            raise AdvbenchError("eps must be finite and >= 0 for every sample")
        if target is not None and target.shape != y.shape:
            raise ValueError(f"target must have shape {tuple(y.shape)}, got {tuple(target.shape)}")
        return self.run(oracle, x, y, eps=eps.to(x), norm=norm, target=target)

    def run(self, oracle: WhiteBoxOracle, x: torch.Tensor, y: torch.Tensor, *, eps: torch.Tensor,
            norm: str, target: torch.Tensor | None) -> AttackResult:  # pragma: no cover - abstract
        raise NotImplementedError

    def params(self) -> dict[str, object]:
        """Hyperparameters for the record's `attack_params` column."""
        return {k: v for k, v in vars(self).items() if not k.startswith("_")}


def success_of(logits: torch.Tensor, y: torch.Tensor, target: torch.Tensor | None) -> torch.Tensor:
    return goal_met(logits.argmax(dim=1), y, target)
