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
        # What each row's gradient was taken against, one number (`_key`): a label and a goal in
        # one comparison, made by every call with rows at their clean input (each probe's start).
        self.key = torch.full((n,), _EMPTY, dtype=torch.long, device=x.device)

    def at_clean(self, x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """Which rows of `x` (batch rows `rows`) are their clean input, bit for bit."""
        return (x == self.x[rows]).flatten(1).all(dim=1)

    def stored(self, clean: torch.Tensor, rows: torch.Tensor, labels: torch.Tensor, targeted: bool) -> torch.Tensor:
        """Which rows are remembered: at their clean input (`at_clean`) with a gradient stored
        against the same labels and goal."""
        return clean & (self.key[rows] == _key(labels, targeted))

    def store(self, rows: torch.Tensor, labels: torch.Tensor, targeted: bool, logits: torch.Tensor,
              grad: torch.Tensor) -> None:
        if self.logits is None:
            self.logits = logits.new_zeros((self.x.shape[0], logits.shape[1]))
        self.logits[rows], self.grad[rows], self.key[rows] = logits, grad, _key(labels, targeted)

    def recall(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of the stored rows (meaningful where a key is stored)."""
        if self.logits is None:
            raise RuntimeError("nothing stored yet")
        return self.logits[rows], self.grad[rows]


_EMPTY = torch.iinfo(torch.long).min
"""The key of a row nothing is stored for: no label's key (`_key`) is this."""


def _key(labels: torch.Tensor, targeted: bool) -> torch.Tensor:
    """Labels and goal as one number per row: the label untargeted, its bitwise complement
    (−label − 1, negative) targeted."""
    return ~labels if targeted else labels
