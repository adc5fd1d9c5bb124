"""What every decision-based attack shares: the query log, starting points, the walk to the boundary.

Queries are counted by the oracle; the log reads them per sample, keeps the smallest
adversarial example found so far and its norm at the query checkpoints the records keep.
Probes travel to the oracle in near-equal pieces of at most `probe_rows` rows: the model sees
each row alone (no batch interaction), a randomized one that keys its draws per row
(`keyed_draws`) draws them in the same order, and every row is one query, so the pieces give
the labels, counts and draws of one big call at the flat cost per row of a memory-sized call.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from advbench.core import hyperparameters as hyper
from advbench.core.norms import L2_NORM, LINF
from advbench.core.norms import norm as norm_of
from advbench.core.runtime import pieces, probe_rows
from advbench.core.sample_draws import uniform
from advbench.core.steps import lp_norm, per_sample
from advbench.robustness.attacks.attack_contract import Attack, AttackResult
from advbench.robustness.attacks.minimum_norm import SmallestAdversarial
from advbench.robustness.attacks.oracles import DecisionOracle
from advbench.robustness.threat import goal_met

_INIT_STREAM = 1 << 32  # uniform-noise starts; iteration streams count up from 1


CHECKPOINTS = (1000, 2000, 5000, 10000, 20000)  # query counts whose best norm the records keep


class QueryLog:
    """Per-sample queries spent in this run, the best example so far and its norm at checkpoints.

    Queries are read from the oracle (relative to the start of the run), never counted here.
    `norm_at[:, k]` is the best norm known after at most `checkpoints[k]` queries: every offer
    writes the new best into the checkpoints its query count has not passed.
    """

    def __init__(self, oracle: DecisionOracle, x: torch.Tensor, y: torch.Tensor, target: torch.Tensor | None,
                 eps: torch.Tensor, norm: str, max_queries: int, checkpoints: Sequence[int]) -> None:
        self.oracle, self.y, self.target, self.max_queries = oracle, y, target, max_queries
        self.start = oracle.queries.clone()
        self.piece = probe_rows(x[0])
        self.best = SmallestAdversarial(x, eps, norm)
        self.checkpoints = sorted({int(c) for c in checkpoints if c <= max_queries} | {max_queries})
        self._marks = torch.tensor(self.checkpoints, device=x.device)
        self.norm_at = torch.full((x.shape[0], len(self.checkpoints)), math.inf, dtype=x.dtype, device=x.device)

    def spent(self, idx: torch.Tensor) -> torch.Tensor:
        return (self.oracle.queries - self.start)[idx]

    def left(self, idx: torch.Tensor) -> torch.Tensor:
        return self.max_queries - self.spent(idx)

    def affordable(self, idx: torch.Tensor) -> torch.Tensor:
        """The samples of `idx` that may still ask one query."""
        return idx[self.left(idx) > 0]

    def labels(self, x_cand: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """The target's labels of the candidates (one query per row, `piece` rows an oracle call)."""
        return torch.cat([self.oracle.labels(x_cand[sl], idx[sl]) for sl in pieces(idx.shape[0], self.piece)])

    def adversarial(self, x_cand: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """Whether each candidate meets its sample's goal (one query per row)."""
        labels = self.labels(x_cand, idx)
        return goal_met(labels, self.y[idx], None if self.target is None else self.target[idx])

    def offer(self, idx: torch.Tensor, x_cand: torch.Tensor, adversarial: torch.Tensor) -> None:
        spent = self.spent(idx)
        self.best.offer(idx, x_cand, adversarial, spent)
        due = spent[:, None] <= self._marks[None, :]
        self.norm_at[idx] = torch.where(due, self.best.best[idx][:, None], self.norm_at[idx])

    def result(self) -> AttackResult:
        res = self.best.result()
        res.info = {f"norm_at_{c}": self.norm_at[:, k] for k, c in enumerate(self.checkpoints)}
        return res


def starting_points(log: QueryLog, x: torch.Tensor, y: torch.Tensor, target: torch.Tensor | None, *,
                    norm: str, bounds: tuple[float, float], seed: int, sample_id: torch.Tensor,
                    tries: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(starts, ok): an adversarial start per sample where one was found.

    Every sample first pays one query for its clean label: a clean input that already meets the
    goal is the smallest example (norm 0) and needs no start. Untargeted: up to `tries` uniform
    noise images per sample. Targeted: the clean labels show which batch images are correctly
    classified; a sample starts from the nearest (in `norm`) one whose class is its target.
    """
    n = x.shape[0]
    everyone = torch.arange(n, device=x.device)
    labels = log.labels(x, everyone)
    clean_adv = goal_met(labels, y, target)
    log.offer(everyone, x, clean_adv)
    starts = x.clone()
    ok = torch.zeros(n, dtype=torch.bool, device=x.device)
    if target is not None:
        pool = (labels == y)[None, :] & (y[None, :] == target[:, None])  # (sample, candidate)
        dist = torch.cdist(x.flatten(1).double(), x.flatten(1).double(), p=norm_of(norm).p)
        nearest = dist.masked_fill(~pool, math.inf).argmin(dim=1)
        ok = pool.any(dim=1) & ~clean_adv
        starts[ok] = x[nearest[ok]]
        return starts, ok
    todo = everyone[~clean_adv]
    lo, hi = bounds
    for t in range(tries):
        todo = log.affordable(todo)
        if todo.numel() == 0:
            break
        noise = lo + (hi - lo) * uniform(seed, sample_id[todo], tuple(x.shape[1:]), _INIT_STREAM + t,
                                         device=x.device, dtype=x.dtype)
        hit = log.adversarial(noise, todo)
        starts[todo[hit]] = noise[hit]
        ok[todo[hit]] = True
        todo = todo[~hit]
    return starts, ok


def toward(x: torch.Tensor, x_adv: torch.Tensor, alpha: torch.Tensor, norm: str) -> torch.Tensor:
    """HopSkipJump's projection: ℓ2 blends (1−α)x + αx_adv; ℓ∞ clips x_adv to the α-box around x."""
    a = per_sample(alpha, x)
    if norm_of(norm) is LINF:
        return torch.minimum(torch.maximum(x_adv, x - a), x + a)
    return (1 - a) * x + a * x_adv


def bisect(log: QueryLog, x: torch.Tensor, x_adv: torch.Tensor, idx: torch.Tensor, norm: str,
           theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Binary search from adversarial `x_adv` towards `x` (rows `idx`), per sample to tolerance.

    ℓ2: over the blend α ∈ [0, 1] to θ; ℓ∞: over the box radius in [0, ‖x_adv − x‖∞] to
    min(θ·‖x_adv − x‖∞, θ) (the authors' thresholds). A sample stops early when its queries run
    out. Returns the last adversarial point of each row and ‖x_adv − x‖ (HopSkipJump's δ uses it).
    """
    dist_in = lp_norm(x_adv - x, norm)
    box = norm_of(norm) is LINF
    if box:
        high = dist_in.clone()
        thr = torch.minimum(dist_in * theta, torch.full_like(dist_in, theta))
    else:
        high = torch.ones_like(dist_in)
        thr = torch.full_like(dist_in, theta)
    low = torch.zeros_like(dist_in)
    rows = torch.arange(idx.shape[0], device=x.device)
    while True:
        rows = rows[(high[rows] - low[rows]) / thr[rows] > 1]
        rows = rows[log.left(idx[rows]) > 0]
        if rows.numel() == 0:
            break
        mid = (high[rows] + low[rows]) / 2
        hit = log.adversarial(toward(x[rows], x_adv[rows], mid, norm), idx[rows])
        high[rows[hit]] = mid[hit]
        low[rows[~hit]] = mid[~hit]
    moved = toward(x, x_adv, high, norm)
    unmoved = high == (dist_in if box else 1.0)
    return torch.where(per_sample(unmoved, x), x_adv, moved), dist_in


class DecisionAttack(Attack):
    """What the decision-based attacks share: top-1 labels only, a minimum-norm result, and a
    per-sample query budget (the `strength_budget`) with checkpoints the records keep."""

    kind = "minimizing"
    knowledge = ("decision",)
    hyperparameters = {"max_queries": hyper.Whole(1), "init_tries": hyper.Whole(1), "checkpoints": hyper.Wholes(1),
                       "seed": hyper.Whole(None)}
    max_queries: int
    init_tries: int
    checkpoints: list[int]
    seed: int

    @property
    def strength_budget(self) -> int:
        """Queries per sample: `max_queries`."""
        return self.max_queries

    steps = strength_budget  # the name the budget had first

    def start_on_boundary(self, oracle: DecisionOracle, x: torch.Tensor, y: torch.Tensor, target: torch.Tensor | None,
                          eps: torch.Tensor, norm: str, sample_id: torch.Tensor
                          ) -> tuple[QueryLog, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The query log, each sample's adversarial start and that start bisected to the boundary in
        l2 (both x where none was found), and the samples that have one: where Boundary and
        Evolutionary begin their walk (the paper's from the boundary, ART's from the start)."""
        log = QueryLog(oracle, x, y, target, eps, norm, self.max_queries, self.checkpoints)
        start, ok = starting_points(log, x, y, target, norm=norm, bounds=oracle.bounds, seed=self.seed,
                                    sample_id=sample_id, tries=self.init_tries)
        active = torch.nonzero(ok).squeeze(1)
        cur = x.clone()
        cur[active], _ = bisect(log, x[active], start[active], active, L2_NORM, 1e-3)
        log.offer(active, cur[active], torch.ones_like(active, dtype=torch.bool))
        return log, torch.where(per_sample(ok, x), start, x), cur, active


class Window:
    """Per-sample sliding window of the last `size` booleans: Boundary's success statistics."""

    def __init__(self, n: int, size: int, device: torch.device) -> None:
        self.size = size
        self.values = torch.zeros(n, size, device=device)
        self.count = torch.zeros(n, dtype=torch.long, device=device)

    def push(self, idx: torch.Tensor, value: torch.Tensor) -> None:
        self.values[idx, self.count[idx] % self.size] = value.to(self.values.dtype)
        self.count[idx] += 1

    def full(self, idx: torch.Tensor) -> torch.Tensor:
        return self.count[idx] >= self.size

    def mean(self, idx: torch.Tensor) -> torch.Tensor:
        return self.values[idx].mean(dim=1)

    def clear(self, idx: torch.Tensor) -> None:
        self.count[idx] = 0
