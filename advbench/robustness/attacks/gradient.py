"""Gradient attacks with a budget: FGSM, BIM, PGD, MIM, all one projected-ascent loop.

The loop keeps per-sample state in tensors and drops samples from the active set as soon as
they meet the goal, returning the first adversarial iterate. That makes `first_success` the
strength at which each sample broke (the accuracy-vs-iterations curve needs no reruns), and
makes high-ε probes of the minimum-ε search cheap.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from advbench.core.steps import accumulate_momentum, ascend, unit_direction
from advbench.robustness.attacks import hyper
from advbench.robustness.attacks.base import Attack, AttackResult
from advbench.robustness.attacks.oracles import TransferOracle, WhiteBoxOracle
from advbench.robustness.attacks.starts import random_start


class IterativeGradientAttack(Attack):
    """x_{t+1} = clip(Π_ε(x_t + α·dir(g_t))) with α = rel_stepsize·ε.

    `decay` turns on MIM's momentum on ℓ1-normalised gradients; `random_init` is PGD's start.
    Under a transfer oracle the gradient is the substitute's and success is the target's top-1
    label, checked before each step (one counted query per active sample): a sample stops at
    the first iterate that fools the target, so the strength (iterations on the substitute)
    curve still comes from one run. `early_stop = False` checks only the last iterate. A
    sample stops on the oracle's `verdict`; on a randomized model it is dated but runs on
    (`Oracle.stops_on_hit`).
    Subclasses hook in through `_gradient` (where the gradient is taken) and `_direction`.
    """

    knowledge = ("white", "transfer")
    early_stop = True
    pooled_calls = True  # every gradient is `oracle.loss_grad`'s (DIM's and TI's too)

    hyperparameters = {"steps": hyper.Whole(1), "rel_stepsize": hyper.Real(0, open_low=True),
                       "random_init": hyper.Flag(), "decay": hyper.Real(0, optional=True),
                       "seed": hyper.Whole(None)}

    def __init__(self, *, steps: int = 20, rel_stepsize: float = 0.15, random_init: bool = False,
                 decay: float | None = None, seed: int = 0) -> None:
        self.set_hyperparameters(locals())

    @property
    def strength_budget(self) -> int:
        """Iterations: `steps`."""
        return self.steps

    def run(self, oracle: WhiteBoxOracle, x: torch.Tensor, y: torch.Tensor, *, eps: torch.Tensor,
            norm: str, target: torch.Tensor | None, sample_id: torch.Tensor) -> AttackResult:
        targeted = target is not None
        if self.random_init:
            x_adv = random_start(x, eps, norm, oracle.bounds, seed=self.seed, sample_id=sample_id)
        else:
            x_adv = x.clone()
        first = torch.full((x.shape[0],), -1, dtype=torch.long, device=x.device)
        a = _Active.of(x_adv, first, x, y, target, sample_id, self.rel_stepsize * eps, eps, self.decay is not None)

        for t in range(self.steps + 1):
            logits = grad = None
            if t < self.steps and not isinstance(oracle, TransferOracle):  # one pass: verdict and step
                logits, grad = self._gradient(oracle, a.x_adv, a.labels, targeted, a.rows, a.sample_id, t)
            if self.early_stop or t == self.steps:
                undated = a.first < 0
                hit = oracle.verdict(a.x_adv, a.y, a.target, a.rows, logits, undated=undated)
                a.first.masked_fill_(hit & undated, t)
            if t == self.steps:
                break
            if self.early_stop and oracle.stops_on_hit:
                # The iteration's one host-device synchronisation: the size of the new active set.
                keep = (~hit).nonzero().squeeze(1)
                if keep.numel() < a.rows.numel():
                    a.write(x_adv, first)
                    a, grad = a.take(keep), None if grad is None else grad[keep]
                    if a.rows.numel() == 0:
                        break
            if grad is None:
                _, grad = self._gradient(oracle, a.x_adv, a.labels, targeted, a.rows, a.sample_id, t)
            direction, a.momentum = self._direction(grad, a.momentum, norm)
            a.x_adv = ascend(a.x_adv, a.x, direction, a.alpha, a.eps, norm, oracle.bounds)
        a.write(x_adv, first)
        return AttackResult(x_adv=x_adv, success=first >= 0, first_success=first)

    def _gradient(self, oracle: WhiteBoxOracle, x: torch.Tensor, labels: torch.Tensor, targeted: bool,
                  idx: torch.Tensor, sample_id: torch.Tensor, t: int) -> tuple[torch.Tensor | None, torch.Tensor]:
        """Logits at x (None when the model saw another input) and the gradient to ascend at step t."""
        return oracle.loss_grad(x, labels, targeted, idx)

    def _direction(self, grad: torch.Tensor, momentum: torch.Tensor | None,
                   norm: str) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The step's unit direction and the active samples' momentum after it (None without)."""
        if momentum is None:
            return unit_direction(grad, norm), None
        momentum = accumulate_momentum(momentum, grad, self.decay)
        return unit_direction(momentum, norm), momentum


@dataclass
class _Active:
    """The samples an attack still steps, one row each: their batch rows and per-sample state.

    Gathered again only on the iterations where some sample leaves (most iterations of a large
    batch lose none), where indexing every batch-sized tensor by the active rows on every
    iteration cost a dozen gathers and two scatters a step. `write` puts the iterates and first
    successes back into the batch's tensors.
    """

    rows: torch.Tensor
    x_adv: torch.Tensor
    x: torch.Tensor
    y: torch.Tensor
    target: torch.Tensor | None
    sample_id: torch.Tensor
    alpha: torch.Tensor
    eps: torch.Tensor
    first: torch.Tensor
    momentum: torch.Tensor | None

    @classmethod
    def of(cls, x_adv: torch.Tensor, first: torch.Tensor, x: torch.Tensor, y: torch.Tensor,
           target: torch.Tensor | None, sample_id: torch.Tensor, alpha: torch.Tensor, eps: torch.Tensor,
           momentum: bool) -> _Active:
        """The whole batch, its iterates and first successes copies of `x_adv` and `first` (which `write` fills)."""
        return cls(rows=torch.arange(x.shape[0], device=x.device), x_adv=x_adv.clone(), x=x, y=y, target=target,
                   sample_id=sample_id, alpha=alpha, eps=eps, first=first.clone(),
                   momentum=torch.zeros_like(x) if momentum else None)

    @property
    def labels(self) -> torch.Tensor:
        """What the loss is taken against: the target, or the true label when untargeted."""
        return self.y if self.target is None else self.target

    def take(self, keep: torch.Tensor) -> _Active:
        """Rows `keep` of this set."""
        state = {f.name: getattr(self, f.name) for f in fields(self)}
        return _Active(**{k: None if v is None else v[keep] for k, v in state.items()})

    def write(self, x_adv: torch.Tensor, first: torch.Tensor) -> None:
        x_adv[self.rows] = self.x_adv
        first[self.rows] = self.first


class FGSM(IterativeGradientAttack):
    """One step of size ε (Goodfellow et al.); the ℓ2 version steps along g/‖g‖₂."""

    def __init__(self, *, seed: int = 0) -> None:
        super().__init__(steps=1, rel_stepsize=1.0, seed=seed)


class BIM(IterativeGradientAttack):
    """Basic iterative method; the seed's defaults: α = 0.15·ε, 20 iterations."""

    def __init__(self, *, steps: int = 20, rel_stepsize: float = 0.15, seed: int = 0) -> None:
        super().__init__(steps=steps, rel_stepsize=rel_stepsize, seed=seed)


class PGD(IterativeGradientAttack):
    """BIM from a uniform random start in the ε-ball (Madry et al.), drawn per sample from (seed, sample_id)."""

    def __init__(self, *, steps: int = 20, rel_stepsize: float = 0.125, seed: int = 0) -> None:
        super().__init__(steps=steps, rel_stepsize=rel_stepsize, random_init=True, seed=seed)


class MIM(IterativeGradientAttack):
    """Momentum iterative method: g ← μ·g + ∇/‖∇‖₁, step along sign(g) (or g/‖g‖₂)."""

    def __init__(self, *, steps: int = 20, rel_stepsize: float = 0.15, decay: float = 1.0, seed: int = 0) -> None:
        super().__init__(steps=steps, rel_stepsize=rel_stepsize, decay=decay, seed=seed)
