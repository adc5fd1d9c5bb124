"""Boundary attack (Brendel, Rauber & Bethge 2018), ℓ2: a walk along the decision boundary towards x.

Two step schedules share the orthogonal step. `trust_region` (the default, as the Adversarial
Robustness Toolbox runs the attack) judges a volley of candidates per stage and adapts both
step sizes from each volley's success ratio; `paper` (the reference code and Foolbox) judges
one candidate a step and adapts from windows of the last 100 / 30 candidates. Those windows
fill only after hundreds of steps, so under a budget of a few thousand queries the paper's
steps barely adapt: at 1,000 queries `trust_region` reaches less than half the paper's median
ℓ2 on digits, as ART does (scripts/bench_boundary.py, docs/attacks.md).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from advbench.core import hyperparameters as hyper
from advbench.core.norms import L2_NORM
from advbench.core.sample_draws import normal
from advbench.robustness.attacks.attack_contract import AttackResult
from advbench.robustness.attacks.oracles import DecisionOracle
from advbench.robustness.attacks.queries import CHECKPOINTS, DecisionAttack, QueryLog, Window

SCHEDULES = ("trust_region", "paper")


def orthogonal_step(x: torch.Tensor, cur: torch.Tensor, eta: torch.Tensor, step: torch.Tensor,
              bounds: tuple[float, float]) -> torch.Tensor:
    """The reference's orthogonal step (flat rows): `eta` made orthogonal to x − cur, scaled to
    `step`·‖x − cur‖, and the point put back on the sphere through cur around x, clipped."""
    src = x - cur
    src_norm = src.norm(dim=1)
    src_dir = src / src_norm[:, None]
    eta = eta - (eta * src_dir).sum(1, keepdim=True) * src_dir
    eta = eta * (step * src_norm / eta.norm(dim=1).clamp_min(1e-12))[:, None]
    return (x + (eta - src) / torch.sqrt(step ** 2 + 1)[:, None]).clamp(*bounds)


class Boundary(DecisionAttack):
    """Boundary attack (Brendel, Rauber & Bethge 2018), ℓ2.

    From an adversarial start (`starting_points`), a sample walks along the boundary: an
    orthogonal step of relative size `spherical_step` on the sphere around x through its point,
    then a step towards x of relative size `source_step`; a sample stops when its source step
    falls below `source_step_convergence` or its `max_queries` are spent. The schedule says how
    the steps are judged and adapted:

    * `trust_region` (default; ART's `BoundaryAttack`): the walk starts at the start itself, and
      a step is two stages, each a volley of queries. Orthogonal stage: `candidates` orthogonal
      steps from the point; their success ratio adapts the spherical step (÷ `step_adaptation`
      below 0.2, × above 0.5), and the stage repeats with fresh draws until one is adversarial.
      Source stage: each adversarial one moved the fraction `source_step` towards x; the ratio
      adapts the source step the same way (capped at 1: x itself), and the stage repeats on the
      same candidates until one is adversarial; the closest such becomes the point. The steps
      adapt from the first volley on, so from the far start the source step grows and the first
      steps cross most of the distance (a blend search to the boundary first, as `paper` does,
      leaves the source step shrinking from the start: worse at every budget on digits).
    * `paper` (the reference code, Foolbox): the start is first searched to the boundary along
      the blend towards x (tolerance 0.001); one candidate a step (both steps at once) replaces
      the point if adversarial and closer; every `update_stats_every_k` steps the orthogonal
      step alone is judged too (a second query) and the step sizes adapt ×/÷ `step_adaptation`
      from the success rates of the last 100 orthogonal / 30 full candidates.

    Samples run the stages in lockstep, one oracle call a round for all their candidates (a
    sample with fewer queries left than candidates sends its first ones); every draw comes from
    (seed, sample_id, round), so a sample's walk does not depend on its batch. `trust_region`
    keeps a sample's orthogonal candidates between its stages: `candidates` images a sample.
    """

    norms = ("l2",)
    hyperparameters = {**DecisionAttack.hyperparameters, "schedule": hyper.Choice(SCHEDULES),
                       "candidates": hyper.Whole(1), "spherical_step": hyper.Real(0, open_low=True),
                       "source_step": hyper.Real(0, open_low=True),
                       "source_step_convergence": hyper.Real(0, open_low=True),
                       "step_adaptation": hyper.Real(1, open_low=True), "update_stats_every_k": hyper.Whole(1)}

    def __init__(self, *, max_queries: int = 20000, schedule: str = "trust_region", candidates: int = 20,
                 spherical_step: float = 1e-2, source_step: float = 1e-2, source_step_convergence: float = 1e-7,
                 step_adaptation: float = 1.5, update_stats_every_k: int = 10, init_tries: int = 100,
                 checkpoints: Sequence[int] = CHECKPOINTS, seed: int = 0) -> None:
        self.set_hyperparameters(locals())

    def run(self, oracle: DecisionOracle, x: torch.Tensor, y: torch.Tensor, *, eps: torch.Tensor, norm: str,
            target: torch.Tensor | None, sample_id: torch.Tensor) -> AttackResult:
        log, start, on_boundary, active = self.start_on_boundary(oracle, x, y, target, eps, norm, sample_id)
        if self.schedule == "paper":
            self._paper(log, x, on_boundary, active, sample_id, oracle.bounds)
        else:  # ART's: from the adversarial draw itself, whose far side the first source steps cross fast
            self._trust_region(log, x, start, active, sample_id, oracle.bounds)
        return log.result()

    def _adapted(self, value: torch.Tensor, ratio: torch.Tensor) -> torch.Tensor:
        """`value` ÷ `step_adaptation` where the success ratio is below 0.2, × where above 0.5."""
        a = self.step_adaptation
        return value * torch.where(ratio < 0.2, 1 / a, torch.where(ratio > 0.5, a, 1.0)).to(value.dtype)

    def _trust_region(self, log: QueryLog, x: torch.Tensor, cur: torch.Tensor, active: torch.Tensor,
                      sample_id: torch.Tensor, bounds: tuple[float, float]) -> None:
        """ART's schedule: per round, a volley of the sample's current stage (see the class)."""
        n, k, shape = x.shape[0], self.candidates, tuple(x.shape[1:])
        sph = torch.full((n,), self.spherical_step, dtype=x.dtype, device=x.device)
        src = torch.full((n,), self.source_step, dtype=x.dtype, device=x.device)
        pool = x.new_zeros((n, k, *shape))  # a sample's orthogonal candidates in its source stage
        pool_ok = torch.zeros((n, k), dtype=torch.bool, device=x.device)
        orthogonal = torch.ones(n, dtype=torch.bool, device=x.device)
        rnd = 0
        while True:
            active = log.affordable(active[src[active] >= self.source_step_convergence])
            if active.numel() == 0:
                break
            rnd += 1
            o, s = active[orthogonal[active]], active[~orthogonal[active]]
            eta = normal(self.seed, sample_id[o], (k, *shape), rnd, device=x.device, dtype=x.dtype).flatten(0, 1)
            wide = o.repeat_interleave(k)
            draws = orthogonal_step(x[wide].flatten(1), cur[wide].flatten(1), eta.flatten(1), sph[wide], bounds)
            moved = pool[s] + src[s].reshape(-1, 1, *[1] * len(shape)) * (x[s, None] - pool[s])
            cand = torch.cat([draws.reshape(-1, k, *shape), moved])
            owner = torch.cat([o, s])
            valid = torch.cat([torch.ones((o.numel(), k), dtype=torch.bool, device=x.device), pool_ok[s]])
            use = valid & (valid.cumsum(1) <= log.left(owner)[:, None])
            hit = torch.zeros_like(use)
            hit[use] = log.adversarial(cand[use], owner[:, None].expand(-1, k)[use])
            ratio = hit.sum(1) / use.sum(1).clamp_min(1)
            found = hit.any(1)
            m = o.numel()
            sph[o] = self._adapted(sph[o], ratio[:m])
            src[s] = self._adapted(src[s], ratio[m:]).clamp(max=1)
            ready = o[found[:m]]
            pool[ready], pool_ok[ready], orthogonal[ready] = cand[:m][found[:m]], hit[:m][found[:m]], False
            dist = torch.where(hit[m:], L2_NORM.size(moved.flatten(0, 1) - x[s].repeat_interleave(k, 0)).reshape(-1, k),
                               torch.inf)
            won = found[m:]
            best = moved[won, dist[won].argmin(1)]
            cur[s[won]], orthogonal[s[won]] = best, True
            log.offer(s[won], best, torch.ones_like(s[won], dtype=torch.bool))

    def _paper(self, log: QueryLog, x: torch.Tensor, cur: torch.Tensor, active: torch.Tensor,
               sample_id: torch.Tensor, bounds: tuple[float, float]) -> None:
        """The reference schedule: one candidate a step, windowed adaptation (see the class)."""
        n = x.shape[0]
        sph = torch.full((n,), self.spherical_step, dtype=x.dtype, device=x.device)
        source = torch.full((n,), self.source_step, dtype=x.dtype, device=x.device)
        stats_sph, stats_step = Window(n, 100, x.device), Window(n, 30, x.device)
        step = 0
        while True:
            active = log.affordable(active[source[active] >= self.source_step_convergence])
            if active.numel() == 0:
                break
            step += 1
            cand, on_sphere = self._proposals(x[active], cur[active], sph[active], source[active],
                                              sample_id[active], step, bounds)
            adv = log.adversarial(cand, active)
            closer = L2_NORM.size(cand - x[active]) < L2_NORM.size(cur[active] - x[active])
            better = adv & closer
            cur[active[better]] = cand[better]
            log.offer(active, cand, better)
            if step % self.update_stats_every_k == 0:
                self._adapt(log, active, on_sphere, adv, sph, source, stats_sph, stats_step)

    def _proposals(self, x: torch.Tensor, cur: torch.Tensor, step_sph: torch.Tensor, source: torch.Tensor,
                   sample_id: torch.Tensor, step: int,
                   bounds: tuple[float, float]) -> tuple[torch.Tensor, torch.Tensor]:
        """(candidate, orthogonal candidate) per row, as the reference draws them (per-sample noise)."""
        shape = x.shape
        xf, cf = x.flatten(1), cur.flatten(1)
        eta = normal(self.seed, sample_id, (xf.shape[1],), step, device=x.device, dtype=x.dtype)
        sph = orthogonal_step(xf, cf, eta, step_sph, bounds)
        src_norm = (xf - cf).norm(dim=1)
        new_src = xf - sph
        new_norm = new_src.norm(dim=1)
        length = (source * src_norm + new_norm - src_norm).clamp_min(0) / new_norm.clamp_min(1e-12)
        cand = (sph + length[:, None] * new_src).clamp(*bounds)
        return cand.reshape(shape), sph.reshape(shape)

    def _adapt(self, log: QueryLog, active: torch.Tensor, sph: torch.Tensor, adv: torch.Tensor,
               spherical: torch.Tensor, source: torch.Tensor, stats_sph: Window, stats_step: Window) -> None:
        """Judge the orthogonal candidates of the samples with a query left and adapt their steps."""
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
