"""Score-based attacks: they see logits only (a ScoreOracle) and are budgeted in queries.

Square (Andriushchenko et al. 2020) is random search over square-shaped updates, accepted
when they lower the margin loss. Every sample runs its own search, all in one tensor loop:
each step is ONE oracle call carrying one candidate for every active sample, and a sample
leaves the active set when it meets the goal or spends its query budget. Random numbers are
drawn per (seed, sample_id, step) (advbench.core.sample_draws), so a sample's search does not
depend on its batch. The ℓ∞ step, p's schedule and the block draws are `advbench.core.square_search`'s,
shared with the quality half's attack on metrics.

Strength is queries: `steps` is the query budget and `first_success` is the number of
queries a sample had spent (the start included) when its current iterate first met the goal.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache, partial
from typing import ClassVar

import torch

from advbench.core import hyperparameters as hyper
from advbench.core.errors import AdvbenchError
from advbench.core.norms import L1_NORM, L2_NORM, LINF, Norm
from advbench.core.norms import norm as norm_of
from advbench.core.sample_draws import rademacher, signs
from advbench.core.square_search import SquareDraws, linf_draws, linf_step, p_schedule, recoloured, window
from advbench.core.steps import clip, per_sample
from advbench.robustness.attacks.attack_contract import Attack, AttackResult
from advbench.robustness.attacks.minimum_norm import goal_margin
from advbench.robustness.attacks.oracles import ScoreOracle

_TINY = 1e-12


@dataclass(frozen=True)
class _BumpNorm:
    """What Square's bump search (ℓ2, and ℓ1 as Croce & Hein 2021 adapt it) does differently per norm:
    the bump's decay (weight 1/(k + 1)^`decay` on the k-th ring), the norm of each channel of each
    sample (`channels`: (n, c, h, w) to (n, c, 1, 1)), the mass a channel's new bump gets (`mass`: ε,
    ‖δ‖, the channel's norm on both squares, channels), and how a moved δ is put back into the ball
    (`finish`)."""

    ball: Norm
    decay: int
    channels: Callable[[torch.Tensor], torch.Tensor]
    mass: Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]
    finish: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, tuple[float, float]], torch.Tensor]


def _rectangle(rows: int, cols: int, bump: _BumpNorm) -> torch.Tensor:
    """The authors' centred pseudo-Gaussian bump on a rows × cols rectangle, unit norm."""
    out = torch.zeros(rows, cols, dtype=torch.float64)
    rc, cc = rows // 2, cols // 2
    for k in range(max(rows // 2 + 1, cols // 2 + 1)):
        out[max(rc - k, 0):rc + k + 1, max(cc - k, 0):cc + k + 1] += 1.0 / (k + 1) ** bump.decay
    return out / bump.ball.size(out[None]).clamp_min(_TINY)


@lru_cache(maxsize=64)
def eta(s: int, bump: _BumpNorm) -> torch.Tensor:
    """The update pattern: two bumps of opposite sign on the halves of an s × s square, unit norm."""
    out = torch.zeros(s, s, dtype=torch.float64)
    out[:s // 2] = _rectangle(s // 2, s, bump) if s // 2 else out[:0]
    out[s // 2:] = -_rectangle(s - s // 2, s, bump)
    return out / bump.ball.size(out[None])


def _place(pattern: torch.Tensor, h: int, w: int, top: torch.Tensor, left: torch.Tensor,
           transpose: torch.Tensor) -> torch.Tensor:
    """(n, 1, h, w): an s × s pattern put at per-sample corners (zero elsewhere), transposed where asked."""
    s = pattern.shape[0]
    r = torch.arange(h, device=top.device)[None, :] - top[:, None]      # (n, h) row inside the square
    c = torch.arange(w, device=top.device)[None, :] - left[:, None]     # (n, w)
    inside = ((r >= 0) & (r < s))[:, :, None] & ((c >= 0) & (c < s))[:, None, :]
    r, c = r.clamp(0, s - 1)[:, :, None], c.clamp(0, s - 1)[:, None, :]
    t = transpose[:, None, None]
    values = pattern.to(top.device)[torch.where(t, c, r), torch.where(t, r, c)]
    return (values * inside)[:, None]


def _corner(u: torch.Tensor, span: int) -> torch.Tensor:
    """Integer corners in [0, span) from uniforms (the authors' randint(0, h − s))."""
    return (u * span).long().clamp(max=span - 1)


WHOLE_BUDGET = "whole-budget"
"""`Attack.revision` of the attacks whose last, smaller step (`ScoreAttack.step_sizes`) spends what
full steps leave of the budget: records written before it stop short of the budget."""


class ScoreAttack(Attack):
    """What the score-based attacks share: logits only, and `n_queries` per sample as the
    strength budget (`first_success` counts queries)."""

    knowledge = ("score",)
    n_queries: int

    @property
    def strength_budget(self) -> int:
        """Queries per sample: `n_queries`."""
        return self.n_queries

    steps = strength_budget  # the name the budget had first

    def step_sizes(self, size: int, per_size: int) -> list[int]:
        """The size of each step (direction pairs, draws, coordinates) when a step of size s costs
        per_size·s + 1 queries: `size` while such a step fits the budget left after the clean
        check, then one of the largest size what is left pays for (none below 1), so a sample
        that survives spends all of `n_queries` but at most `per_size` of them."""
        full, rest = divmod(self.n_queries - 1, per_size * size + 1)
        last = (rest - 1) // per_size
        return [size] * full + ([last] if last >= 1 else [])


class Square(ScoreAttack):
    """Square attack, ℓ∞, ℓ2 and ℓ1, with the authors' p schedule and starts.

    The loss is the margin `goal_margin` (Z_y − max_{i≠y} Z_i; targeted max_{i≠t} Z_i − Z_t).

    ℓ∞: start from vertical stripes of ±ε, then each step recolours one random square (side
    √(p·h·w), one ±ε per channel) and keeps it if the margin drops. ℓ2: start from a grid of
    ±pseudo-Gaussian bumps rescaled to ε; each step moves mass from a second square into a
    new bump on the first, keeping ‖δ‖₂ = ε. ℓ1 (Croce & Hein 2021's, AutoAttack's ℓ1 member): the
    ℓ2 search with sharper bumps, each start and step projected exactly onto the ε-ball within the
    box (`BUMPS`). `n_queries` counts the start's query too, so the
    oracle's per-sample count never exceeds it. The default 20,000 is the seed's budget for
    every score-based attack (one strength axis for all); Square's own papers and peers use
    5,000 (attack.params.n_queries=5000), and p's schedule scales with the budget.
    """

    norms = ("linf", "l2", "l1")
    hyperparameters = {"n_queries": hyper.Whole(1), "p_init": hyper.Real(0, 1, open_low=True),
                       "seed": hyper.Whole(None)}
    rescaled_schedule: ClassVar[bool] = True
    """Whether p's schedule stretches over `n_queries` (the authors' Square) or keeps its
    10,000-query steps (AutoAttack's member, `resc_schedule=False`)."""

    def __init__(self, *, n_queries: int = 20000, p_init: float = 0.8, seed: int = 0) -> None:
        self.set_hyperparameters(locals())

    def run(self, oracle: ScoreOracle, x: torch.Tensor, y: torch.Tensor, *, eps: torch.Tensor, norm: str,
            target: torch.Tensor | None, sample_id: torch.Tensor) -> AttackResult:
        if x.dim() != 4:
            raise AdvbenchError(f"Square attacks images (N, C, H, W), got inputs of shape {tuple(x.shape)}")
        n = x.shape[0]
        everyone = torch.arange(n, device=x.device)
        start = self._start(x, eps, norm, oracle.bounds, sample_id)
        logits = oracle.logits(start, everyone)
        x_best = start
        loss = goal_margin(logits, y, target)
        first = torch.where(oracle.verdict(start, y, target, everyone, logits), 1, -1)
        rows = everyone[first < 0]
        linf = norm_of(norm) is LINF
        step = self._linf_step if linf else partial(self._bump_step, BUMPS[norm_of(norm)])
        draws = linf_draws(self.seed, sample_id, x, self.n_queries - 1) if linf else \
            SquareDraws(self.seed, sample_id, 5, (x.shape[1], 1, 1), x, self.n_queries - 1, lambda u: signs(u, x))
        # The searching samples' state, compact (rows of the batch: `rows`); written back when they stop.
        # `ref` is what a step builds on besides the best iterate: ℓ∞ the recoloured images x ± ε,
        # fixed per sample, so made once and not every step; ℓ2 x.
        xb, ya, ea, la, fa = (v[rows] for v in (x_best, y, eps, loss, first))
        ref = recoloured(x[rows], ea, oracle.bounds) if linf else x[rows]
        ta = None if target is None else target[rows]
        for t in range(1, self.n_queries):
            if rows.numel() == 0:
                break
            p = p_schedule(self.p_init, t - 1, self.n_queries if self.rescaled_schedule else None)
            cand = step(ref, xb, ea, p, oracle.bounds, *draws.at(t, rows))
            logits = oracle.logits(cand, rows)
            new = goal_margin(logits, ya, ta)
            hit = oracle.verdict(cand, ya, ta, rows, logits, undated=fa < 0)
            better = (new < la) | hit
            xb = torch.where(per_sample(better, xb), cand, xb)
            la = torch.where(better, new, la)
            fa = torch.where(hit & (fa < 0), t + 1, fa)
            if oracle.stops_on_hit and bool(hit.any()):
                x_best[rows], first[rows] = xb, fa
                keep = ~hit
                rows, ref, xb, ya, ea, la, fa = (v[keep] for v in (rows, ref, xb, ya, ea, la, fa))
                ta = None if ta is None else ta[keep]
                draws.keep(keep)
        x_best[rows], first[rows] = xb, fa
        return AttackResult(x_adv=x_best, success=first >= 0, first_success=first)

    def _start(self, x: torch.Tensor, eps: torch.Tensor, norm: str, bounds: tuple[float, float],
               sample_id: torch.Tensor) -> torch.Tensor:
        """ℓ∞: vertical stripes of ±ε per channel and column. ℓ2: a grid of ±bumps of side h//5, norm ε;
        ℓ1: the same grid projected onto the ε-ball within the box, as the original's."""
        n, c, h, w = x.shape
        if norm_of(norm) is LINF:
            sign = rademacher(self.seed, sample_id, (c, 1, w), 0, x)
            return clip(x + sign * per_sample(eps, x), bounds)
        s = max(h // 5, 1)
        offset = (h - 5 * s) // 2 if h >= 5 else 0
        grid = [(offset + a * s, offset + b * s) for a in range(h // s) for b in range(w // s)]
        signs = rademacher(self.seed, sample_id, (c, len(grid)), 0, x)
        delta = torch.zeros_like(x)
        bump = eta(s, BUMPS[norm_of(norm)]).to(x)
        for k, (i, j) in enumerate(grid):
            block = bump[:min(s, h - i), :min(s, w - j)]
            delta[:, :, i:i + s, j:j + s] += block * signs[:, :, k, None, None]
        return BUMPS[norm_of(norm)].finish(x, delta, eps, bounds)

    @staticmethod
    def _linf_step(moved: torch.Tensor, x_best: torch.Tensor, eps: torch.Tensor, p: float,
                   bounds: tuple[float, float], u: torch.Tensor, minus: torch.Tensor) -> torch.Tensor:
        """`advbench.core.square_search.linf_step` in the ℓ2 step's signature (ε and the box are in `moved`)."""
        return linf_step(moved, x_best, p, u, minus)

    @staticmethod
    def _bump_step(bump: _BumpNorm, x: torch.Tensor, x_best: torch.Tensor, eps: torch.Tensor, p: float,
                   bounds: tuple[float, float], u: torch.Tensor, sign: torch.Tensor) -> torch.Tensor:
        """Move the mass of squares 1 and 2 into a new bump (random `sign` per channel) on square 1.

        `u`: two corners and the transpose coin; `sign` (m, c, 1, 1). Norms are each channel's on
        the squares, the new bump's mass `bump.mass`'s.
        """
        _, c, h, w = x.shape
        s = min(max(round(math.sqrt(p * h * w)), 3), h - 1)
        s += 1 if s % 2 == 0 and s + 1 < h else 0
        mask1 = window(u[:, 0], u[:, 2], s, h, w)                 # u: both squares' rows, columns, a coin
        both = mask1 | window(u[:, 1], u[:, 3], s, h, w)
        pattern = _place(eta(s, bump), h, w, _corner(u[:, 0], h - s), _corner(u[:, 2], w - s), u[:, 4] < 0.5).to(x)
        delta = x_best - x
        used = per_sample(bump.ball.size(delta), x)
        new = pattern * sign + delta * mask1 / (bump.channels(delta * mask1) + _TINY)
        new = new / (bump.channels(new) + _TINY) * bump.mass(per_sample(eps, x), used, bump.channels(delta * both), c)
        delta = delta * ~both + new * mask1
        return bump.finish(x, delta, eps, bounds)


class AutoAttackSquare(Square):
    """Square as AutoAttack runs it: p's schedule is not stretched to the budget (the original's
    `resc_schedule=False`), so at its 5,000 iterations p has halved six times, not nine. Its
    `n_queries` counts the start's query too: AutoAttack's 5,000 iterations are 5,001 queries."""

    rescaled_schedule = False


def _to_radius(delta: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
    """δ rescaled to ℓ2 norm ε per sample (the authors keep Square's ℓ2 iterates on the sphere)."""
    return delta / per_sample(L2_NORM.size(delta).clamp_min(_TINY), delta) * per_sample(eps, delta)


BUMPS = {
    L2_NORM: _BumpNorm(L2_NORM, 2, lambda v: v.square().sum(dim=(2, 3), keepdim=True).sqrt(),
                       lambda eps, used, both, c: ((eps.square() - used.square()).clamp_min(0) / c + both.square()).sqrt(),
                       lambda x, delta, eps, bounds: clip(x + _to_radius(delta, eps), bounds)),
    L1_NORM: _BumpNorm(L1_NORM, 4, lambda v: v.abs().sum(dim=(2, 3), keepdim=True),
                       lambda eps, used, both, c: ((eps - used).clamp_min(0) / c + both) * c,
                       lambda x, delta, eps, bounds: L1_NORM.project(x + delta, x, eps, bounds)),
}
"""Square's bump search per norm. ℓ2: the authors' (Andriushchenko et al. 2020), iterates on the
sphere. ℓ1: Croce & Hein's (ICML 2021, the original AutoAttack's `square.py` with norm='L1'): bumps
decaying as 1/(k + 1)^4, each channel's new bump given the free budget's share plus what the two
squares held, times the channels (as the original does), then the exact projection onto the ε-ball
within the box (`L1.project`), which takes the excess back."""
