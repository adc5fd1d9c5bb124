"""What every attack on a quality metric promises, and the pieces all of them share.

An attack raises a no-reference metric's verdict on images in [0, 1] within a per-image ℓ∞
budget `eps` (shape (N,)), so one call serves a whole sweep of budgets: the rows of a batch
may be one image at several budgets. "Raise" means towards the metric's better end: the
gradient followed is that of the metric's goodness (`quality.metrics.scoring.goodness`), whose sign is
flipped for lower-better metrics such as NIQE.

A score-based attack (`square`) reads scores only, and counts its metric forwards (`queries`).

Each attack returns the attacked images and the metric's raw score after every iteration
(`trace`, (N, T), the last column the score of `x_adv`): the gain-vs-iterations curves of
`advbench plot` come from one run, as the strength curves of the robustness half do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from advbench.core.errors import AdvbenchError, first_line
from advbench.core.hyperparameters import DeclaresHyperparameters
from advbench.quality.metrics.metric_contract import QualityMetric
from advbench.quality.metrics.scoring import goodness

BOUNDS = (0.0, 1.0)


@dataclass
class Attacked:
    """One batch after an attack: images, the raw score after each iteration, gradient evaluations per image,
    and, for a score-based attack, the metric forwards it counted per image (`queries`, (N,))."""

    x_adv: torch.Tensor
    trace: torch.Tensor
    grad_evals: int
    queries: torch.Tensor | None = None


class MetricAttack(DeclaresHyperparameters):
    """Base of the attacks on metrics: hyperparameters keyword-only in `__init__`, `run` per batch.

    `hyperparameters` declares each constructor argument's valid values (`core.hyperparameters`,
    as the robustness half's attacks do); the constructor hands its arguments to
    `set_hyperparameters`, the one check, so a bad one reads "IFGSM: steps must be ...".
    `prepare` runs once per cell before any batch (the universal perturbations train there)
    and returns what it adds to the cell's identity.
    """

    name: ClassVar[str] = ""
    needs_gradient: ClassVar[bool] = True
    """False for a score-based attack: the metric needs only a forward pass."""

    def prepare(self, metric: QualityMetric, context: PrepareContext) -> dict[str, Any]:
        return {}

    def run(self, metric: QualityMetric, x: torch.Tensor, eps: torch.Tensor) -> Attacked:  # pragma: no cover
        raise NotImplementedError

    @property
    def iterations(self) -> int:
        """Iterations per image (the trace's width)."""
        return int(getattr(self, "steps", 1))


@dataclass(frozen=True)
class PrepareContext:
    """What a cell hands `MetricAttack.prepare`: where to keep trained perturbations, the seed, the device."""

    cache: Any
    seed: int
    device: torch.device
    progress: bool


def score_and_grad(metric: QualityMetric, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The metric's raw scores at x and the gradient of its goodness (the direction of "better"), both finite
    (`check_finite_step`)."""
    x = x.detach().requires_grad_(True)
    scores = metric(x)
    (grad,) = torch.autograd.grad(goodness(metric, scores).sum(), x)
    return check_finite_step(scores.detach(), grad)


class NonFinite(AdvbenchError):
    """Scores or an input gradient that stopped being numbers during an attack; `rows`: which rows of the
    batch, `value`: the first such number. The cell names the rows' images and budgets (`iqa.guard`)."""

    def __init__(self, rows: list[int], value: float) -> None:
        super().__init__(f"a score or input gradient of {value} during the attack, in rows {rows} of the batch")
        self.rows, self.value = rows, value


def check_finite_step(scores: torch.Tensor, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`(scores, grad)` as they are when every row's are finite, else `NonFinite`: a NaN gradient would
    otherwise step nowhere (or anywhere) and the attack's record would call the metric robust."""
    finite = torch.isfinite(scores) & torch.isfinite(grad).flatten(1).all(dim=1)
    if not bool(finite.all()):
        rows = (~finite).nonzero()[:, 0].tolist()
        both = torch.cat([scores[rows[0]].reshape(1), grad[rows[0]].flatten()])
        raise NonFinite(rows, both[~torch.isfinite(both)][0].item())
    return scores, grad


@torch.no_grad()
def final_scores(metric: QualityMetric, x_adv: torch.Tensor) -> torch.Tensor:
    """(N, 1) raw scores of the attacked images: the last column of every trace."""
    return metric(x_adv).unsqueeze(1)


SCORES_ONLY = 'the score-based attack=square (attack="square" in Python) needs only scores'
"""The way out a gradient-attack refusal names: the score-based attack."""


def check_attackable(metric: QualityMetric, name: str, x: torch.Tensor, needs_gradient: bool = True) -> None:
    """One forward (and backward) on real images before any attack: one finite score per image, with
    a usable input gradient where the attack needs one (a score-based attack climbs scores alone, so
    a non-differentiable metric will do), else one line saying which (not a traceback mid-cell)."""
    if needs_gradient and not metric.differentiable:
        raise AdvbenchError(f"metric '{name}' has no input gradient (not differentiable); gradient attacks need "
                            f"one ({SCORES_ONLY})")
    x = x.detach().requires_grad_(needs_gradient)
    scores = checked_scores(metric, name, x)
    if not needs_gradient:
        return
    grad = torch.autograd.grad(goodness(metric, scores).sum(), x, allow_unused=True)[0] if scores.requires_grad \
        else None
    if grad is None:
        raise AdvbenchError(f"metric '{name}' is not differentiable w.r.t. its input images (its scores carry no "
                            "gradient: a .detach(), .item(), numpy or no_grad in its forward?); gradient attacks "
                            f"need one ({SCORES_ONLY})")
    check_gradient(metric, name, grad)


def checked_scores(metric: QualityMetric, name: str, x: torch.Tensor) -> torch.Tensor:
    """The metric's scores of real images `x`, checked: it runs on them and gives one finite score per
    image, shape (N,), else one line saying which (the contract of attacked metrics and judges alike)."""
    shape = "x".join(str(int(s)) for s in x.shape[1:])
    try:
        scores = metric(x)
    except AdvbenchError:
        raise
    except Exception as exc:  # the metric's own failure on this input: its message is the diagnosis
        raise AdvbenchError(f"metric '{name}' fails on {len(x)} images of {shape}: {type(exc).__name__}: "
                            f"{first_line(exc)}") from None
    got = tuple(scores.shape) if isinstance(scores, torch.Tensor) else type(scores).__name__
    if got != (len(x),):
        raise AdvbenchError(f"metric '{name}' must return one score per image, shape ({len(x)},); on {len(x)} "
                            f"images of {shape} it returned {got}")
    if not torch.isfinite(scores).all():
        raise AdvbenchError(f"metric '{name}' returned non-finite scores on real images: {scores.detach().tolist()}")
    return scores


def check_gradient(metric: QualityMetric, name: str, grad: torch.Tensor) -> None:
    """A metric whose input gradient is absent, non-finite or zero on a whole batch cannot be attacked
    by gradients: say so in one line instead of reporting a gain of zero as robustness."""
    if not torch.isfinite(grad).all():
        raise AdvbenchError(f"metric '{name}' gives a non-finite input gradient; gradient attacks cannot use it "
                            f"({SCORES_ONLY})")
    if not grad.abs().amax() > 0:
        raise AdvbenchError(f"metric '{name}' gives a zero input gradient on every image of a batch (no backward "
                            f"through its scoring); gradient attacks cannot use it ({SCORES_ONLY})")


def check_budgets(eps: Any, key: str = "eps") -> list[float]:
    """Budgets as a non-empty list of distinct numbers in (0, 1] (ℓ∞ on images in [0, 1])."""
    values = list(eps) if isinstance(eps, (list, tuple)) or hasattr(eps, "__iter__") and not isinstance(eps, str) \
        else [eps]
    if not values:
        raise AdvbenchError(f"{key} must list at least one budget, e.g. {key}=[0.004,0.008]")
    out = []
    for v in values:
        number = float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else float("nan")
        if not 0 < number <= 1:
            raise AdvbenchError(f"{key} holds {v!r}: every budget must be a number in (0, 1] (ℓ∞ on images in [0, 1])")
        out.append(number)
    if len(set(out)) != len(out):
        raise AdvbenchError(f"{key} repeats a budget: {out}")
    return out

