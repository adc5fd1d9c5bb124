"""APGD (Croce & Hein, ICML 2020): projected gradient ascent that sets its own step size.

One run of N iterations starts from a random point on the ε-sphere with step size η = 2ε
and momentum 0.75, and keeps the best point found (highest loss, x_max). At the checkpoints
w_j = ⌈p_j·N⌉, p_0 = 0, p_1 = 0.22, p_{j+1} = p_j + max(p_j − p_{j−1} − 0.03, 0.06), a
sample halves η and restarts from x_max when

1. its loss rose on fewer than ρ·(w_j − w_{j−1}) of the steps since the last checkpoint, or
2. neither η nor the best loss changed since the last checkpoint.

This follows the paper where the authors' code differs: condition 1 is a strict '<', the
first step of the first interval is compared with the loss at the start (the code compares
it with an unset entry), and condition 2 is checked at the first checkpoint too.

Everything is per sample: η, x_max, the counters and ε, so samples never interact and a
sample's trajectory does not depend on its batch. A sample leaves the active set at its
first adversarial iterate (its `first_success`). Restarts and, for APGD-T, target classes
run one after another on the samples still robust; `first_success` counts iterations over
all runs (run r, iteration t: r·N + t), so it is the work spent on the sample until it broke.
Because the checkpoints scale with N, a run with fewer iterations is not a prefix of a longer
one: the accuracy-vs-iterations curve of APGD needs one run per strength.

In a norm whose steepest ascent is sparse (ℓ1) a run is APGD-ℓ1 instead (Croce & Hein, ICML
2021): top-k steps with the paper's sparsity schedule, no momentum (`apgd_sparse`).

Under transfer knowledge every gradient, loss and best point is the substitute's and every
iterate is judged by the target's top-1 label (one counted query), so a sample leaves at the
first iterate that fools the target: APGD crafted on the substitute, in any norm it takes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from fractions import Fraction

import torch
import torch.nn.functional as F

from advbench.core import hyperparameters as hyper
from advbench.core.errors import AdvbenchError
from advbench.core.norms import norm as norm_of
from advbench.core.steps import ascend, per_sample, unit_direction
from advbench.robustness.attacks.apgd_sparse import ApgdRows, SparseRun, settle, stages
from advbench.robustness.attacks.attack_contract import Attack, AttackResult, Cost
from advbench.robustness.attacks.oracles import WhiteBoxOracle
from advbench.robustness.attacks.starts import boundary_start

_DLR_DENOM = 1e-12
LossFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]


def ce_loss(logits: torch.Tensor, y: torch.Tensor, target: torch.Tensor | None) -> torch.Tensor:
    """CE(z, y) untargeted; −CE(z, t) towards a target (per sample, to be ascended)."""
    if target is None:
        return F.cross_entropy(logits, y, reduction="none")
    return -F.cross_entropy(logits, target, reduction="none")


def dlr_loss(logits: torch.Tensor, y: torch.Tensor, target: torch.Tensor | None) -> torch.Tensor:
    """Difference of logits ratio, invariant to shifting and rescaling the logits.

    Untargeted: −(z_y − max_{i≠y} z_i) / (z_π1 − z_π3). Targeted (APGD-T):
    −(z_y − z_t) / (z_π1 − (z_π3 + z_π4)/2), with π sorting the logits in decreasing order.
    """
    top = logits.sort(dim=1, descending=True).values
    z_y = logits.gather(1, y[:, None]).squeeze(1)
    if target is None:
        others = logits.masked_fill(F.one_hot(y, logits.shape[1]).bool(), -math.inf).amax(dim=1)
        return -(z_y - others) / (top[:, 0] - top[:, 2] + _DLR_DENOM)
    z_t = logits.gather(1, target[:, None]).squeeze(1)
    return -(z_y - z_t) / (top[:, 0] - 0.5 * (top[:, 2] + top[:, 3]) + _DLR_DENOM)


LOSSES: dict[str, LossFn] = {"ce": ce_loss, "dlr": dlr_loss}
# Classes the DLR denominators need: z_π3 untargeted, z_π4 targeted.
_DLR_MIN_CLASSES = {False: 3, True: 4}


def checkpoints(steps: int) -> list[int]:
    """The paper's checkpoints w_j = ⌈p_j·N⌉ for p_j ≤ 1, in exact arithmetic (no float ⌈⌉ slips)."""
    p_prev, p = Fraction(0), Fraction(22, 100)
    marks = [p_prev]
    while p <= 1:
        marks.append(p)
        p_prev, p = p, p + max(p - p_prev - Fraction(3, 100), Fraction(6, 100))
    return sorted({math.ceil(q * steps) for q in marks})


def halve_step(increases: torch.Tensor, interval: int, rho: float, loss_max: torch.Tensor,
               loss_max_last: torch.Tensor, halved_last: torch.Tensor) -> torch.Tensor:
    """Which samples halve η at a checkpoint: condition 1 or condition 2 of the paper."""
    too_few_increases = increases < rho * interval
    stalled = ~halved_last & (loss_max <= loss_max_last)
    return too_few_increases | stalled


class APGD(Attack):
    """APGD-CE / APGD-DLR; APGD-T when `n_target_classes` > 0 under an untargeted goal.

    Under a targeted goal the loss moves towards the given target (targeted DLR or −CE).
    APGD-T instead runs the targeted loss once per target class, the 2nd … (k+1)-th most
    likely clean classes, each on the samples still robust; success stays untargeted.
    """

    knowledge = ("white", "transfer")
    norms = ("linf", "l2", "l1")
    hyperparameters = {"n_iter": hyper.Whole(1), "loss": hyper.Choice(tuple(LOSSES)), "n_restarts": hyper.Whole(1),
                       "n_target_classes": hyper.Whole(0), "rho": hyper.Real(0, 1, open_low=True),
                       "momentum": hyper.Real(0, 1, open_low=True), "seed": hyper.Whole(None),
                       "large_eps": hyper.Flag()}

    def __init__(self, *, n_iter: int = 100, loss: str = "ce", n_restarts: int = 1, n_target_classes: int = 0,
                 rho: float = 0.75, momentum: float = 0.75, seed: int = 0, large_eps: bool = False) -> None:
        self.set_hyperparameters(locals())
        stages(n_iter, large_eps)  # refuses an n_iter the ε schedule cannot split

    def params(self) -> dict[str, object]:
        """The hyperparameters; `large_eps` only where set, so the records of runs without it keep their keys."""
        return {k: v for k, v in super().params().items() if k != "large_eps" or v}

    def unsupported(self, norm: str, knowledge: str, goal: str) -> str | None:
        """Also: the ε schedule (`large_eps`) is the original's for sparse-step norms (ℓ1) only."""
        why = super().unsupported(norm, knowledge, goal)
        if why is None and self.large_eps and not norm_of(norm).sparse_steps:
            return f"APGD large_eps is the ℓ1 schedule (AutoAttack's use_largereps), not one for {norm}"
        return why

    @property
    def strength_budget(self) -> int:
        """Most iterations a sample can take over all restarts and targets."""
        return self.n_iter * self.n_restarts * max(self.n_target_classes, 1)

    steps = strength_budget  # the name the budget had first

    def declared_cost(self, knowledge: str, goal: str, num_classes: int) -> Cost:
        """Under a targeted goal the loss has one target, so APGD-T runs once per restart, not per runner-up class."""
        targeted = Cost(grad_evals=self.n_iter * self.n_restarts, queries=0)
        return targeted if goal == "targeted" else super().declared_cost(knowledge, goal, num_classes)

    def run(self, oracle: WhiteBoxOracle, x: torch.Tensor, y: torch.Tensor, *, eps: torch.Tensor, norm: str,
            target: torch.Tensor | None, sample_id: torch.Tensor) -> AttackResult:
        n = x.shape[0]
        everyone = torch.arange(n, device=x.device)
        clean = oracle.logits(x, everyone)
        loss_targets = self._loss_targets(clean, y, target)
        first = torch.where(oracle.verdict(x, y, target, everyone, clean), 0, -1)
        x_adv = x.clone()
        active = everyone[(first < 0) & (eps > 0)]   # at ε = 0 nothing can change
        runs = [t for t in loss_targets for _ in range(self.n_restarts)]   # target-major, as AutoAttack
        for run, loss_target in enumerate(runs):
            if active.numel() == 0:
                break
            t = None if loss_target is None else loss_target[active]
            t_goal = None if target is None else target[active]
            run_first, run_x = self._one_run(oracle, x[active], y[active], t, t_goal, eps[active], norm,
                                             active, sample_id[active], stream=run)
            x_adv[active] = run_x
            broke = run_first >= 0
            first[active[broke]] = run * self.n_iter + run_first[broke]
            active = active[~broke]
        return AttackResult(x_adv=x_adv, success=first >= 0, first_success=first)

    def _loss_targets(self, clean: torch.Tensor, y: torch.Tensor,
                      target: torch.Tensor | None) -> list[torch.Tensor | None]:
        """The target class of each run's loss: the goal's, APGD-T's runner-up classes, or none."""
        k = clean.shape[1]
        if target is None and self.n_target_classes:
            if self.n_target_classes > k - 1:
                raise AdvbenchError(f"APGD-T n_target_classes={self.n_target_classes} exceeds the {k - 1} other classes")
            ranked = clean.argsort(dim=1, descending=True)
            targets: list[torch.Tensor | None] = [ranked[:, i] for i in range(1, self.n_target_classes + 1)]
        else:
            targets = [target]
        if self.loss == "dlr":
            need = _DLR_MIN_CLASSES[targets[0] is not None]
            if k < need:
                raise AdvbenchError(f"the {'targeted ' if targets[0] is not None else ''}DLR loss needs "
                                    f">= {need} classes, the model has {k}")
        return targets

    def _one_run(self, oracle: WhiteBoxOracle, x: torch.Tensor, y: torch.Tensor, loss_target: torch.Tensor | None,
                 goal_target: torch.Tensor | None, eps: torch.Tensor, norm: str, idx: torch.Tensor,
                 sample_id: torch.Tensor, stream: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One run: APGD-ℓ1's (`apgd_sparse`) in a sparse-step norm, else the paper's (`_single_run`)."""
        ball = norm_of(norm)
        if not ball.sparse_steps:
            return self._single_run(oracle, x, y, loss_target, goal_target, eps, norm, idx, sample_id, stream)
        sparse = SparseRun(oracle, lambda labels, target: self._objective(LOSSES[self.loss], labels, target), ball,
                           self.n_iter, self.large_eps)
        start = ball.sphere_start(x, sparse.start_factor() * eps, oracle.bounds, seed=self.seed, sample_id=sample_id,
                                  stream=stream)
        return sparse.run(x, y, loss_target, goal_target, eps, idx, start)

    def _single_run(self, oracle: WhiteBoxOracle, x: torch.Tensor, y: torch.Tensor, loss_target: torch.Tensor | None,
                    goal_target: torch.Tensor | None, eps: torch.Tensor, norm: str, idx: torch.Tensor,
                    sample_id: torch.Tensor, stream: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One APGD run: per row, the first adversarial iteration (-1: none) and the point returned.

        State lives only for the rows still running (`_RunRows`); a row that breaks is written
        out and dropped from every state tensor at once.
        """
        loss_fn, steps = LOSSES[self.loss], self.n_iter
        marks = checkpoints(steps)
        intervals = {w: w - w_prev for w_prev, w in zip(marks, marks[1:])}
        first = torch.full((x.shape[0],), -1, dtype=torch.long, device=x.device)
        out = x.clone()
        cur = boundary_start(x, eps, norm, oracle.bounds, seed=self.seed, sample_id=sample_id, stream=stream)
        state: _RunRows | None = None
        for k in range(steps + 1):
            rows = _RunRows.everyone(x, y, loss_target, goal_target, eps, idx) if state is None else state
            objective = self._objective(loss_fn, rows.labels, rows.loss_target)
            if k < steps:
                logits, grad = oracle.value_and_grad(cur, objective, rows.oracle_rows)
            else:
                logits, grad = oracle.logits(cur, rows.oracle_rows), None
            with torch.no_grad():
                loss = objective(logits)
            state = rows.start(cur, grad, loss) if state is None else state.track(cur, grad, loss)
            hit = oracle.verdict(cur, state.labels, state.goal_target, state.oracle_rows, logits,
                                 undated=first[state.rows] < 0)
            keep = settle(oracle, state.rows, first, out, cur, state.best, hit, k, k == steps)
            if keep is None:
                break
            if keep.numel() < state.rows.numel():
                state, cur = state.keep(keep), cur[keep]
                if state.rows.numel() == 0:
                    break
            if k in intervals:
                cur = state.halve(cur, intervals[k], self.rho)
            cur = state.step(cur, k, self.momentum, norm, oracle.bounds)
        return first, out

    @staticmethod
    def _objective(loss_fn: LossFn, y: torch.Tensor,
                   target: torch.Tensor | None) -> Callable[[torch.Tensor], torch.Tensor]:
        return lambda logits: loss_fn(logits, y, target)



@dataclass
class _RunRows(ApgdRows):
    """The ℓ∞/ℓ2 run's state beyond what both runs keep: following the paper, the step size `eta`,
    the previous point (momentum), the loss before, the best loss at the last checkpoint, the
    count of loss increases since then, and whether the last checkpoint halved the step.
    """

    eta: torch.Tensor | None = None
    prev: torch.Tensor | None = None
    loss_prev: torch.Tensor | None = None
    loss_best_last: torch.Tensor | None = None
    increases: torch.Tensor | None = None
    halved_last: torch.Tensor | None = None

    @classmethod
    def everyone(cls, x: torch.Tensor, y: torch.Tensor, loss_target: torch.Tensor | None,
                 goal_target: torch.Tensor | None, eps: torch.Tensor, idx: torch.Tensor) -> _RunRows:
        return cls(torch.arange(x.shape[0], device=x.device), x, y, loss_target, goal_target, eps, idx)

    def start(self, cur: torch.Tensor, grad: torch.Tensor, loss: torch.Tensor) -> _RunRows:
        """The state after the first evaluation, at the starting point."""
        n = cur.shape[0]
        return replace(self, eta=2 * self.eps, prev=cur, best=cur.clone(), grad=grad, best_grad=grad.clone(),
                       loss_prev=loss, loss_best=loss.clone(), loss_best_last=loss.clone(),
                       increases=torch.zeros(n, dtype=torch.long, device=cur.device),
                       halved_last=torch.zeros(n, dtype=torch.bool, device=cur.device))

    def track(self, cur: torch.Tensor, grad: torch.Tensor | None, loss: torch.Tensor) -> _RunRows:
        """Count a loss increase, keep the best point (and its gradient while steps remain)."""
        self.increases = self.increases + (loss > self.loss_prev)
        self.loss_prev = loss
        self.keep_best(cur, grad, loss)
        return self

    def halve(self, cur: torch.Tensor, interval: int, rho: float) -> torch.Tensor:
        """At a checkpoint: halve the step and restart from the best point where the paper's conditions say so."""
        halve = halve_step(self.increases, interval, rho, self.loss_best, self.loss_best_last, self.halved_last)
        self.eta = torch.where(halve, self.eta / 2, self.eta)
        self.grad = torch.where(per_sample(halve, self.grad), self.best_grad, self.grad)
        self.loss_prev = torch.where(halve, self.loss_best, self.loss_prev)
        self.increases = torch.zeros_like(self.increases)
        self.halved_last, self.loss_best_last = halve, self.loss_best.clone()
        return torch.where(per_sample(halve, cur), self.best, cur)

    def step(self, cur: torch.Tensor, k: int, momentum: float, norm: str, bounds: tuple[float, float]) -> torch.Tensor:
        """The next point: a projected step of size eta, then (after the first) momentum `momentum`."""
        z = ascend(cur, self.origin, unit_direction(self.grad, norm), self.eta, self.eps, norm, bounds)
        if k == 0:
            nxt = z
        else:
            a = momentum
            nxt = ascend(cur, self.origin, a * (z - cur) + (1 - a) * (cur - self.prev), torch.ones_like(self.eps),
                         self.eps, norm, bounds)
        self.prev = cur
        return nxt
