"""ALMA ℓ2 (Rony et al., CVPR 2021): a minimum-norm attack by the augmented Lagrangian method.

ALMA minimises ‖δ‖₂ subject to c(x + δ) ≤ 0, c a scale-free margin (the difference of logits
ratio, `dlr_constraint`), by descending the augmented Lagrangian ‖δ‖₂ + P2(c; ρ, μ) with
RMSProp. The multiplier μ of each sample follows the penalty's slope at its constraint (an
exponential moving average, so one noisy step does not swing it) and the penalty parameter ρ
grows where the constraint stopped improving, so samples far from the boundary are pushed
harder while those near it weigh distance more: a per-sample trade-off that C&W finds by a
binary search over c, here found in one run. As DDN and C&W, it returns per sample the
smallest adversarial iterate it saw, the input itself where it saw none.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from advbench.core import hyperparameters as hyper
from advbench.core.errors import AdvbenchError
from advbench.core.norms import L2_NORM
from advbench.core.steps import clip, per_sample, rmsprop_step
from advbench.robustness.attacks.attack_contract import Attack, AttackResult
from advbench.robustness.attacks.minimum_norm import SmallestAdversarial, goal_margin
from advbench.robustness.attacks.oracles import Oracle

SCALE_EPS = 1e-8
"""Added to the DLR's logit scale (the authors'), so logits that are all equal do not divide by 0."""

RMS_EPS = 1e-8
"""RMSProp's ε (torch's and the authors')."""

MU_RANGE = (1e-6, 1e12)
"""Where the authors clamp the multiplier μ, so a constraint far out of line cannot zero or explode it."""


def dlr_constraint(logits: torch.Tensor, y: torch.Tensor, target: torch.Tensor | None,
                   tolerance: float) -> torch.Tensor:
    """(margin + tolerance) / scale per row: ≤ 0 once the goal is met with `tolerance` to spare.

    margin is `goal_margin` (Z_y − max_{j≠y} Z_j; targeted max_{j≠t} Z_j − Z_t) and scale the
    DLR's (Croce & Hein 2020): z_π1 − z_π3 untargeted, z_π1 − (z_π3 + z_π4)/2 targeted (π sorting
    the logits down), so the constraint does not change when the logits are shifted or rescaled.
    The tolerance asks for a margin beyond a tie, which argmax may break either way.
    """
    need = 3 if target is None else 4
    if logits.shape[1] < need:
        raise AdvbenchError(f"ALMA's {'targeted ' if target is not None else ''}constraint (difference of "
                            f"logits ratio) needs >= {need} classes, the model has {logits.shape[1]}")
    top = logits.topk(need, dim=1).values
    scale = top[:, 0] - (top[:, 2] if target is None else (top[:, 2] + top[:, 3]) / 2)
    return (goal_margin(logits, y, target) + tolerance) / (scale + SCALE_EPS)


def p2_slope(c: torch.Tensor, rho: torch.Tensor, mu: torch.Tensor) -> torch.Tensor:
    """dP2/dc of the penalty-Lagrangian P2 (Birgin et al. 2005), the paper's choice.

    P2(c) = μc + μρc² + ρ²c³/6 for c ≥ 0 and μc/(1 − ρc) below, so the slope is
    μ + 2μρc + ρ²c²/2 above 0 and μ/(1 − ρc)² below: steep while the constraint is violated,
    fading once it is met with room to spare.
    """
    return torch.where(c >= 0, mu + 2 * mu * rho * c + 0.5 * rho ** 2 * c ** 2, mu / (1 - rho * c.clamp(max=0)) ** 2)


@dataclass
class _Rows:
    """What ALMA keeps per sample it still optimises; row r is batch row `active[r]`."""

    active: torch.Tensor
    x: torch.Tensor
    y: torch.Tensor
    target: torch.Tensor | None
    x_adv: torch.Tensor
    mu: torch.Tensor
    rho: torch.Tensor
    prev: torch.Tensor          # the constraint at the last check of ρ
    found: torch.Tensor         # an adversarial iterate seen
    step_found: torch.Tensor    # the iteration of the first one (the step size decays from there)
    square_avg: torch.Tensor    # RMSProp's, from ones as the authors' (not torch's zeros)
    buffer: torch.Tensor        # RMSProp's momentum

    def keep(self, rows: torch.Tensor) -> _Rows:
        return _Rows(**{f.name: None if getattr(self, f.name) is None else getattr(self, f.name)[rows]
                        for f in fields(self)})


class ALMA(Attack):
    """ALMA ℓ2 (Rony et al. 2021) with the authors' defaults and update order (adv-lib's `alma`, penalty P2).

    From δ = 0, μ = `mu_init`, ρ = `rho_init`, iteration i (of `steps`) evaluates the
    constraint c = `dlr_constraint` at x + δ and its gradient, judges x + δ and keeps it if it
    is the smallest adversarial example so far, then: every `check_steps` iterations, ρ ← γ·ρ
    for the samples with no adversarial iterate yet whose c did not fall below τ times its value
    at the last check; from i = 1, μ ← α·μ + (1 − α)·P2′(c; ρ, μ), clamped to `MU_RANGE`; then
    one RMSProp step (smoothing and momentum α, square average from ones) on
    ‖δ‖₂ + P2(c; ρ, μ) (P2 alone at i = 0, where ‖δ‖₂ has no gradient), of step size
    `lr_init`, decayed exponentially from each sample's first adversarial iterate to
    `lr_init`·`lr_reduction` at the last step; x + δ is clipped into the oracle's bounds.

    The one departure: the tolerance asks a targeted example for a margin beyond the tie, as an
    untargeted one (the authors' targeted constraint subtracts it). One gradient evaluation an
    iteration, `steps` a sample; a sample adversarial at its input stops after the first.
    Strength (`first_success`) is the number of steps behind the iterate first found within
    eps. Under transfer knowledge it optimises on the substitute, and an iterate is adversarial
    when the target's top-1 label (a counted query) meets the goal; that verdict also drives
    ρ and the step size.
    """

    kind = "minimizing"
    knowledge = ("white", "transfer")
    norms = ("l2",)

    hyperparameters = {"steps": hyper.Whole(1), "lr_init": hyper.Real(0, open_low=True),
                       "lr_reduction": hyper.Real(0, 1, open_low=True), "mu_init": hyper.Real(0, open_low=True),
                       "rho_init": hyper.Real(0, open_low=True), "check_steps": hyper.Whole(1),
                       "tau": hyper.Real(0, 1, open_low=True), "gamma": hyper.Real(1),
                       "alpha": hyper.Real(0, 1, open_high=True), "logit_tolerance": hyper.Real(0)}

    def __init__(self, *, steps: int = 1000, lr_init: float = 0.1, lr_reduction: float = 0.01, mu_init: float = 1.0,
                 rho_init: float = 1.0, check_steps: int = 10, tau: float = 0.95, gamma: float = 1.2,
                 alpha: float = 0.9, logit_tolerance: float = 1e-4) -> None:
        self.set_hyperparameters(locals())

    @property
    def strength_budget(self) -> int:
        """Iterations, one gradient evaluation each: `steps`."""
        return self.steps

    def run(self, oracle: Oracle, x: torch.Tensor, y: torch.Tensor, *, eps: torch.Tensor, norm: str,
            target: torch.Tensor | None, sample_id: torch.Tensor) -> AttackResult:
        best = SmallestAdversarial(x, eps, norm)
        n = x.shape[0]

        def full(value: float) -> torch.Tensor:
            return torch.full((n,), float(value), dtype=x.dtype, device=x.device)

        s = _Rows(torch.arange(n, device=x.device), x, y, target, x.clone(), full(self.mu_init), full(self.rho_init),
                  full(0.0), torch.zeros(n, dtype=torch.bool, device=x.device), full(0.0), torch.ones_like(x),
                  torch.zeros_like(x))
        for i in range(self.steps):
            logits, grad_c = oracle.value_and_grad(
                s.x_adv, lambda z, s=s: dlr_constraint(z, s.y, s.target, self.logit_tolerance), s.active)
            c = dlr_constraint(logits, s.y, s.target, self.logit_tolerance)
            hit = oracle.verdict(s.x_adv, s.y, s.target, s.active, logits)
            best.offer(s.active, s.x_adv, hit, i)
            if i == 0:  # adversarial at the input: nothing smaller to find
                s.prev = c
                s, c, grad_c, hit = s.keep(~hit), c[~hit], grad_c[~hit], hit[~hit]
                if s.active.numel() == 0:
                    break
            self._step(s, i, c, grad_c, hit, oracle.bounds)
        return best.result()

    def _step(self, s: _Rows, i: int, c: torch.Tensor, grad_c: torch.Tensor, hit: torch.Tensor,
              bounds: tuple[float, float]) -> None:
        """Penalty parameter, multiplier, then one RMSProp step of every row of `s`, in the authors' order."""
        if i > 0 and (i + 1) % self.check_steps == 0:
            s.rho = torch.where(s.found | (c < self.tau * s.prev), s.rho, self.gamma * s.rho)
            s.prev = c
        if i > 0:
            s.mu = (self.alpha * s.mu + (1 - self.alpha) * p2_slope(c, s.rho, s.mu)).clamp(*MU_RANGE)
        s.step_found = torch.where(hit & ~s.found, float(i), s.step_found)
        s.found = s.found | hit
        delta = s.x_adv - s.x
        grad = per_sample(p2_slope(c, s.rho, s.mu), grad_c) * grad_c
        grad += delta / per_sample(L2_NORM.size(delta).clamp_min(1e-12), delta)  # d‖δ‖₂/dδ, 0 at δ = 0
        decayed = torch.where(s.found, (i - s.step_found) / (self.steps - s.step_found), torch.zeros_like(s.mu))
        lr = self.lr_init * self.lr_reduction ** decayed
        s.x_adv = clip(s.x_adv - rmsprop_step(grad, s.square_avg, s.buffer, lr, self.alpha, self.alpha, RMS_EPS), bounds)
