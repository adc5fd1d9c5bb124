"""HopSkipJump, the decision-based minimum-norm attack on top-1 labels only (ℓ2, ℓ∞); Boundary is in `boundary.py`.

It sees a `DecisionOracle` and nothing else. Every labelled image is a query counted per
sample by the oracle; a sample leaves the active set when its query budget is spent, and no
call ever asks more of a sample than it has left. All samples' candidates of a step travel
together (`QueryLog` hands them to the oracle in memory-sized pieces), and random draws
come per sample from (seed, sample_id, stream), so an untargeted sample's result does not
depend on its batch.

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

from advbench.core import hyperparameters as hyper
from advbench.core.norms import L2_NORM, LINF
from advbench.core.norms import norm as norm_of
from advbench.core.runtime import PROBE_ELEMENTS
from advbench.core.sample_draws import normal, uniform
from advbench.core.steps import clip, lp_norm, per_sample
from advbench.robustness.attacks.attack_contract import AttackResult
from advbench.robustness.attacks.oracles import DecisionOracle
from advbench.robustness.attacks.queries import CHECKPOINTS, DecisionAttack, QueryLog, bisect, starting_points


class HopSkipJump(DecisionAttack):
    """HopSkipJump (Chen, Jordan & Wainwright 2020), ℓ2 and ℓ∞, with the authors' defaults.

    From an adversarial start, each iteration j: binary search to the boundary, estimate the
    boundary's normal from min(init_evals·√j, max_evals) labels of random points δ around the
    boundary point (δ = 0.1·range at j = 1, then √d·θ·dist for ℓ2, d·θ·dist for ℓ∞, θ = γ/d^{3/2}
    resp. γ/d²), step along it (its sign for ℓ∞) by the geometric search from dist/√j, halving
    until adversarial, and search back to the boundary. Iterations run until the sample's
    `max_queries` are spent (the last gradient estimate uses what is left). Samples run the
    iterations in lockstep, each with its own budget and its own random directions.

    `first_success` and the checkpoints are in queries (`strength_budget` is
    `max_queries`). Untargeted starts: up to `init_tries` uniform noise images, then the authors'
    blend search towards x (tolerance 0.001); targeted: see `starting_points`.
    """

    norms = ("l2", "linf")
    hyperparameters = {**DecisionAttack.hyperparameters, "init_evals": hyper.Whole(1), "max_evals": hyper.Whole(1),
                       "gamma": hyper.Real(0, open_low=True)}

    def __init__(self, *, max_queries: int = 20000, init_evals: int = 100, max_evals: int = 10000,
                 gamma: float = 1.0, init_tries: int = 100, checkpoints: Sequence[int] = CHECKPOINTS,
                 seed: int = 0) -> None:
        self.set_hyperparameters(locals())

    def run(self, oracle: DecisionOracle, x: torch.Tensor, y: torch.Tensor, *, eps: torch.Tensor, norm: str,
            target: torch.Tensor | None, sample_id: torch.Tensor) -> AttackResult:
        log = QueryLog(oracle, x, y, target, eps, norm, self.max_queries, self.checkpoints)
        start, ok = starting_points(log, x, y, target, norm=norm, bounds=oracle.bounds, seed=self.seed,
                                    sample_id=sample_id, tries=self.init_tries)
        active = torch.nonzero(ok).squeeze(1)
        if target is None:  # the authors' blend search from the noise towards x
            start[active], _ = bisect(log, x[active], start[active], active, L2_NORM, 1e-3)
        d, box = x[0].numel(), norm_of(norm) is LINF
        theta = self.gamma / (d * d if box else d * math.sqrt(d))
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
                     else (d if box else math.sqrt(d)) * theta * dist_post[active])
            evals = min(int(self.init_evals * math.sqrt(j)), self.max_evals)
            grad = self._gradient(log, cur[active], active, delta, evals, norm, oracle.bounds, sample_id[active], j)
            update = grad.sign() if box else grad
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

        A sample with fewer than `evals` queries left uses what it has. The probes are drawn per
        chunk of samples, `PROBE_ELEMENTS` input elements at most (chunks bound the memory of the
        probes, not the result).
        """
        m, shape = xb.shape[0], tuple(xb.shape[1:])
        chunk = max(1, PROBE_ELEMENTS // max(1, evals * xb[0].numel()))
        out = torch.empty_like(xb)
        for s in range(0, m, chunk):
            sl = slice(s, s + chunk)
            k = torch.clamp(log.left(idx[sl]), max=evals)
            if norm_of(norm) is LINF:
                rv = uniform(self.seed, sample_id[sl], (evals, *shape), j, device=xb.device, dtype=xb.dtype) * 2 - 1
            else:
                rv = normal(self.seed, sample_id[sl], (evals, *shape), j, device=xb.device, dtype=xb.dtype)
            # In place on the draw's own tensor: each probe-sized temporary is megabytes to fault in.
            rv.div_(L2_NORM.size(rv.flatten(0, 1)).clamp_min(1e-12).reshape(rv.shape[0], evals, *([1] * len(shape))))
            base = xb[sl][:, None]
            dl = delta[sl].reshape(-1, 1, *([1] * len(shape)))
            probes = rv.mul_(dl).add_(base).clamp_(*bounds)  # clip(x + δ·u)
            rv = probes.sub(base).div_(dl)
            use = torch.arange(evals, device=xb.device)[None, :] < k[:, None]
            fval = torch.zeros(use.shape, dtype=xb.dtype, device=xb.device)
            if bool((k == evals).all()):  # every probe queried: no gather (a copy of all probes)
                fval.view(-1).copy_(log.adversarial(probes.flatten(0, 1), idx[sl].repeat_interleave(evals))).mul_(2).sub_(1)
            else:
                fval[use] = 2 * log.adversarial(probes[use], idx[sl][:, None].expand(-1, evals)[use]).to(xb.dtype) - 1
            mean = fval.sum(1) / k.clamp_min(1)
            same = mean.abs() == 1  # all probes agree: the authors average the directions
            weight = torch.where(same[:, None], fval, (fval - mean[:, None]) * use)
            g = rv.mul_(weight.reshape(*weight.shape, *([1] * len(shape)))).sum(1) / per_sample(k.clamp_min(1), xb[sl])
            out[sl] = g / per_sample(L2_NORM.size(g).clamp_min(1e-12), g)
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

