"""Signs that a model's gradients are masked: the checks AutoAttack runs before attacking.

A white-box attack that follows masked gradients reports robustness the model does not have.
`gradient_flags` looks at the model as deployed, with BPDA switched off (the plain autograd
gradient an attacker without the approximation gets), on one batch:

- `flag_zero_grad`: some sample's input gradient of its logit margin Z_y − max_{j≠y} Z_j is
  exactly zero (a rounding, a JPEG codec, a saturated output) or not finite (a log of zero, an
  overflow): either way an attack following it goes nowhere. The margin, not the
  cross-entropy, so that a confident natural model (softmax at exactly 1) is not flagged;
- `flag_randomized`: two forward passes of the same batch give different outputs;
- `flag_probabilities`: every output lies in [0, 1] and each row sums to 1 (softmax outputs
  flatten the cross-entropy's gradient);
- `flag_dynamic`: a forward pass calls autograd itself (`torch.autograd.grad`, `backward`): the
  model optimises at inference (a purification, a test-time adaptation), which a fixed-model
  attack does not see through (AutoAttack's `check_dynamic`, by the same trace of calls).

The checks run on a copy of the model, so a randomized model's draws in the evaluation are
those it would make without them. A flag on a wrapper whose records say `grad_mode` bpda or
eot is expected (the adaptive gradient is the remedy); with `exact` it means the attack may
overestimate robustness.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, Subset

from advbench.core.resume import warn
from advbench.robustness.attacks.minimum_norm import goal_margin

FLAG_COLUMNS = ("flag_zero_grad", "flag_randomized", "flag_probabilities", "flag_dynamic")
_AUTOGRAD_CALLS = frozenset({"grad", "backward", "_make_grads"})
PROBABILITY_TOLERANCE = 1e-4


def zero_gradient_fraction(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Fraction of rows whose margin gradient w.r.t. the input is unusable: all zero (no path counts as
    zero) or holding a NaN or an infinity."""
    x = x.detach().clone().requires_grad_(True)
    with torch.enable_grad():
        margin = goal_margin(model(x), y, None)
        if not margin.requires_grad:
            return 1.0
        grad, = torch.autograd.grad(margin.sum(), x, allow_unused=True)
    if grad is None:
        return 1.0
    rows = grad.flatten(1)
    return float(((rows.abs().amax(dim=1) == 0) | ~torch.isfinite(rows).all(dim=1)).float().mean())


def calls_autograd(model: nn.Module, x: torch.Tensor) -> tuple[bool, torch.Tensor]:
    """Whether one forward pass of `model` on `x` calls torch's autograd entry points, and its outputs.

    Traced by function name in torch's own files (as AutoAttack does), so a user's function
    called `grad` does not count; only while the pass runs, then the previous tracer is back.
    """
    called = []

    def trace(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_name in _AUTOGRAD_CALLS and "torch" in Path(frame.f_code.co_filename).parts:
            called.append(frame.f_code.co_name)

    before = sys.gettrace()
    sys.settrace(trace)
    try:
        with torch.no_grad():
            out = model(x)
    finally:
        sys.settrace(before)
    return bool(called), out


def gradient_flags(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[dict[str, bool], float]:
    """The flag columns for `model` on the batch (x, y), and the zero-gradient fraction."""
    probe = copy.deepcopy(model)
    for module in probe.modules():
        if hasattr(module, "straight_through"):
            module.straight_through = False
    dynamic, first = calls_autograd(probe, x)
    with torch.no_grad():
        second = probe(x)
    rows = first.sum(dim=1)
    probabilities = bool(first.min() >= 0 and first.max() <= 1
                         and torch.allclose(rows, torch.ones_like(rows), atol=PROBABILITY_TOLERANCE))
    zero = zero_gradient_fraction(probe, x, y)
    flags = {"flag_zero_grad": zero > 0, "flag_randomized": not torch.equal(first, second),
             "flag_probabilities": probabilities, "flag_dynamic": dynamic}
    return flags, zero


def cell_flags(model: nn.Module, eval_set: Dataset, positions: Sequence[int], device: torch.device, *,
               label: str, warn_user: bool) -> dict[str, bool]:
    """Flags of a cell, from the samples at `positions` (its first batch, whatever a resumed run
    has left to do, so every chunk of the cell carries the same flags); with `warn_user`, a
    line on stderr names each flag that fired."""
    if not positions:
        return dict.fromkeys(FLAG_COLUMNS, False)
    x, y = next(iter(DataLoader(Subset(eval_set, list(positions)), batch_size=len(positions))))[:2]
    flags, zero = gradient_flags(model, x.to(device), y.to(device))
    if warn_user and any(flags.values()):
        said = {"flag_zero_grad": f"zero or non-finite input gradients for {zero:.0%} of the first batch",
                "flag_randomized": "randomized outputs (two passes differ)",
                "flag_probabilities": "outputs look like probabilities, not logits",
                "flag_dynamic": "the model calls autograd at inference (a dynamic defense)"}
        warn(f"{label}: gradients may be masked: {'; '.join(said[k] for k, v in flags.items() if v)}")
    return flags
