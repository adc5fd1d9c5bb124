"""ZOO (Chen et al. 2017): C&W's ℓ2 objective optimised from logits alone, one coordinate batch at a time.

The objective is the seed's Eq. 8, ‖x' − x‖₂² + c·max(margin(x') + κ, 0) with the margin
`goal_margin`; each step estimates its partial derivatives on a random batch of coordinates
by symmetric finite differences (the seed's Eq. 9, σ = 1e-4) and moves those coordinates by
coordinate-wise Adam. The perturbation lives in pixel space and is projected into the input
range after each update (the authors' setting for MNIST, where their tanh variable stalls on
saturated pixels, and the seed's x + σe_i).

Batched across samples: every active sample's 2B probes travel in ONE oracle call, then its
new iterate in a second one that decides whether it is adversarial. All per-sample state
(perturbation, Adam moments and per-coordinate step counts, c and its search bracket) lives in
tensors, and coordinates are drawn from (seed, sample_id, step), so a sample's run does not
depend on its batch. Strength is queries (`ScoreAttack`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from advbench.core import hyperparameters as hyper
from advbench.core.sample_draws import uniform
from advbench.core.steps import adam_step, clip
from advbench.robustness.attacks.attack_contract import AttackResult, success_of
from advbench.robustness.attacks.carlini_wagner import next_const
from advbench.robustness.attacks.minimum_norm import goal_margin
from advbench.robustness.attacks.oracles import ScoreOracle
from advbench.robustness.attacks.queries import CHECKPOINTS, QueryLog
from advbench.robustness.attacks.score import WHOLE_BUDGET, ScoreAttack


class ZOO(ScoreAttack):
    """ZOO-ADAM, minimum-norm ℓ2 from scores.

    Per step and active sample: `coordinates` distinct coordinates (all of them when the input
    has fewer), drawn uniformly; 2·B probes x + δ ± σe_i (clipped to bounds) whose objective
    values give ĝ_i = (L(δ + σe_i) − L(δ − σe_i))/(2σ); Adam (β1, β2, per-coordinate step
    counts as the authors) on those coordinates; δ projected so x + δ stays in bounds; one
    query of x + δ, kept when it meets the goal with margin ≤ −κ and is the smallest so far.

    c follows C&W's per-sample search (`next_const`): an optimisation at one c ends after
    `iterations` steps or when its loss fell by less than 0.01% over `abort_every` steps (the
    authors' early stop), then restarts from δ = 0 with fresh moments at the next c, at most
    `binary_search_steps` times. A step costs 2B + 1 queries, after one query of the clean
    input; steps of B coordinates run while they fit `n_queries`, then one last step on fewer
    coordinates spends what is left (`schedule`), so the oracle's count never exceeds the
    budget and a sample that survives leaves at most two queries of it unused.
    `first_success` is the queries spent when the best example first fell within ε;
    `info["norm_at_<q>"]` holds the best norm after q queries for each of `checkpoints` and the
    budget (HopSkipJump's `QueryLog`), so accuracy vs queries at any ε comes from one run.
    Probes hold 2B·d numbers per active sample: large inputs want smaller batches.
    """

    revision = WHOLE_BUDGET

    kind = "minimizing"
    norms = ("l2",)
    hyperparameters = {"n_queries": hyper.Whole(1), "coordinates": hyper.Whole(1), "lr": hyper.Real(0, open_low=True),
                       "sigma": hyper.Real(0, open_low=True), "initial_const": hyper.Real(0, open_low=True),
                       "binary_search_steps": hyper.Whole(1), "iterations": hyper.Whole(1),
                       "abort_every": hyper.Whole(1), "adam_beta1": hyper.Real(0, 1, open_high=True),
                       "adam_beta2": hyper.Real(0, 1, open_high=True), "confidence": hyper.Real(0),
                       "checkpoints": hyper.Wholes(1), "seed": hyper.Whole(None)}

    def __init__(self, *, n_queries: int = 20000, coordinates: int = 128, lr: float = 0.01, sigma: float = 1e-4,
                 initial_const: float = 0.5, binary_search_steps: int = 1, iterations: int = 10000,
                 abort_every: int = 100, adam_beta1: float = 0.9, adam_beta2: float = 0.999,
                 confidence: float = 0.0, checkpoints: Sequence[int] = CHECKPOINTS,
                 seed: int = 0) -> None:
        self.set_hyperparameters(locals())

    def schedule(self, d: int) -> list[int]:
        """Coordinates of each step (2B + 1 queries) on inputs of d numbers: B = `coordinates` (all d
        when fewer) while a step fits, then the rest's."""
        return self.step_sizes(min(self.coordinates, d), 2)

    def run(self, oracle: ScoreOracle, x: torch.Tensor, y: torch.Tensor, *, eps: torch.Tensor, norm: str,
            target: torch.Tensor | None, sample_id: torch.Tensor) -> AttackResult:
        n, d = x.shape[0], x[0].numel()
        everyone = torch.arange(n, device=x.device)
        log = QueryLog(oracle, x, y, target, eps, norm, self.n_queries, self.checkpoints)
        already = self._adversarial(oracle.logits(x, everyone), y, target)
        log.offer(everyone, x, already)
        flat = x.flatten(1)
        lo, hi = oracle.bounds[0] - flat, oracle.bounds[1] - flat          # δ's box: x + δ in bounds
        delta = torch.zeros_like(flat)
        m, v = torch.zeros_like(flat), torch.zeros_like(flat)
        epoch = torch.ones_like(flat)                                       # Adam steps per coordinate
        const = torch.full((n,), self.initial_const, dtype=torch.float64, device=x.device)
        c_lo, c_hi = torch.zeros_like(const), torch.full_like(const, math.inf)
        found = torch.zeros(n, dtype=torch.bool, device=x.device)
        prev = torch.full((n,), math.inf, dtype=torch.float64, device=x.device)
        steps_at_c = torch.zeros(n, dtype=torch.long, device=x.device)
        searches = torch.zeros(n, dtype=torch.long, device=x.device)
        active = everyone[~already]  # an input already adversarial has norm 0: nothing to improve
        for t, b in enumerate(self.schedule(d)):
            if active.numel() == 0:
                break
            ya, ta, c = y[active], None if target is None else target[active], const[active]
            coords = uniform(self.seed, sample_id[active], (d,), t, device=x.device).argsort(dim=1)[:, :b]
            grad = self._coordinate_grad(oracle, x[active], delta[active], coords, ya, ta, c, active)
            rows = active[:, None]
            ms, vs, es = m[rows, coords], v[rows, coords], epoch[rows, coords]
            step = adam_step(grad.to(x.dtype), ms, vs, es, self.lr, (self.adam_beta1, self.adam_beta2))
            moved = torch.minimum(torch.maximum(delta[rows, coords] - step, lo[rows, coords]), hi[rows, coords])
            delta[rows, coords], m[rows, coords], v[rows, coords], epoch[rows, coords] = moved, ms, vs, es + 1
            xa = clip(x[active] + delta[active].view_as(x[active]), oracle.bounds)
            logits = oracle.logits(xa, active)
            adv = self._adversarial(logits, ya, ta)
            log.offer(active, xa, adv)
            found[active] |= adv
            loss = self._objective(logits, xa, x[active], ya, ta, c)
            steps_at_c[active] += 1
            check = steps_at_c[active] % self.abort_every == 0
            stalled = check & (loss > 0.9999 * prev[active])
            prev[active] = torch.where(check, loss, prev[active])
            done = stalled | (steps_at_c[active] >= self.iterations)
            if done.any():
                ended = active[done]
                const[ended], c_lo[ended], c_hi[ended] = next_const(const[ended], c_lo[ended], c_hi[ended],
                                                                   found[ended])
                for state in (delta, m, v):
                    state[ended] = 0
                epoch[ended], found[ended], prev[ended], steps_at_c[ended] = 1, False, math.inf, 0
                searches[ended] += 1
                active = active[searches[active] < self.binary_search_steps]
        return log.result()

    def _coordinate_grad(self, oracle: ScoreOracle, x: torch.Tensor, delta: torch.Tensor, coords: torch.Tensor,
                         y: torch.Tensor, target: torch.Tensor | None, const: torch.Tensor,
                         idx: torch.Tensor) -> torch.Tensor:
        """(m, B) symmetric differences of the objective along each sample's coordinates, one oracle call."""
        k, b = coords.shape
        rows = 2 * b
        bump = torch.zeros(k, b, delta.shape[1], dtype=x.dtype, device=x.device)
        bump.scatter_(2, coords[:, :, None], self.sigma)
        probes = delta[:, None, None] + torch.stack([bump, -bump], dim=1)             # (m, 2, B, d)
        images = clip(x.flatten(1)[:, None, None] + probes, oracle.bounds).view(k * rows, *x.shape[1:])
        logits = oracle.logits(images, idx.repeat_interleave(rows))
        expand = lambda v: None if v is None else v.repeat_interleave(rows)  # noqa: E731
        loss = self._objective(logits, images, x.repeat_interleave(rows, dim=0), expand(y), expand(target),
                               expand(const)).view(k, 2, b)
        return (loss[:, 0] - loss[:, 1]) / (2 * self.sigma)

    def _objective(self, logits: torch.Tensor, x_adv: torch.Tensor, x: torch.Tensor, y: torch.Tensor,
                   target: torch.Tensor | None, const: torch.Tensor) -> torch.Tensor:
        """The seed's Eq. 8 per row, in float64 so that σ-sized differences survive the sum."""
        dist = (x_adv.double() - x.double()).flatten(1).square().sum(dim=1)
        return dist + const * (goal_margin(logits.double(), y, target) + self.confidence).clamp_min(0)

    def _adversarial(self, logits: torch.Tensor, y: torch.Tensor, target: torch.Tensor | None) -> torch.Tensor:
        return success_of(logits, y, target) & (goal_margin(logits, y, target) <= -self.confidence)
