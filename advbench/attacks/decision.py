"""Decision-based minimum-norm attacks on top-1 labels only: HopSkipJump (ℓ2, ℓ∞), Boundary (ℓ2).

They see a `DecisionOracle` and nothing else. Every labelled image is a query counted per
sample by the oracle; a sample leaves the active set when its query budget is spent, and no
call ever asks more of a sample than it has left. All samples' candidates of a step travel in
one oracle call, and random draws come per sample from (seed, sample_id, stream), so an
untargeted sample's result does not depend on its batch.

`QueryLog` is the bookkeeping decision attacks share: the smallest verified adversarial
example, `first_success` in queries, and the best norm at query checkpoints (info columns
`norm_at_<q>`: raw ℓp norms here, which the engine records in threat units like `min_eps`), so
accuracy-vs-queries curves come from one run.
`starting_points` gives the seed's starts: untargeted, uniform noise that is already
misclassified; targeted, a correctly classified image of the target class. The attack only
gets the batch, so the targeted start is the nearest such image in the batch (a targeted
result depends on the batch's contents); where the batch has none the sample fails (inf).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from advbench.attacks.base import Attack, AttackResult
from advbench.attacks.oracles import DecisionOracle
from advbench.attacks.optimized import SmallestAdversarial
from advbench.attacks.random import normal, uniform
from advbench.attacks.steps import clip, lp_norm, per_sample
from advbench.threat import goal_met

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

    def adversarial(self, x_cand: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """Whether each candidate meets its sample's goal (one query per row)."""
        labels = self.oracle.labels(x_cand, idx)
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
    labels = log.oracle.labels(x, everyone)
    clean_adv = goal_met(labels, y, target)
    log.offer(everyone, x, clean_adv)
    starts = x.clone()
    ok = torch.zeros(n, dtype=torch.bool, device=x.device)
    if target is not None:
        pool = (labels == y)[None, :] & (y[None, :] == target[:, None])  # (sample, candidate)
        dist = torch.cdist(x.flatten(1).double(), x.flatten(1).double(), p=math.inf if norm == "linf" else 2.0)
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
    if norm == "linf":
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
    if norm == "linf":
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
    unmoved = high == (dist_in if norm == "linf" else 1.0)
    return torch.where(per_sample(unmoved, x), x_adv, moved), dist_in


class DecisionAttack(Attack):
    """What the decision-based attacks share: top-1 labels only, a minimum-norm result, and a
    per-sample query budget (the strength budget, `steps`) with checkpoints the records keep."""

    kind = "minimizing"
    knowledge = ("decision",)

    def __init__(self, *, max_queries: int, init_tries: int, checkpoints: Sequence[int], seed: int,
                 **counts: int) -> None:
        for name, value in (("max_queries", max_queries), *counts.items(), ("init_tries", init_tries)):
            if value < 1:
                raise ValueError(f"expected {name} >= 1, got {value}")
        if any(c < 1 for c in checkpoints):
            raise ValueError(f"expected query checkpoints >= 1, got {list(checkpoints)}")
        self.max_queries = max_queries
        self.init_tries = init_tries
        self.checkpoints = [int(c) for c in checkpoints]
        self.seed = seed

    @property
    def steps(self) -> int:
        """Strength budget: queries per sample."""
        return self.max_queries

    def start_on_boundary(self, oracle: DecisionOracle, x: torch.Tensor, y: torch.Tensor, target: torch.Tensor | None,
                          eps: torch.Tensor, norm: str, sample_id: torch.Tensor
                          ) -> tuple[QueryLog, torch.Tensor, torch.Tensor]:
        """The query log, each sample's start bisected to the boundary in l2 (x where none was found),
        and the samples that have one: where Boundary and Evolutionary begin their walk."""
        log = QueryLog(oracle, x, y, target, eps, norm, self.max_queries, self.checkpoints)
        start, ok = starting_points(log, x, y, target, norm=norm, bounds=oracle.bounds, seed=self.seed,
                                    sample_id=sample_id, tries=self.init_tries)
        active = torch.nonzero(ok).squeeze(1)
        cur = x.clone()
        cur[active], _ = bisect(log, x[active], start[active], active, "l2", 1e-3)
        log.offer(active, cur[active], torch.ones_like(active, dtype=torch.bool))
        return log, cur, active


class HopSkipJump(DecisionAttack):
    """HopSkipJump (Chen, Jordan & Wainwright 2020), ℓ2 and ℓ∞, with the authors' defaults.

    From an adversarial start, each iteration j: binary search to the boundary, estimate the
    boundary's normal from min(init_evals·√j, max_evals) labels of random points δ around the
    boundary point (δ = 0.1·range at j = 1, then √d·θ·dist for ℓ2, d·θ·dist for ℓ∞, θ = γ/d^{3/2}
    resp. γ/d²), step along it (its sign for ℓ∞) by the geometric search from dist/√j, halving
    until adversarial, and search back to the boundary. Iterations run until the sample's
    `max_queries` are spent (the last gradient estimate uses what is left). Samples run the
    iterations in lockstep, each with its own budget and its own random directions.

    `first_success` and the checkpoints are in queries (`steps` = `max_queries` is the strength
    budget). Untargeted starts: up to `init_tries` uniform noise images, then the authors'
    blend search towards x (tolerance 0.001); targeted: see `starting_points`.
    """

    norms = ("l2", "linf")

    def __init__(self, *, max_queries: int = 20000, init_evals: int = 100, max_evals: int = 10000,
                 gamma: float = 1.0, init_tries: int = 100, checkpoints: Sequence[int] = CHECKPOINTS,
                 seed: int = 0) -> None:
        super().__init__(max_queries=max_queries, init_tries=init_tries, checkpoints=checkpoints, seed=seed,
                         init_evals=init_evals, max_evals=max_evals)
        if gamma <= 0:
            raise ValueError(f"expected gamma > 0, got {gamma}")
        self.init_evals = init_evals
        self.max_evals = max_evals
        self.gamma = gamma

    def run(self, oracle: DecisionOracle, x: torch.Tensor, y: torch.Tensor, *, eps: torch.Tensor, norm: str,
            target: torch.Tensor | None, sample_id: torch.Tensor) -> AttackResult:
        log = QueryLog(oracle, x, y, target, eps, norm, self.max_queries, self.checkpoints)
        start, ok = starting_points(log, x, y, target, norm=norm, bounds=oracle.bounds, seed=self.seed,
                                    sample_id=sample_id, tries=self.init_tries)
        active = torch.nonzero(ok).squeeze(1)
        if target is None:  # the authors' blend search from the noise towards x
            start[active], _ = bisect(log, x[active], start[active], active, "l2", 1e-3)
        d = x[0].numel()
        theta = self.gamma / (d * math.sqrt(d) if norm == "l2" else d * d)
        cur = x.clone()
        dist_post = torch.zeros(x.shape[0], dtype=x.dtype, device=x.device)
        cur[active], dist_post[active] = bisect(log, x[active], start[active], active, norm, theta)
        log.offer(active, cur[active], torch.ones_like(active, dtype=torch.bool))
        j = 0
        while True:
            active = log.affordable(active)
            if active.numel() == 0:
                break
            j += 1
            delta = (0.1 * (oracle.bounds[1] - oracle.bounds[0]) * torch.ones_like(dist_post[active]) if j == 1
                     else (math.sqrt(d) if norm == "l2" else d) * theta * dist_post[active])
            evals = min(int(self.init_evals * math.sqrt(j)), self.max_evals)
            grad = self._gradient(log, cur[active], active, delta, evals, norm, oracle.bounds, sample_id[active], j)
            update = grad.sign() if norm == "linf" else grad
            size, found = self._geometric(log, cur[active], update, active, j, lp_norm(cur[active] - x[active], norm),
                                          oracle.bounds)
            moved = active[found]
            stepped = clip(cur[moved] + per_sample(size[found], update[found]) * update[found], oracle.bounds)
            cur[moved], dist_post[moved] = bisect(log, x[moved], stepped, moved, norm, theta)
            log.offer(moved, cur[moved], torch.ones_like(moved, dtype=torch.bool))
        return log.result()

    def _gradient(self, log: QueryLog, xb: torch.Tensor, idx: torch.Tensor, delta: torch.Tensor, evals: int,
                  norm: str, bounds: tuple[float, float], sample_id: torch.Tensor, j: int) -> torch.Tensor:
        """Unit estimate of the boundary normal at each row of `xb` from its own random probes.

        A sample with fewer than `evals` queries left uses what it has. One oracle call per
        chunk of samples (chunks bound the memory of the probes, not the result).
        """
        m, shape = xb.shape[0], tuple(xb.shape[1:])
        chunk = max(1, (1 << 24) // max(1, evals * xb[0].numel()))
        out = torch.empty_like(xb)
        for s in range(0, m, chunk):
            sl = slice(s, s + chunk)
            k = torch.clamp(log.left(idx[sl]), max=evals)
            if norm == "linf":
                rv = uniform(self.seed, sample_id[sl], (evals, *shape), j, device=xb.device, dtype=xb.dtype) * 2 - 1
            else:
                rv = normal(self.seed, sample_id[sl], (evals, *shape), j, device=xb.device, dtype=xb.dtype)
            rv = rv / lp_norm(rv.flatten(0, 1), "l2").clamp_min(1e-12).reshape(rv.shape[0], evals, *([1] * len(shape)))
            base = xb[sl][:, None]
            dl = delta[sl].reshape(-1, 1, *([1] * len(shape)))
            probes = clip(base + dl * rv, bounds)
            rv = (probes - base) / dl
            use = torch.arange(evals, device=xb.device)[None, :] < k[:, None]
            rows = idx[sl][:, None].expand(-1, evals)[use]
            fval = torch.zeros(use.shape, dtype=xb.dtype, device=xb.device)
            fval[use] = 2 * log.adversarial(probes[use], rows).to(xb.dtype) - 1
            mean = fval.sum(1) / k.clamp_min(1)
            same = mean.abs() == 1  # all probes agree: the authors average the directions
            weight = torch.where(same[:, None], fval, (fval - mean[:, None]) * use)
            g = (weight.reshape(*weight.shape, *([1] * len(shape))) * rv).sum(1) / per_sample(k.clamp_min(1), xb[sl])
            out[sl] = g / per_sample(lp_norm(g, "l2").clamp_min(1e-12), g)
        return out

    def _geometric(self, log: QueryLog, xb: torch.Tensor, update: torch.Tensor, idx: torch.Tensor, j: int,
                   dist: torch.Tensor, bounds: tuple[float, float]) -> tuple[torch.Tensor, torch.Tensor]:
        """The authors' geometric step search: from dist/√j, halve until the step is adversarial.

        Returns the step sizes and which samples found one before their queries ran out.
        """
        size = dist / math.sqrt(j)
        found = torch.zeros(xb.shape[0], dtype=torch.bool, device=xb.device)
        rows = torch.arange(xb.shape[0], device=xb.device)
        while True:
            rows = rows[log.left(idx[rows]) > 0]
            if rows.numel() == 0:
                break
            cand = clip(xb[rows] + per_sample(size[rows], xb[rows]) * update[rows], bounds)
            hit = log.adversarial(cand, idx[rows])
            found[rows[hit]] = True
            size[rows[~hit]] /= 2
            rows = rows[~hit]
        return size, found


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


class Boundary(DecisionAttack):
    """Boundary attack (Brendel, Rauber & Bethge 2018), ℓ2, with the authors' defaults.

    From an adversarial start (`starting_points`, then a blend search towards x), each step
    draws one candidate per sample: an orthogonal step on the sphere around x (relative size
    `spherical_step`), then a step of relative size `source_step` towards x; it replaces the
    sample's point if adversarial and closer. Every `update_stats_every_k` steps the spherical
    candidate alone is judged too (a second query), and the step sizes adapt per sample by
    ×/÷ `step_adaptation` from the success rates of the last 100 spherical / 30 full
    candidates (the reference implementation's thresholds). A sample stops when its source
    step falls below `source_step_convergence` or its `max_queries` are spent.
    """

    norms = ("l2",)

    def __init__(self, *, max_queries: int = 20000, spherical_step: float = 1e-2, source_step: float = 1e-2,
                 source_step_convergence: float = 1e-7, step_adaptation: float = 1.5, update_stats_every_k: int = 10,
                 init_tries: int = 100, checkpoints: Sequence[int] = CHECKPOINTS,
                 seed: int = 0) -> None:
        super().__init__(max_queries=max_queries, init_tries=init_tries, checkpoints=checkpoints, seed=seed,
                         update_stats_every_k=update_stats_every_k)
        if min(spherical_step, source_step, source_step_convergence) <= 0 or step_adaptation <= 1:
            raise ValueError("expected positive step sizes and step_adaptation > 1")
        self.spherical_step = spherical_step
        self.source_step = source_step
        self.source_step_convergence = source_step_convergence
        self.step_adaptation = step_adaptation
        self.update_stats_every_k = update_stats_every_k

    def run(self, oracle: DecisionOracle, x: torch.Tensor, y: torch.Tensor, *, eps: torch.Tensor, norm: str,
            target: torch.Tensor | None, sample_id: torch.Tensor) -> AttackResult:
        n = x.shape[0]
        log, cur, active = self.start_on_boundary(oracle, x, y, target, eps, norm, sample_id)
        spherical = torch.full((n,), self.spherical_step, dtype=x.dtype, device=x.device)
        source = torch.full((n,), self.source_step, dtype=x.dtype, device=x.device)
        stats_sph, stats_step = Window(n, 100, x.device), Window(n, 30, x.device)
        step = 0
        while True:
            active = log.affordable(active[source[active] >= self.source_step_convergence])
            if active.numel() == 0:
                break
            step += 1
            cand, sph = self._proposals(x[active], cur[active], spherical[active], source[active],
                                        sample_id[active], step, oracle.bounds)
            adv = log.adversarial(cand, active)
            closer = lp_norm(cand - x[active], "l2") < lp_norm(cur[active] - x[active], "l2")
            better = adv & closer
            cur[active[better]] = cand[better]
            log.offer(active, cand, better)
            if step % self.update_stats_every_k == 0:
                self._adapt(log, active, sph, adv, spherical, source, stats_sph, stats_step)
        return log.result()

    def _proposals(self, x: torch.Tensor, cur: torch.Tensor, spherical: torch.Tensor, source: torch.Tensor,
                   sample_id: torch.Tensor, step: int,
                   bounds: tuple[float, float]) -> tuple[torch.Tensor, torch.Tensor]:
        """(candidate, spherical candidate) per row, as the reference draws them (per-sample noise)."""
        shape = x.shape
        xf, cf = x.flatten(1), cur.flatten(1)
        src = xf - cf
        src_norm = src.norm(dim=1)
        src_dir = src / src_norm[:, None]
        eta = normal(self.seed, sample_id, (xf.shape[1],), step, device=x.device, dtype=x.dtype)
        eta = eta - (eta * src_dir).sum(1, keepdim=True) * src_dir
        eta = eta * (spherical * src_norm / eta.norm(dim=1).clamp_min(1e-12))[:, None]
        sph = (xf + (eta - src) / torch.sqrt(spherical ** 2 + 1)[:, None]).clamp(*bounds)
        new_src = xf - sph
        new_norm = new_src.norm(dim=1)
        length = (source * src_norm + new_norm - src_norm).clamp_min(0) / new_norm.clamp_min(1e-12)
        cand = (sph + length[:, None] * new_src).clamp(*bounds)
        return cand.reshape(shape), sph.reshape(shape)

    def _adapt(self, log: QueryLog, active: torch.Tensor, sph: torch.Tensor, adv: torch.Tensor,
               spherical: torch.Tensor, source: torch.Tensor, stats_sph: Window, stats_step: Window) -> None:
        """Judge the spherical candidates of the samples with a query left and adapt their steps."""
        can = log.left(active) > 0
        idx = active[can]
        stats_sph.push(idx, log.adversarial(sph[can], idx))
        stats_step.push(idx, adv[can])
        a = self.step_adaptation
        full = stats_sph.full(idx)
        p = stats_sph.mean(idx)
        up, down = full & (p > 0.5), full & (p < 0.2)
        factor = torch.where(up, a, torch.where(down, 1 / a, 1.0)).to(spherical.dtype)
        spherical[idx] *= factor
        source[idx] *= factor
        stats_sph.clear(idx[up | down])
        full = stats_step.full(idx)
        p = stats_step.mean(idx)
        up, down = full & (p > 0.25), full & (p < 0.1)
        source[idx] *= torch.where(up, a, torch.where(down, 1 / a, 1.0)).to(source.dtype)
        stats_step.clear(idx[up | down])
