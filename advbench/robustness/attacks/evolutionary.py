"""Evolutionary attack (Dong et al. 2019): decision-based, ℓ2, minimum norm, batched across samples.

A (1+1) evolution strategy on the distance to x, searched in a reduced space: each step mutates
the sample's current adversarial point with Gaussian noise drawn on a coarse grid (upsampled
bilinearly to the input size) whose diagonal covariance is adapted along the evolution path
of successful mutations, plus a step of relative size μ towards x. Every active sample's
candidate travels in one oracle call; all state (point, covariance, path, μ, success window)
is per sample and every draw comes from (seed, sample_id, step), so a sample's result does not
depend on its batch (untargeted; the targeted start is taken from the batch, see
`decision.starting_points`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from advbench.core import hyperparameters as hyper
from advbench.core.norms import L2_NORM
from advbench.core.sample_draws import normal, uniform
from advbench.core.steps import clip, per_sample
from advbench.robustness.attacks.attack_contract import AttackResult
from advbench.robustness.attacks.oracles import DecisionOracle
from advbench.robustness.attacks.queries import CHECKPOINTS, DecisionAttack, Window

_TINY = 1e-12


def weighted_choice(weights: torch.Tensor, k: int, u: torch.Tensor) -> torch.Tensor:
    """A (rows, m) mask of k coordinates per row drawn without replacement with probability
    proportional to `weights`, from the row's uniforms `u` (Efraimidis–Spirakis: the k smallest
    −log(u)/w), so each row's choice depends on its own draws only."""
    keys = -torch.log1p(-u) / weights.to(u.dtype)
    mask = torch.zeros_like(weights, dtype=torch.bool)
    return mask.scatter_(1, keys.topk(k, dim=1, largest=False).indices, True)


class Evolutionary(DecisionAttack):
    """Evolutionary attack (Dong, Su, Wu et al., CVPR 2019), ℓ2, with the authors' defaults.

    From an adversarial start (`starting_points`, then the blend search towards x), step t of
    a sample at point x̃ (distance d = ‖x − x̃‖):

    * draw k = max(1, ⌊coordinates·m⌋) of the m = C·h·w coordinates of the reduced space
      (h, w = `search_scale`·H, W) with probability ∝ the covariance diagonal c, and
      z ~ N(0, diag(c)) on them (zero elsewhere);
    * candidate = x̃ + μ(x − x̃) + σ·d·up(z)/‖up(z)‖ (up: bilinear upsampling), put back on the
      sphere of radius ‖x − (x̃ + μ(x − x̃))‖ around x and clipped, as the authors' code does:
      every candidate is closer than x̃, so an adversarial one replaces it;
    * on success, the evolution path p ← (1 − c_c)p + √(c_c(2 − c_c))·z and
      c ← (1 − c_cov)c + c_cov·p²;
    * the 1/5th success rule: after every `success_window` steps, μ ← μ·exp(rate − 1/5).

    A sample stops when its `max_queries` are spent; one query a step.
    """

    norms = ("l2",)
    hyperparameters = {**DecisionAttack.hyperparameters, "search_scale": hyper.Real(0, 1, open_low=True),
                       "coordinates": hyper.Real(0, 1, open_low=True), "mu": hyper.Real(0, open_low=True),
                       "sigma": hyper.Real(0, open_low=True), "c_c": hyper.Real(0, 1, open_low=True),
                       "c_cov": hyper.Real(0, 1, open_low=True), "success_window": hyper.Whole(1)}

    def __init__(self, *, max_queries: int = 20000, search_scale: float = 0.75, coordinates: float = 0.05,
                 mu: float = 0.01, sigma: float = 0.01, c_c: float = 0.01, c_cov: float = 0.001,
                 success_window: int = 30, init_tries: int = 100, checkpoints: Sequence[int] = CHECKPOINTS,
                 seed: int = 0) -> None:
        self.set_hyperparameters(locals())

    def run(self, oracle: DecisionOracle, x: torch.Tensor, y: torch.Tensor, *, eps: torch.Tensor, norm: str,
            target: torch.Tensor | None, sample_id: torch.Tensor) -> AttackResult:
        n, (ch, height, width) = x.shape[0], tuple(x.shape[1:])
        log, _, cur, active = self.start_on_boundary(oracle, x, y, target, eps, norm, sample_id)

        small = (ch, max(1, round(self.search_scale * height)), max(1, round(self.search_scale * width)))
        m = math.prod(small)
        k = max(1, int(self.coordinates * m))
        cov = torch.ones(n, m, dtype=x.dtype, device=x.device)
        path = torch.zeros(n, m, dtype=x.dtype, device=x.device)
        mu = torch.full((n,), self.mu, dtype=x.dtype, device=x.device)
        window = Window(n, self.success_window, x.device)
        step = 0
        while True:
            active = log.affordable(active)
            if active.numel() == 0:
                break
            step += 1
            sid = sample_id[active]
            chosen = weighted_choice(cov[active], k, uniform(self.seed, sid, (m,), step, device=x.device,
                                                            dtype=torch.float64))
            z = normal(self.seed, sid, (m,), step, device=x.device, dtype=x.dtype) * cov[active].sqrt() * chosen
            cand = self._candidate(x[active], cur[active], z.reshape(-1, *small), mu[active], oracle.bounds)
            adv = log.adversarial(cand, active)
            won = active[adv]
            cur[won] = cand[adv]
            log.offer(active, cand, adv)
            path[won] = (1 - self.c_c) * path[won] + math.sqrt(self.c_c * (2 - self.c_c)) * z[adv]
            cov[won] = (1 - self.c_cov) * cov[won] + self.c_cov * path[won] ** 2
            window.push(active, adv)
            full = active[window.full(active)]
            mu[full] *= torch.exp(window.mean(full) - 0.2).to(mu.dtype)
            window.clear(full)
        return log.result()

    def _candidate(self, x: torch.Tensor, cur: torch.Tensor, z: torch.Tensor, mu: torch.Tensor,
                   bounds: tuple[float, float]) -> torch.Tensor:
        """Each row's mutation of `cur`: μ towards x, the upsampled noise scaled to σ·distance, then
        back onto the sphere of the biased point's distance around x, clipped."""
        src = x - cur
        dist = L2_NORM.size(src)
        biased = cur + per_sample(mu, x) * src
        up = F.interpolate(z, size=tuple(x.shape[2:]), mode="bilinear", align_corners=False)
        up = up / per_sample(L2_NORM.size(up).clamp_min(_TINY), up)
        cand = biased + per_sample(self.sigma * dist, x) * up
        radius = L2_NORM.size(x - biased) / L2_NORM.size(x - cand).clamp_min(_TINY)
        return clip(x - (x - cand) * per_sample(radius, x), bounds)
