"""NES and SPSA (Ilyas et al. 2018; Uesato et al. 2018): the loss gradient estimated from queries
of a score oracle along random directions, followed by signed (ℓ∞) or normalised (ℓ2) steps.

How far they can get: a step moves an iterate at most α from the last (a sign step's every
coordinate, an ℓ2 step's norm), so k steps reach at most k·α = k·rel_stepsize·ε from x. Where
the query budget buys too few steps for that to be ε (1,000 queries: 5 steps of the seed's
0.15·ε, 0.75·ε), the accuracy reported at ε is robustness at a smaller radius, and the first
call says so (`reach_shortfall`). The seed's α stays: its 20,000 queries buy 100 steps.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch

from advbench.core import hyperparameters as hyper
from advbench.core.resume import warn
from advbench.core.sample_draws import normal, rademacher
from advbench.core.steps import ascend, clip, unit_direction
from advbench.robustness.attacks.attack_contract import AttackResult
from advbench.robustness.attacks.minimum_norm import goal_margin
from advbench.robustness.attacks.oracles import ScoreOracle
from advbench.robustness.attacks.score import WHOLE_BUDGET, ScoreAttack


def _gaussian(seed: int, sample_id: torch.Tensor, shape: tuple[int, ...], stream: int, like: torch.Tensor) -> torch.Tensor:
    return normal(seed, sample_id, shape, stream, device=like.device, dtype=like.dtype)


DIRECTIONS = {"gaussian": _gaussian, "rademacher": rademacher}
"""Samplers of the random directions u_i of the gradient estimate, per (seed, sample_id, step)."""


class GradientEstimateAttack(ScoreAttack):
    """BIM on an estimated gradient (the seed's Eq. 10): ĝ = 1/q Σ_i [J(x+σu_i) − J(x−σu_i)]/(2σ)·u_i.

    J is the margin `goal_margin`, descended: x ← Π_ε(x − α·dir(ĝ)), α = rel_stepsize·ε (the
    seed's 0.15). A step costs 2q + 1 queries per sample: the 2q probes (clipped to bounds) in
    one oracle call for all active samples, then one query of the new iterate, which decides
    success. One first query checks the clean input. Steps of q = `samples` run while they fit
    the budget, then one last step on fewer pairs spends what is left (`schedule`), so a sample
    that survives uses all of `n_queries` but at most two; a sample stops at success, and
    `first_success` is the queries spent at the succeeding check. The full steps do not depend
    on the budget, so a run dates the success of every shorter run whose budget ends a full
    step; a shorter budget that does not may break more (its last step is its own).
    Probes hold q·d numbers per active sample: large inputs want smaller batches.

    k steps reach at most k·rel_stepsize·ε from x: where the budget buys too few for ε, the first
    call warns, once per attack object (`reach_shortfall`).
    """

    revision = WHOLE_BUDGET

    directions: ClassVar[str]
    hyperparameters = {"n_queries": hyper.Whole(1), "samples": hyper.Whole(1), "sigma": hyper.Real(0, open_low=True),
                       "rel_stepsize": hyper.Real(0, open_low=True), "seed": hyper.Whole(None)}

    def __init__(self, *, n_queries: int = 20000, samples: int = 100, sigma: float = 0.001,
                 rel_stepsize: float = 0.15, seed: int = 0) -> None:
        self.set_hyperparameters(locals())
        self._reach_told = False

    def schedule(self) -> list[int]:
        """Direction pairs of each step (2q + 1 queries): `samples` while they fit, then the rest's."""
        return self.step_sizes(self.samples, 2)

    def reach(self) -> float:
        """The farthest a surviving sample's iterate can get from x, in units of ε: steps × rel_stepsize."""
        return len(self.schedule()) * self.rel_stepsize

    def short_of_budget(self) -> str | None:
        """Why this attack cannot reach the ε budget within `n_queries` (one line); None if it can."""
        return reach_shortfall(type(self).__name__, len(self.schedule()), self.rel_stepsize, self.samples,
                               self.n_queries)

    def run(self, oracle: ScoreOracle, x: torch.Tensor, y: torch.Tensor, *, eps: torch.Tensor, norm: str,
            target: torch.Tensor | None, sample_id: torch.Tensor) -> AttackResult:
        if not self._reach_told:
            self._reach_told = True
            why = self.short_of_budget()
            if why is not None:
                warn(why)
        everyone = torch.arange(x.shape[0], device=x.device)
        first = torch.where(oracle.verdict(x, y, target, everyone), 1, -1)
        x_adv = x.clone()
        alpha = self.rel_stepsize * eps
        spent = 1
        active = everyone[first < 0]
        for t, q in enumerate(self.schedule()):
            if active.numel() == 0:
                break
            xa, m = x_adv[active], active.numel()
            ya, ta = y[active], None if target is None else target[active]
            u = DIRECTIONS[self.directions](self.seed, sample_id[active], (q, *x.shape[1:]), t, xa)
            probes = torch.cat([xa[:, None] + self.sigma * u, xa[:, None] - self.sigma * u], dim=1)
            rows = 2 * q
            z = oracle.logits(clip(probes.flatten(0, 1), oracle.bounds), active.repeat_interleave(rows))
            j = goal_margin(z, ya.repeat_interleave(rows), None if ta is None else ta.repeat_interleave(rows))
            j = j.view(m, 2, q)
            slope = (j[:, 0] - j[:, 1]) / (2 * self.sigma)                      # (m, q)
            grad = (slope.view(m, q, *([1] * (x.dim() - 1))) * u).mean(dim=1)
            xa = ascend(xa, x[active], unit_direction(-grad, norm), alpha[active], eps[active], norm, oracle.bounds)
            x_adv[active] = xa
            hit = oracle.verdict(xa, ya, ta, active, undated=first[active] < 0)
            spent += 2 * q + 1
            first[active[hit & (first[active] < 0)]] = spent
            if oracle.stops_on_hit:
                active = active[~hit]
        return AttackResult(x_adv=x_adv, success=first >= 0, first_success=first)


class NES(GradientEstimateAttack):
    """NES (Ilyas et al. 2018): Gaussian directions; the seed's q = 100, σ = 0.001."""

    directions = "gaussian"


class SPSA(GradientEstimateAttack):
    """SPSA (Uesato et al. 2018): Rademacher (±1) directions; the seed's q = 100, σ = 0.001."""

    directions = "rademacher"


def reach_shortfall(name: str, steps: int, rel_stepsize: float, samples: int, n_queries: int) -> str | None:
    """One line saying why `steps` of `rel_stepsize`·ε cannot reach ε, and what would; None if they do.

    A full step costs 2·samples + 1 queries (the direction pairs and the step's own query), plus
    one query for the start.
    """
    reach = steps * rel_stepsize
    if reach >= 1 - 1e-9:
        return None
    need = math.ceil(1 / rel_stepsize - 1e-9)          # steps that reach ε
    queries = 1 + need * (2 * samples + 1)             # as full steps
    alpha = f"α = {rel_stepsize:g}·ε"
    if steps == 0:
        return (f"{name}: no step fits n_queries={n_queries:,}, so its examples are the inputs themselves; "
                f"n_queries >= {queries:,} ({need} steps of {alpha}) reach the ε budget")
    rel = math.ceil(1000 / steps - 1e-6) / 1000
    return (f"{name}: n_queries={n_queries:,} buys {steps} steps of {alpha}, so its examples stay within "
            f"{reach:.3g}·ε of the input: the accuracy it reports at ε is robustness at a smaller radius; "
            f"n_queries >= {queries:,} ({need} full steps) or rel_stepsize >= {rel:g} reach the ε budget")
