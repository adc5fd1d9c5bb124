"""What a white-box oracle remembers of its batch's clean inputs (`WhiteBoxOracle.remember_clean`).

Every probe of the minimum-ε search of an attack that starts at x asks for the loss gradient at
the clean input again; served from here, it costs nothing (`grad_reuses` counts them).
"""

from __future__ import annotations

import torch


class CleanGradients:
    """Logits and loss gradients at the clean inputs of an oracle's batch, per sample, once evaluated."""

    def __init__(self, x: torch.Tensor) -> None:
        n = x.shape[0]
        self.x = x
        self.logits: torch.Tensor | None = None  # (n, classes) once a row is stored
        self.grad = torch.zeros_like(x)
        self.labels = torch.zeros(n, dtype=torch.long, device=x.device)
        self.targeted = torch.zeros(n, dtype=torch.bool, device=x.device)
        self.filled = torch.zeros(n, dtype=torch.bool, device=x.device)

    def lookup(self, x: torch.Tensor, rows: torch.Tensor, labels: torch.Tensor,
               targeted: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Which rows are remembered (same input bits, labels and goal), and which are at their clean input."""
        clean = (x == self.x[rows]).flatten(1).all(dim=1)
        hit = clean & self.filled[rows] & (self.labels[rows] == labels) & (self.targeted[rows] == targeted)
        return hit, clean

    def store(self, rows: torch.Tensor, labels: torch.Tensor, targeted: bool, logits: torch.Tensor,
              grad: torch.Tensor) -> None:
        if self.logits is None:
            self.logits = logits.new_zeros((self.x.shape[0], logits.shape[1]))
        self.logits[rows], self.grad[rows] = logits, grad
        self.labels[rows], self.targeted[rows], self.filled[rows] = labels, targeted, True

    def recall(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of the stored rows (meaningful where filled)."""
        if self.logits is None:
            raise RuntimeError("nothing stored yet")
        return self.logits[rows], self.grad[rows]
