"""A randomized model's verdict on examples: the vote over fresh passes every judgement of success uses.

Success on a randomized model is a property of its output distribution, not of one draw, so
the engine (`evaluation.batch`) and the oracles' `verdict` judge examples by `vote`: over
`draws` fresh passes, an example meets the goal when at least half of them do.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from advbench.core.errors import AdvbenchError
from advbench.core.runtime import forward, probe_rows
from advbench.robustness.attacks.model_draws import Drawing, RowCalls, copy_counts, eot_copies, stacked
from advbench.robustness.threat import goal_met


def logits_of(model: nn.Module, x: torch.Tensor, draw: Drawing | None = None) -> torch.Tensor:
    """Logits with no autograd graph: computed under inference mode in the model's deployed
    precision and memory format (`advbench.core.runtime.forward`), as a plain tensor of the input's dtype; `draw`: the pass's row keys."""
    with draw if draw is not None else Drawing(None), torch.inference_mode():
        out = forward(model, x)
    return out.clone()


@dataclass(frozen=True)
class Vote:
    """A model's verdict on each row of a batch, over `draws` passes (one for a deterministic model).

    `fraction`: share of the passes whose top-1 label meets the goal; `met`: fraction >= 1/2.
    `pred`: the most frequent label among the passes that agree with `met` (so an untargeted
    `met` ⇔ pred != y, a targeted one ⇔ pred == target). `logits`: their mean over the passes.
    """

    pred: torch.Tensor
    met: torch.Tensor
    fraction: torch.Tensor
    logits: torch.Tensor


def vote(model: nn.Module, x: torch.Tensor, y: torch.Tensor, target: torch.Tensor | None, draws: int, *,
         calls: RowCalls | None = None, rows: torch.Tensor | None = None) -> Vote:
    """The model's verdict on `x`, batch rows `rows` of `calls`, over `draws` fresh passes, uncounted.

    Success on a randomized model is a property of its output distribution, not of one draw:
    stopping on one lucky pass over-credits the attack's iterate and, through early stopping,
    under-credits the attack itself.
    """
    if draws < 1:
        raise AdvbenchError(f"judge.draws must be a whole number >= 1, got {draws}")
    passes = _passes(model, x, draws, calls, rows)                                # (draws, n, K)
    labels = passes.argmax(dim=2)                                                 # (draws, n)
    meets = goal_met(labels, y[None, :], None if target is None else target[None, :])
    fraction = meets.double().mean(dim=0)
    met = fraction >= 0.5
    logits = passes.mean(dim=0)
    agree = (meets == met[None, :]).to(logits.dtype)
    counts = torch.zeros_like(logits).scatter_add_(1, labels.T, agree.T)
    return Vote(pred=counts.argmax(dim=1), met=met, fraction=fraction, logits=logits)


def _passes(model: nn.Module, x: torch.Tensor, draws: int, calls: RowCalls | None,
            rows: torch.Tensor | None) -> torch.Tensor:
    """The logits of `draws` passes at `x`, (draws, n, K): as stacked copies of x, `eot_copies` a
    call within a forward-only call's rows (`probe_rows`), where each pass then draws what a call
    of its own would (the engine's row keys); one call a pass otherwise, and for a direct vote
    without `calls` (a wrapper then keys a row by its values, which copies would share)."""
    n = x.shape[0]
    copies = eot_copies(model, draws, x, probe_rows(x[0])) if calls is not None and n else 1
    counts, out = copy_counts(draws, copies), []
    for c, draw in zip(counts, [None] * len(counts) if calls is None else calls.calls_of(model, rows, counts)):
        out.append(logits_of(model, stacked(x, c), draw).view(c, n, -1))
    return out[0] if len(out) == 1 else torch.cat(out)
