"""Gradient attacks with a budget: FGSM, BIM, PGD, MIM, all one projected-ascent loop.

The loop keeps per-sample state in tensors and drops samples from the active set as soon as
they meet the goal, returning the first adversarial iterate. That makes `first_success` the
strength at which each sample broke (the accuracy-vs-iterations curve needs no reruns), and
makes high-ε probes of the minimum-ε search cheap.
"""

from __future__ import annotations

import math

import torch

from advbench.core.steps import accumulate_momentum, ascend, unit_direction
from advbench.robustness.attacks.base import Attack, AttackResult
from advbench.robustness.attacks.oracles import TransferOracle, WhiteBoxOracle
from advbench.robustness.attacks.steps import random_start


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

    def __init__(self, *, steps: int = 20, rel_stepsize: float = 0.15, random_init: bool = False,
                 decay: float | None = None, seed: int = 0) -> None:
        # NaN passes every `<=` test and would only surface after the attack ran (NaN iterates).
        if steps < 1:
            raise ValueError(f"expected steps >= 1, got {steps}")
        if not (math.isfinite(rel_stepsize) and rel_stepsize > 0):
            raise ValueError(f"expected rel_stepsize a finite number > 0, got {rel_stepsize}")
        if decay is not None and not (math.isfinite(decay) and decay >= 0):
            raise ValueError(f"expected decay a finite number >= 0, got {decay}")
        self.steps = steps
        self.rel_stepsize = rel_stepsize
        self.random_init = random_init
        self.decay = decay
        self.seed = seed

    def run(self, oracle: WhiteBoxOracle, x: torch.Tensor, y: torch.Tensor, *, eps: torch.Tensor,
            norm: str, target: torch.Tensor | None, sample_id: torch.Tensor) -> AttackResult:
        targeted = target is not None
        labels = target if targeted else y
        n = x.shape[0]
        if self.random_init:
            x_adv = random_start(x, eps, norm, oracle.bounds, seed=self.seed, sample_id=sample_id)
        else:
            x_adv = x.clone()
        alpha = self.rel_stepsize * eps
        momentum = torch.zeros_like(x) if self.decay is not None else None
        first = torch.full((n,), -1, dtype=torch.long, device=x.device)
        active = torch.arange(n, device=x.device)

        for t in range(self.steps + 1):
            xa, xo, la = x_adv[active], x[active], labels[active]
            logits = grad = None
            if t < self.steps and not isinstance(oracle, TransferOracle):  # one pass: verdict and step
                logits, grad = self._gradient(oracle, xa, la, targeted, active, sample_id[active], t)
            if self.early_stop or t == self.steps:
                hit = oracle.verdict(xa, y[active], target[active] if targeted else None, active, logits,
                                     undated=first[active] < 0)
            else:
                hit = torch.zeros_like(active, dtype=torch.bool)
            first[active] = torch.where(hit & (first[active] < 0), t, first[active])
            if t == self.steps:
                break
            if self.early_stop and oracle.stops_on_hit:
                # The iteration's one host-device synchronisation: the size of the new active set.
                keep = (~hit).nonzero().squeeze(1)
                active, xa, xo = active[keep], xa[keep], xo[keep]
                grad = None if grad is None else grad[keep]
                if active.numel() == 0:
                    break
            if grad is None:
                _, grad = self._gradient(oracle, xa, labels[active], targeted, active, sample_id[active], t)
            direction = self._direction(grad, active, momentum, norm)
            x_adv[active] = ascend(xa, xo, direction, alpha[active], eps[active], norm, oracle.bounds)

        return AttackResult(x_adv=x_adv, success=first >= 0, first_success=first)

    def _gradient(self, oracle: WhiteBoxOracle, x: torch.Tensor, labels: torch.Tensor, targeted: bool,
                  idx: torch.Tensor, sample_id: torch.Tensor, t: int) -> tuple[torch.Tensor | None, torch.Tensor]:
        """Logits at x (None when the model saw another input) and the gradient to ascend at step t."""
        return oracle.loss_grad(x, labels, targeted, idx)

    def _direction(self, grad: torch.Tensor, active: torch.Tensor, momentum: torch.Tensor | None,
                   norm: str) -> torch.Tensor:
        if momentum is None:
            return unit_direction(grad, norm)
        g = accumulate_momentum(momentum[active], grad, self.decay)
        momentum[active] = g
        return unit_direction(g, norm)


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
