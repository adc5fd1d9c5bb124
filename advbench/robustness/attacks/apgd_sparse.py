"""APGD in a norm whose steepest ascent is sparse (ℓ1; Croce & Hein, ICML 2021, arXiv 2103.01208).

The ℓ1 steepest ascent moves one coordinate, so a step along it barely moves; the paper's
step moves the k coordinates of largest |gradient| by η/k each, with the gradient's sign,
and projects exactly onto the ε-ball intersected with the box (`L1.project`), so no budget
is left on saturated pixels. As the original (`autopgd_base.py`, norm='L1') does, per sample:

- η starts at ε (the original's α = 1 for ℓ1), the share of coordinates k/d at 0.2; after a
  given start (the ε schedule below) at ‖start − x‖₀ / (1.5·d). No momentum.
- Every max(⌊0.04·N⌋, 1) iterations, with s = ‖x_best − x‖₀ of the best point so far: where s
  fell below 0.95 of its value at the last checkpoint, η goes back to ε and the run restarts
  from x_best with its gradient; elsewhere η shrinks by 1.5, never below ε/10. k/d becomes
  s/(1.5·d) for every sample.

`large_eps` (AutoAttack's ℓ1 setting, the original's `use_largereps`): the N iterations are
split into ⌈0.3·N⌉ at 3ε, ⌈0.3·N⌉ at 2ε and the rest at ε. The first stage starts from the
Gaussian start projected into the 3ε-ball, each later one from the best point of the stage
before, projected into its own ball. Only the last stage is inside the budget, so only its
iterates (its start included) can succeed, and `first_success` counts the earlier stages'
iterations before them. Every iteration but the last of a stage takes one gradient, so a run
takes N gradient evaluations, as APGD's other runs do.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from fractions import Fraction

import torch

from advbench.core.errors import AdvbenchError
from advbench.core.norms import Norm, per_sample
from advbench.robustness.attacks.oracles import WhiteBoxOracle

Objective = Callable[[torch.Tensor, torch.Tensor | None], Callable[[torch.Tensor], torch.Tensor]]
"""(labels, loss target) -> the per-sample loss of the logits, to be ascended."""

_FIRST_SHARE = 0.2        # k/d at a fresh start
_SPARSER = 0.95           # s below this share of its last value: back to η = ε from x_best
_K_SLACK = 1.5            # k = s / 1.5
_STEP_SHRINK = 1.5        # η /= 1.5 elsewhere
_MIN_STEP = 10.0          # η >= ε / 10
_STAGE_SHARE = Fraction(3, 10)


def stages(n_iter: int, large_eps: bool) -> list[tuple[int, int]]:
    """The run's (ε factor, iterations) stages: one at ε, or the original's 3ε, 2ε, ε schedule."""
    if not large_eps:
        return [(1, n_iter)]
    early = math.ceil(_STAGE_SHARE * n_iter)
    if n_iter - 2 * early < 1:
        raise AdvbenchError(f"APGD large_eps splits n_iter into 30%/30%/40% stages; n_iter={n_iter} leaves "
                            "the last stage no iteration (n_iter=3 or >= 5)")
    return [(3, early), (2, early), (1, n_iter - 2 * early)]


def checkpoint_every(steps: int) -> int:
    """Iterations between two of the sparsity schedule's checkpoints in a stage of `steps`."""
    return max(int(0.04 * steps), 1)


def settle(oracle: WhiteBoxOracle, rows: torch.Tensor, first: torch.Tensor, out: torch.Tensor, cur: torch.Tensor,
           best: torch.Tensor, hit: torch.Tensor, k: int, last: bool) -> torch.Tensor | None:
    """Date and write out the rows of `rows` that met the goal at iteration k (`first`, `out` in
    place); the rows (indices into `rows`) that go on, None after the last iteration, which
    returns the best point where no iterate met the goal."""
    if last:
        first[rows] = torch.where(hit & (first[rows] < 0), k, first[rows])
        out[rows] = torch.where(per_sample(hit, cur), cur, best)
        return None
    if not oracle.stops_on_hit:  # dated, and run to the end
        first[rows] = torch.where(hit & (first[rows] < 0), k, first[rows])
        hit = torch.zeros_like(hit)
    # The iteration's one host-device synchronisation: which rows go on.
    keep = (~hit).nonzero().squeeze(1)
    if keep.numel() < rows.numel():
        first[rows] = torch.where(hit, k, first[rows])
        out[rows] = torch.where(per_sample(hit, cur), cur, out[rows])
    return keep


@dataclass
class SparseRun:
    """One APGD run in `ball` (a norm with `sparse_steps`) on a batch; `run` walks its stages."""

    oracle: WhiteBoxOracle
    objective: Objective
    ball: Norm
    n_iter: int
    large_eps: bool

    def run(self, x: torch.Tensor, y: torch.Tensor, loss_target: torch.Tensor | None,
            goal_target: torch.Tensor | None, eps: torch.Tensor, idx: torch.Tensor, start: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per row, the first adversarial iteration (-1: none) and the point returned; `start` lies in the
        first stage's ball (`start_factor`)."""
        plan = stages(self.n_iter, self.large_eps)
        offset = 0
        for (factor, steps), (following, _) in zip(plan, plan[1:]):
            rows = _Rows.fresh(x, y, loss_target, goal_target, factor * eps, idx, start, given=True)
            start = self.ball.project(self._unjudged(rows, start, steps), x, following * eps, self.oracle.bounds)
            offset += steps
        rows = _Rows.fresh(x, y, loss_target, goal_target, eps, idx, start, given=self.large_eps)
        return self._judged(rows, start, plan[-1][1], offset)

    def start_factor(self) -> int:
        """The ε factor of the first stage's ball, where the run's start is drawn."""
        return stages(self.n_iter, self.large_eps)[0][0]

    def _evaluate(self, rows: _Rows, cur: torch.Tensor, with_grad: bool
                  ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        objective = self.objective(rows.labels, rows.loss_target)
        if with_grad:
            logits, grad = self.oracle.value_and_grad(cur, objective, rows.oracle_rows)
        else:
            logits, grad = self.oracle.logits(cur, rows.oracle_rows), None
        with torch.no_grad():
            return logits, grad, objective(logits)

    def _unjudged(self, rows: _Rows, cur: torch.Tensor, steps: int) -> torch.Tensor:
        """A stage outside the budget: every row runs all `steps`; its best point (highest loss)."""
        every = checkpoint_every(steps)
        for k in range(steps + 1):
            _, grad, loss = self._evaluate(rows, cur, k < steps)
            rows.track(cur, grad, loss)
            if k == steps:
                break
            cur = rows.step(rows.checkpoint(cur) if k and k % every == 0 else cur, self.ball, self.oracle.bounds)
        return rows.best

    def _judged(self, rows: _Rows, cur: torch.Tensor, steps: int, offset: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The stage inside the budget: rows leave at their first adversarial iterate."""
        first = torch.full((cur.shape[0],), -1, dtype=torch.long, device=cur.device)
        out = cur.clone()
        every = checkpoint_every(steps)
        for k in range(steps + 1):
            logits, grad, loss = self._evaluate(rows, cur, k < steps)
            rows.track(cur, grad, loss)
            hit = self.oracle.verdict(cur, rows.labels, rows.goal_target, rows.oracle_rows, logits,
                                      undated=first[rows.rows] < 0)
            keep = settle(self.oracle, rows.rows, first, out, cur, rows.best, hit, offset + k, k == steps)
            if keep is None:
                break
            if keep.numel() < rows.rows.numel():
                rows, cur = rows.keep(keep), cur[keep]
                if rows.rows.numel() == 0:
                    break
            cur = rows.step(rows.checkpoint(cur) if k and k % every == 0 else cur, self.ball, self.oracle.bounds)
        return first, out


@dataclass
class ApgdRows:
    """The per-row state both APGD runs (ℓ∞/ℓ2 and ℓ1) keep for the rows still running: `rows` index the
    run's inputs, `oracle_rows` are the same rows as the oracle counts them; the best point and loss so
    far with its gradient, and the gradient to step along."""

    rows: torch.Tensor
    origin: torch.Tensor
    labels: torch.Tensor
    loss_target: torch.Tensor | None
    goal_target: torch.Tensor | None
    eps: torch.Tensor
    oracle_rows: torch.Tensor
    best: torch.Tensor | None = None
    loss_best: torch.Tensor | None = None
    grad: torch.Tensor | None = None
    best_grad: torch.Tensor | None = None

    def keep_best(self, cur: torch.Tensor, grad: torch.Tensor | None, loss: torch.Tensor) -> None:
        """Keep the best point (strictly higher loss) and its gradient; `grad` (None after the last step) to step along."""
        better = loss > self.loss_best
        self.best = torch.where(per_sample(better, cur), cur, self.best)
        self.loss_best = torch.where(better, loss, self.loss_best)
        if grad is not None:
            self.grad = grad
            self.best_grad = torch.where(per_sample(better, grad), grad, self.best_grad)

    def keep(self, keep: torch.Tensor) -> ApgdRows:
        """The state of rows `keep` only (tensors indexed, not copied beyond that)."""
        return replace(self, **{f.name: None if (v := getattr(self, f.name)) is None else v[keep]
                                for f in fields(self)})


@dataclass
class _Rows(ApgdRows):
    """The ℓ1 stage's state: its step size `eta`, share of coordinates `share` and sparsity at the last
    checkpoint (all set by `fresh`)."""

    eta: torch.Tensor | None = None
    share: torch.Tensor | None = None
    sparsity: torch.Tensor | None = None

    @classmethod
    def fresh(cls, x: torch.Tensor, y: torch.Tensor, loss_target: torch.Tensor | None,
              goal_target: torch.Tensor | None, eps: torch.Tensor, idx: torch.Tensor, start: torch.Tensor,
              given: bool) -> _Rows:
        """A stage's state before its first evaluation; `given`: the sparsity schedule starts from the
        start's own sparsity (the original's x_init), else from k/d = 0.2."""
        d = x[0].numel()
        if given:
            sparsity = (start != x).flatten(1).sum(dim=1)
            share = sparsity / d / _K_SLACK
        else:
            share = torch.full((x.shape[0],), _FIRST_SHARE, device=x.device)
            sparsity = torch.full((x.shape[0],), d, dtype=torch.long, device=x.device)
        return cls(torch.arange(x.shape[0], device=x.device), x, y, loss_target, goal_target, eps, idx,
                   eta=eps.clone(), share=share, sparsity=sparsity)

    def track(self, cur: torch.Tensor, grad: torch.Tensor | None, loss: torch.Tensor) -> None:
        """Keep the best point (strictly higher loss) with its gradient; the gradient to step along."""
        if self.best is None:
            self.best, self.loss_best, self.grad, self.best_grad = cur.clone(), loss.clone(), grad, grad
            return
        self.keep_best(cur, grad, loss)

    def checkpoint(self, cur: torch.Tensor) -> torch.Tensor:
        """The sparsity schedule's checkpoint: new k, η, and x_best where the best point got sparser."""
        sparsity = (self.best != self.origin).flatten(1).sum(dim=1)
        sparser = sparsity / self.sparsity < _SPARSER
        self.share = sparsity / self.origin[0].numel() / _K_SLACK
        self.eta = torch.where(sparser, self.eps, self.eta / _STEP_SHRINK)
        self.eta = torch.minimum(torch.maximum(self.eta, self.eps / _MIN_STEP), self.eps)
        self.sparsity = sparsity
        self.grad = torch.where(per_sample(sparser, self.grad), self.best_grad, self.grad)
        return torch.where(per_sample(sparser, cur), self.best, cur)

    def step(self, cur: torch.Tensor, ball: Norm, bounds: tuple[float, float]) -> torch.Tensor:
        """η along the k largest gradient coordinates, projected onto the ε-ball within the box."""
        stepped = cur + per_sample(self.eta, cur) * ball.sparse_direction(self.grad, self.share)
        return ball.project(stepped, self.origin, self.eps, bounds)

