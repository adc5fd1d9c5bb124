"""Score-based attacks: they see logits only (a ScoreOracle) and are budgeted in queries.

Square (Andriushchenko et al. 2020) is random search over square-shaped updates, accepted
when they lower the margin loss. Every sample runs its own search, all in one tensor loop:
each step is ONE oracle call carrying one candidate for every active sample, and a sample
leaves the active set when it meets the goal or spends its query budget. Random numbers are
drawn per (seed, sample_id, step) (advbench.robustness.attacks.random), so a sample's search does not
depend on its batch.

Strength is queries: `steps` is the query budget and `first_success` is the number of
queries a sample had spent (the start included) when its current iterate first met the goal.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import ClassVar

import torch

from advbench.core.errors import AdvbenchError
from advbench.core.steps import ascend, clip, lp_norm, per_sample, unit_direction
from advbench.robustness.attacks.base import Attack, AttackResult
from advbench.robustness.attacks.optimized import goal_margin
from advbench.robustness.attacks.oracles import ScoreOracle
from advbench.robustness.attacks.random import normal, uniform

_TINY = 1e-12
_RESAMPLES = 16  # redraws of an ℓ∞ square whose colour would not change the image (authors: until it does)
_STREAMS = 2  # random streams per step: the squares' places, the colours


def p_schedule(p_init: float, it: int, n_queries: int) -> float:
    """The authors' schedule of the square's share of pixels, halved at fixed fractions of the budget."""
    it = int(it / n_queries * 10000)
    for bound, div in ((10, 1), (50, 2), (200, 4), (500, 8), (1000, 16), (2000, 32), (4000, 64),
                       (6000, 128), (8000, 256)):
        if it <= bound:
            return p_init / div
    return p_init / 512


def _rectangle(rows: int, cols: int) -> torch.Tensor:
    """The authors' centred pseudo-Gaussian bump on a rows × cols rectangle, unit ℓ2 norm."""
    out = torch.zeros(rows, cols, dtype=torch.float64)
    rc, cc = rows // 2, cols // 2
    for k in range(max(rows // 2 + 1, cols // 2 + 1)):
        out[max(rc - k, 0):rc + k + 1, max(cc - k, 0):cc + k + 1] += 1.0 / (k + 1) ** 2
    return out / out.norm().clamp_min(_TINY)


@lru_cache(maxsize=64)
def eta(s: int) -> torch.Tensor:
    """The ℓ2 update pattern: two bumps of opposite sign on the halves of an s × s square, unit norm."""
    out = torch.zeros(s, s, dtype=torch.float64)
    out[:s // 2] = _rectangle(s // 2, s) if s // 2 else out[:0]
    out[s // 2:] = -_rectangle(s - s // 2, s)
    return out / out.norm()


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


class ScoreAttack(Attack):
    """What the score-based attacks share: logits only, and `n_queries` per sample as the
    strength budget (`first_success` counts queries)."""

    knowledge = ("score",)
    n_queries: int

    @property
    def steps(self) -> int:
        """The strength budget: queries per sample."""
        return self.n_queries


class Square(ScoreAttack):
    """Square attack, ℓ∞ and ℓ2, with the authors' p schedule and starts.

    The loss is the margin `goal_margin` (Z_y − max_{i≠y} Z_i; targeted max_{i≠t} Z_i − Z_t).

    ℓ∞: start from vertical stripes of ±ε, then each step recolours one random square (side
    √(p·h·w), one ±ε per channel) and keeps it if the margin drops. ℓ2: start from a grid of
    ±pseudo-Gaussian bumps rescaled to ε; each step moves mass from a second square into a
    new bump on the first, keeping ‖δ‖₂ = ε. `n_queries` counts the start's query too, so the
    oracle's per-sample count never exceeds it. The default 20,000 is the seed's budget for
    every score-based attack (one strength axis for all); Square's own papers and peers use
    5,000 (attack.params.n_queries=5000), and p's schedule scales with the budget.
    """

    def __init__(self, *, n_queries: int = 20000, p_init: float = 0.8, seed: int = 0) -> None:
        if n_queries < 1:
            raise AdvbenchError(f"Square needs n_queries >= 1, got {n_queries}")
        if not 0 < p_init <= 1:
            raise AdvbenchError(f"Square needs p_init in (0, 1], got {p_init}")
        self.n_queries = n_queries
        self.p_init = p_init
        self.seed = seed

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
        active = everyone[first < 0]
        for t in range(1, self.n_queries):
            if active.numel() == 0:
                break
            xa, xb, ea, ids = x[active], x_best[active], eps[active], sample_id[active]
            p = p_schedule(self.p_init, t - 1, self.n_queries)
            step = self._linf_step if norm == "linf" else self._l2_step
            cand = step(xa, xb, ea, p, oracle.bounds, ids, t)
            logits = oracle.logits(cand, active)
            t_active = None if target is None else target[active]
            new = goal_margin(logits, y[active], t_active)
            hit = oracle.verdict(cand, y[active], t_active, active, logits, undated=first[active] < 0)
            better = (new < loss[active]) | hit
            x_best[active[better]] = cand[better]
            loss[active[better]] = new[better]
            first[active[hit & (first[active] < 0)]] = t + 1
            if oracle.stops_on_hit:
                active = active[~hit]
        return AttackResult(x_adv=x_best, success=first >= 0, first_success=first)

    def _start(self, x: torch.Tensor, eps: torch.Tensor, norm: str, bounds: tuple[float, float],
               sample_id: torch.Tensor) -> torch.Tensor:
        """ℓ∞: vertical stripes of ±ε per channel and column. ℓ2: a grid of ±bumps of side h//5, norm ε."""
        n, c, h, w = x.shape
        if norm == "linf":
            sign = self._signs(sample_id, (c, 1, w), 0, x)
            return clip(x + sign * per_sample(eps, x), bounds)
        s = max(h // 5, 1)
        offset = (h - 5 * s) // 2 if h >= 5 else 0
        grid = [(offset + a * s, offset + b * s) for a in range(h // s) for b in range(w // s)]
        signs = self._signs(sample_id, (c, len(grid)), 0, x)
        delta = torch.zeros_like(x)
        bump = eta(s).to(x)
        for k, (i, j) in enumerate(grid):
            block = bump[:min(s, h - i), :min(s, w - j)]
            delta[:, :, i:i + s, j:j + s] += block * signs[:, :, k, None, None]
        return clip(x + _to_radius(delta, eps), bounds)

    def _signs(self, sample_id: torch.Tensor, shape: tuple[int, ...], stream: int, like: torch.Tensor) -> torch.Tensor:
        u = uniform(self.seed, sample_id, shape, stream, device=like.device, dtype=like.dtype)
        return torch.where(u < 0.5, -1.0, 1.0).to(like)

    def _linf_step(self, x: torch.Tensor, x_best: torch.Tensor, eps: torch.Tensor, p: float,
                   bounds: tuple[float, float], sample_id: torch.Tensor, t: int) -> torch.Tensor:
        """Recolour one random square with ±ε per channel, redrawing colours that change nothing.

        All redraws are drawn at once; a colour leaves a channel unchanged iff its clipped value
        equals x_best over the square, so the first useful draw is picked without extra passes.
        """
        m, c, h, w = x.shape
        s = min(max(round(math.sqrt(p * h * w)), 1), h - 1)
        u = uniform(self.seed, sample_id, (2,), _STREAMS * t, device=x.device)
        top, left = _corner(u[:, 0], h - s), _corner(u[:, 1], w - s)
        inside = _place(torch.ones(s, s), h, w, top, left, torch.zeros_like(top, dtype=torch.bool)).bool()
        e = per_sample(eps, x)
        same = [((clip(x + sign * e, bounds) - x_best).abs() < 1e-7) | ~inside for sign in (1.0, -1.0)]
        same_plus, same_minus = (v.flatten(2).all(dim=2) for v in same)               # (m, c)
        signs = self._signs(sample_id, (_RESAMPLES, c), _STREAMS * t + 1, x)          # (m, R, c)
        idle = torch.where(signs > 0, same_plus[:, None], same_minus[:, None]).all(dim=2)  # (m, R)
        pick = torch.where(idle.all(dim=1), _RESAMPLES - 1, (~idle).long().argmax(dim=1))
        sign = signs[torch.arange(m, device=x.device), pick][:, :, None, None]
        return torch.where(inside, clip(x + sign * e, bounds), x_best)

    def _l2_step(self, x: torch.Tensor, x_best: torch.Tensor, eps: torch.Tensor, p: float,
                 bounds: tuple[float, float], sample_id: torch.Tensor, t: int) -> torch.Tensor:
        """Move the mass of squares 1 and 2 into a new bump (random sign per channel) on square 1."""
        m, c, h, w = x.shape
        s = min(max(round(math.sqrt(p * h * w)), 3), h - 1)
        s += 1 if s % 2 == 0 and s + 1 < h else 0
        u = uniform(self.seed, sample_id, (5,), _STREAMS * t, device=x.device)
        tops, lefts = _corner(u[:, :2], h - s), _corner(u[:, 2:4], w - s)
        transpose = u[:, 4] < 0.5
        ones = torch.ones(s, s)
        mask1 = _place(ones, h, w, tops[:, 0], lefts[:, 0], transpose)
        mask2 = _place(ones, h, w, tops[:, 1], lefts[:, 1], transpose)
        bump = _place(eta(s), h, w, tops[:, 0], lefts[:, 0], transpose).to(x)
        delta = x_best - x
        window_norm = (delta * mask1).square().sum(dim=(2, 3), keepdim=True).sqrt()
        both_norm = (delta * torch.maximum(mask1, mask2)).square().sum(dim=(2, 3), keepdim=True).sqrt()
        free = (per_sample(eps, x).square() - per_sample(lp_norm(delta, "l2"), x).square()).clamp_min(0)
        sign = self._signs(sample_id, (c, 1, 1), _STREAMS * t + 1, x)
        new = bump * sign + delta * mask1 / (window_norm + _TINY)
        new = new / (new.square().sum(dim=(2, 3), keepdim=True).sqrt() + _TINY) * (free / c + both_norm.square()).sqrt()
        delta = delta * (1 - torch.maximum(mask1, mask2)) + new * mask1
        return clip(x + _to_radius(delta, eps), bounds)


def _to_radius(delta: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
    """δ rescaled to ℓ2 norm ε per sample (the authors keep Square's ℓ2 iterates on the sphere)."""
    return delta / per_sample(lp_norm(delta, "l2").clamp_min(_TINY), delta) * per_sample(eps, delta)


def _gaussian(seed: int, sample_id: torch.Tensor, shape: tuple[int, ...], stream: int, like: torch.Tensor) -> torch.Tensor:
    return normal(seed, sample_id, shape, stream, device=like.device, dtype=like.dtype)


def _rademacher(seed: int, sample_id: torch.Tensor, shape: tuple[int, ...], stream: int, like: torch.Tensor) -> torch.Tensor:
    u = uniform(seed, sample_id, shape, stream, device=like.device, dtype=like.dtype)
    return torch.where(u < 0.5, -1.0, 1.0).to(like)


DIRECTIONS = {"gaussian": _gaussian, "rademacher": _rademacher}
"""Samplers of the random directions u_i of the gradient estimate, per (seed, sample_id, step)."""


class GradientEstimateAttack(ScoreAttack):
    """BIM on an estimated gradient (the seed's Eq. 10): ĝ = 1/q Σ_i [J(x+σu_i) − J(x−σu_i)]/(2σ)·u_i.

    J is the margin `goal_margin`, descended: x ← Π_ε(x − α·dir(ĝ)), α = rel_stepsize·ε (the
    seed's 0.15). A step costs 2q + 1 queries per sample: the 2q probes (clipped to bounds) in
    one oracle call for all active samples, then one query of the new iterate, which decides
    success. One first query checks the clean input. A sample stops at success or when another
    step would pass `n_queries`; `first_success` is the queries spent at the succeeding check.
    Probes hold q·d numbers per active sample: large inputs want smaller batches.
    """

    directions: ClassVar[str]

    def __init__(self, *, n_queries: int = 20000, samples: int = 100, sigma: float = 0.001,
                 rel_stepsize: float = 0.15, seed: int = 0) -> None:
        if n_queries < 1 or samples < 1:
            raise AdvbenchError(f"{type(self).__name__} needs n_queries >= 1 and samples >= 1, got {n_queries}, {samples}")
        if sigma <= 0 or rel_stepsize <= 0:
            raise AdvbenchError(f"{type(self).__name__} needs sigma > 0 and rel_stepsize > 0, got {sigma}, {rel_stepsize}")
        self.n_queries = n_queries
        self.samples = samples
        self.sigma = sigma
        self.rel_stepsize = rel_stepsize
        self.seed = seed

    def run(self, oracle: ScoreOracle, x: torch.Tensor, y: torch.Tensor, *, eps: torch.Tensor, norm: str,
            target: torch.Tensor | None, sample_id: torch.Tensor) -> AttackResult:
        n, q = x.shape[0], self.samples
        everyone = torch.arange(n, device=x.device)
        first = torch.where(oracle.verdict(x, y, target, everyone), 1, -1)
        x_adv = x.clone()
        alpha = self.rel_stepsize * eps
        cost = 2 * q + 1
        active = everyone[first < 0]
        for t in range((self.n_queries - 1) // cost):
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
            first[active[hit & (first[active] < 0)]] = 1 + (t + 1) * cost
            if oracle.stops_on_hit:
                active = active[~hit]
        return AttackResult(x_adv=x_adv, success=first >= 0, first_success=first)


class NES(GradientEstimateAttack):
    """NES (Ilyas et al. 2018): Gaussian directions; the seed's q = 100, σ = 0.001."""

    directions = "gaussian"


class SPSA(GradientEstimateAttack):
    """SPSA (Uesato et al. 2018): Rademacher (±1) directions; the seed's q = 100, σ = 0.001."""

    directions = "rademacher"
