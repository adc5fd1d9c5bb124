"""The pieces of the Square attack's ℓ∞ random search (Andriushchenko et al. 2020) both halves use.

The robustness half's `Square` lowers a classifier's margin through a score oracle; the quality
half's `MetricSquare` raises a metric's goodness. Both recolour one random square of the best
iterate per step with ±ε per channel, its side shrinking on the authors' schedule of p (the
square's share of pixels), and both draw their numbers per sample and step from the counter
generator (`advbench.core.sample_draws`), `BLOCK` steps at a time, so a sample's search does not depend
on its batch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache

import torch

from advbench.core.sample_draws import uniform_streams
from advbench.core.steps import clip, per_sample

RESAMPLES = 16  # redraws of an ℓ∞ square whose colour would not change the image (authors: until it does)
STREAMS = 2  # random streams per step: the squares' places, the colours
BLOCK = 32  # Square's steps whose random numbers are drawn at once


def p_schedule(p_init: float, it: int, n_queries: int | None) -> float:
    """The authors' schedule of the square's share of pixels, halved at fixed fractions of the budget
    `n_queries`; None: at fixed iterations of a 10,000-query scale, whatever the budget."""
    it = it if n_queries is None else int(it / n_queries * 10000)
    for bound, div in ((10, 1), (50, 2), (200, 4), (500, 8), (1000, 16), (2000, 32), (4000, 64),
                       (6000, 128), (8000, 256)):
        if it <= bound:
            return p_init / div
    return p_init / 512


@lru_cache(maxsize=256)
def _spans(s: int, size: int, device: torch.device) -> torch.Tensor:
    """(size − s + 1, size) bool: row k marks [k, k + s), the square's rows (or columns) at corner k.

    Row k is what a uniform u with ⌊u·(size − s)⌋ = k places; the last row repeats the one
    before it, for a product u·(size − s) that rounds up to size − s (a corner is at most size − s − 1).
    """
    corner = torch.arange(size - s + 1, device=device).clamp(max=size - s - 1)[:, None]
    at = torch.arange(size, device=device)[None, :]
    return (at >= corner) & (at < corner + s)


def window(u_top: torch.Tensor, u_left: torch.Tensor, s: int, h: int, w: int) -> torch.Tensor:
    """(n, 1, h, w) bool: the s × s square at the corners the uniforms place (⌊u·(size − s)⌋), one per sample.

    Two table lookups and an outer `and`: Square places a square per sample per step.
    """
    rows = _spans(s, h, u_top.device).index_select(0, (u_top * (h - s)).long())
    cols = _spans(s, w, u_left.device).index_select(0, (u_left * (w - s)).long())
    return (rows[:, :, None] & cols[:, None, :])[:, None]


class SquareDraws:
    """Square's random numbers, drawn `BLOCK` steps at a time for the samples searching at a block's start.

    Step t's are stream 2t (the squares' places, float32) and 2t + 1 (the colours, in x's
    dtype, as `paint` turns them into what the step wants) of `draws.uniform`: the very
    numbers a draw per step gives, for one draw's fixed cost of a few dozen tensor ops per
    block instead of per step. Rows follow the searching samples: `keep` drops those that stop
    (wasting the rest of their block).
    """

    def __init__(self, seed: int, sample_id: torch.Tensor, places: int, colours: tuple[int, ...],
                 like: torch.Tensor, last: int, paint: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.seed, self.sample_id, self.places, self.colours, self.like, self.last, self.paint = \
            seed, sample_id, places, colours, like, last, paint
        self.first = -BLOCK
        self.place = self.colour = like.new_empty(0)

    def at(self, t: int, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Step t's place uniforms (m, places) and painted colours (m, *colours) of batch rows `rows`."""
        if t >= self.first + BLOCK:
            self.first = t
            steps = torch.arange(t, min(t + BLOCK, self.last + 1), device=rows.device) * STREAMS
            ids, like = self.sample_id.index_select(0, rows), self.like
            self.place = uniform_streams(self.seed, ids, (self.places,), steps, device=like.device)
            self.colour = self.paint(uniform_streams(self.seed, ids, self.colours, steps + 1, device=like.device,
                                                     dtype=like.dtype))
        return self.place[:, t - self.first], self.colour[:, t - self.first]

    def keep(self, mask: torch.Tensor) -> None:
        self.place, self.colour = self.place[mask], self.colour[mask]


def linf_draws(seed: int, keys: torch.Tensor, x: torch.Tensor, last: int) -> SquareDraws:
    """The ℓ∞ step's draws: two place uniforms, and `RESAMPLES` colours per channel (True: −ε)."""
    return SquareDraws(seed, keys, 2, (RESAMPLES, x.shape[1]), x, last, lambda u: u < 0.5)


def recoloured(x: torch.Tensor, eps: torch.Tensor, bounds: tuple[float, float]) -> torch.Tensor:
    """(m, 2, c, h, w): x + ε and x − ε per sample, clipped to the bounds: the two colours of an ℓ∞ square."""
    e = per_sample(eps, x)
    return clip(torch.stack([x + e, x - e], dim=1), bounds)


def linf_step(moved: torch.Tensor, x_best: torch.Tensor, p: float, u: torch.Tensor,
              minus: torch.Tensor) -> torch.Tensor:
    """Recolour one random square of `x_best` with ±ε per channel, redrawing colours that change nothing.

    `moved` (m, 2, c, h, w): x + ε and x − ε, clipped (`recoloured`); `u`: the corner's two
    uniforms; `minus` (m, R, c): R colours per sample (True: −ε), all drawn at once. A colour
    leaves a channel unchanged iff its clipped value equals x_best over the square, so the
    first useful draw is picked without extra passes. The result stays in the ε-ball and the box
    `moved` was clipped to, as every pixel is either x_best's or one of `moved`'s.
    """
    m, c, h, w = x_best.shape
    s = min(max(round(math.sqrt(p * h * w)), 1), h - 1)
    inside = window(u[:, 0], u[:, 1], s, h, w)
    changes = (((moved - x_best[:, None]).abs() * inside[:, None]).flatten(3).amax(dim=3) >= 1e-7).to(x_best.dtype)
    useful = torch.where(minus, changes[:, 1, None], changes[:, 0, None]).amax(dim=2)  # (m, R)
    useful[:, -1] = 1                                        # the last draw when none is useful
    pick = minus.gather(1, useful.argmax(dim=1)[:, None, None].expand(m, 1, c)).view(m, c, 1, 1)
    return torch.where(inside, torch.where(pick, moved[:, 1], moved[:, 0]), x_best)
