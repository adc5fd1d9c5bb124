"""Sparse-RS (Croce, Andriushchenko, Singh, Flammarion, Hein, AAAI 2022, arXiv 2006.12834): random search
from scores alone under sparse threats, ℓ0 (⌊ε⌋ pixels, a pixel every channel at one place) and patches
(one square of side ⌊ε⌋ anywhere, its pixels free in the box).

As Square (`score.py`), every sample runs its own search in one tensor loop: each step is ONE oracle
call carrying one candidate for every searching sample, kept where it lowers the loss or meets the
goal, and a sample leaves the search when it meets the goal or spends its queries. Every random number
is drawn per (seed, sample id, step) (`core.sample_draws`), so a sample's search does not depend on its
batch. The two threats differ only in how a candidate is proposed: `PixelSearch` and `PatchSearch`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from advbench.core import hyperparameters as hyper
from advbench.core.box_projections import whole_pixels
from advbench.core.errors import AdvbenchError
from advbench.core.norms import PATCH
from advbench.core.norms import norm as norm_of
from advbench.core.sample_draws import uniform
from advbench.core.steps import per_sample
from advbench.robustness.attacks.attack_contract import AttackResult
from advbench.robustness.attacks.minimum_norm import goal_margin
from advbench.robustness.attacks.oracles import ScoreOracle
from advbench.robustness.attacks.score import ScoreAttack

PIXEL_SCHEDULE = ((0, 1), (50, 2), (200, 4), (500, 5), (1000, 6), (2000, 8), (4000, 10), (6000, 12), (8000, 15))
"""ℓ0's α: α_init / divisor while the iteration (on a 10,000-query scale) is at most the bound; / 20 after."""
PATCH_SCHEDULE = ((10, 1), (50, 2), (200, 4), (500, 8), (1000, 16), (4000, 32), (8000, 64))
"""Patches' α, the same way; / 128 after."""
ALPHA_INIT = {(False, False): 0.3, (False, True): 0.1, (True, False): 0.4, (True, True): 0.1}
"""The authors' α_init per (patch, targeted) where `alpha_init` is null (their README's commands)."""


def alpha_at(alpha_init: float, it: int, n_queries: int, schedule: tuple[tuple[int, int], ...], last: int) -> float:
    """The share of the budget a step changes at iteration `it`, halving on the authors' piecewise schedule,
    stretched over `n_queries` as their `resc_schedule` does."""
    scaled = int(it / n_queries * 10000)
    return alpha_init / next((div for bound, div in schedule if scaled <= bound), last)


def corners(u: torch.Tensor, bounds: tuple[float, float], like: torch.Tensor) -> torch.Tensor:
    """A corner of the box per entry of `u` (below one half: the low end), in `like`'s dtype."""
    return torch.where(u < 0.5, bounds[0], bounds[1]).to(like)


class PixelSearch:
    """ℓ0: the set of k perturbed pixels per sample (`member`, (m, P)), each at a corner of [lo, hi]^C.
    A step swaps ⌊α·k⌋ (at least one) of them for as many outside the set, set to fresh random corners."""

    def __init__(self, x: torch.Tensor, eps: torch.Tensor, ids: torch.Tensor, seed: int,
                 bounds: tuple[float, float], alpha_init: float, n_queries: int) -> None:
        self.x, self.ids, self.seed, self.bounds = x, ids, seed, bounds
        self.alpha_init, self.n_queries = alpha_init, n_queries
        pixels = x.shape[2] * x.shape[3]
        self.k = whole_pixels(eps).clamp(max=pixels).to(x.device)
        # The start: k pixels drawn uniformly (stream 0's keys), at random corners (stream 1).
        self.member = self._rank(uniform(seed, ids, (pixels,), 0, device=x.device)) < self.k[:, None]
        self.best = self._paint(x, self.member, 1)
        self.cand, self.cand_member = self.best, self.member

    def _rank(self, keys: torch.Tensor) -> torch.Tensor:
        """Each pixel's place in its row's ascending order of `keys` (m, P)."""
        order = keys.argsort(dim=1, stable=True)
        return torch.empty_like(order).scatter_(1, order, torch.arange(keys.shape[1], device=keys.device).expand_as(order))

    def _paint(self, base: torch.Tensor, where: torch.Tensor, stream: int) -> torch.Tensor:
        """`base` with the pixels `where` (m, P) set to random corners of the box (draw `stream`)."""
        m, c, h, w = base.shape
        u = uniform(self.seed, self.ids, (c, h, w), stream, device=base.device)
        return torch.where(where.view(m, 1, h, w), corners(u, self.bounds, base), base)

    @property
    def searching(self) -> torch.Tensor:
        """Rows with a search: a budget of at least one pixel, and a pixel outside it to swap in."""
        return (self.k >= 1) & (self.k < self.member.shape[1])

    def propose(self, t: int) -> torch.Tensor:
        """Step t's candidate: members first in the order of fresh keys, then the others; the first
        ⌊α·k⌋ members leave (back to x) and the first as many others come in at random corners."""
        alpha = alpha_at(self.alpha_init, t, self.n_queries, PIXEL_SCHEDULE, 20)
        swap = torch.minimum((alpha * self.k).floor().clamp_min(1), self.member.shape[1] - self.k)[:, None]
        keys = uniform(self.seed, self.ids, (self.member.shape[1],), 2 * t, device=self.x.device)
        rank = self._rank(torch.where(self.member, keys, keys + 2))
        leave, come = self.member & (rank < swap), ~self.member & (rank < self.k[:, None] + swap)
        m, c, h, w = self.x.shape
        kept = torch.where(leave.view(m, 1, h, w), self.x, self.best)
        self.cand, self.cand_member = self._paint(kept, come, 2 * t + 1), (self.member & ~leave) | come
        return self.cand

    def accept(self, better: torch.Tensor) -> None:
        self.best = torch.where(per_sample(better, self.best), self.cand, self.best)
        self.member = torch.where(better[:, None], self.cand_member, self.member)

    def keep(self, rows: torch.Tensor) -> None:
        for name in ("x", "ids", "k", "member", "best"):
            setattr(self, name, getattr(self, name)[rows])


class PatchSearch:
    """Patches: per sample a square of side s (`side`) at `place` (m, 2: top, left), its content (m, C, S, S)
    at corners of the box (S the batch's largest side, of which a sample uses its s × s corner). A step
    either moves the square (every 5·(1 + t // 1000) steps while the move's reach, ¾ of the image side
    shrinking linearly to 0 over the budget, is a pixel or more) or recolours a random sub-square of the
    content, side √α·s, one corner per channel (the authors' alternation)."""

    def __init__(self, x: torch.Tensor, eps: torch.Tensor, ids: torch.Tensor, seed: int,
                 bounds: tuple[float, float], alpha_init: float, n_queries: int) -> None:
        self.x, self.ids, self.seed, self.bounds = x, ids, seed, bounds
        self.alpha_init, self.n_queries = alpha_init, n_queries
        m, c, h, w = x.shape
        self.side = whole_pixels(eps).clamp(max=min(h, w)).to(x.device)
        size = max(int(self.side.max()) if m else 0, 1)
        u = uniform(seed, ids, (2 + c * size,), 0, device=x.device)
        self.place = self._within(u[:, :2])
        self.content = corners(u[:, 2:].view(m, c, 1, size), bounds, x).expand(m, c, size, size).clone()
        self.best = self._pasted(self.place, self.content)
        self.cand, self.cand_place, self.cand_content = self.best, self.place, self.content

    def _within(self, u: torch.Tensor) -> torch.Tensor:
        """(m, 2) corners uniform over the places the square fits, from uniforms (m, 2)."""
        room = torch.tensor(self.x.shape[2:], device=u.device) - self.side[:, None] + 1
        return (u * room).long().clamp(max=room - 1)

    def _pasted(self, place: torch.Tensor, content: torch.Tensor) -> torch.Tensor:
        """x with each sample's s × s content at its place."""
        m, _, h, w = self.x.shape
        size = content.shape[2]
        r = torch.arange(h, device=place.device)[None] - place[:, :1]            # (m, h): row inside the square
        c = torch.arange(w, device=place.device)[None] - place[:, 1:]            # (m, w)
        s = self.side[:, None]
        inside = ((r >= 0) & (r < s))[:, :, None] & ((c >= 0) & (c < s))[:, None, :]
        at = torch.arange(m, device=place.device)[:, None, None]
        values = content[at, :, r.clamp(0, size - 1)[:, :, None], c.clamp(0, size - 1)[:, None, :]]
        return torch.where(inside[:, None], values.permute(0, 3, 1, 2), self.x)

    @property
    def searching(self) -> torch.Tensor:
        return self.side >= 1

    def propose(self, t: int) -> torch.Tensor:
        m, c, h, _ = self.x.shape
        size = self.content.shape[2]
        reach = int(max((self.n_queries - t) / self.n_queries, 0.0) * 0.75 * h)
        u = uniform(self.seed, self.ids, (4 + c,), t, device=self.x.device)
        place, content = self.place, self.content
        if t % (5 * (1 + t // 1000)) == 0 and reach > 0:
            shift = (u[:, :2] * (2 * reach + 1)).floor().long() - reach
            room = torch.tensor(self.x.shape[2:], device=u.device) - self.side[:, None]
            place = torch.minimum((place + shift).clamp_min(0), room)
        else:
            alpha = alpha_at(self.alpha_init, t, self.n_queries, PATCH_SCHEDULE, 128)
            sub = (math.sqrt(alpha) * self.side).floor().clamp_min(1)
            corner = (u[:, 2:4] * (self.side - sub + 1)[:, None]).floor().long()
            at = torch.arange(size, device=u.device)[None]
            rows = (at >= corner[:, :1]) & (at < corner[:, :1] + sub[:, None])
            cols = (at >= corner[:, 1:]) & (at < corner[:, 1:] + sub[:, None])
            inside = (rows[:, :, None] & cols[:, None, :])[:, None]
            content = torch.where(inside, corners(u[:, 4:].view(m, c, 1, 1), self.bounds, self.x), content)
        self.cand, self.cand_place, self.cand_content = self._pasted(place, content), place, content
        return self.cand

    def accept(self, better: torch.Tensor) -> None:
        self.best = torch.where(per_sample(better, self.best), self.cand, self.best)
        self.place = torch.where(better[:, None], self.cand_place, self.place)
        self.content = torch.where(per_sample(better, self.content), self.cand_content, self.content)

    def keep(self, rows: torch.Tensor) -> None:
        for name in ("x", "ids", "side", "place", "content", "best"):
            setattr(self, name, getattr(self, name)[rows])


class SparseRS(ScoreAttack):
    """Sparse-RS under ℓ0 and patch threats, margin loss untargeted, cross-entropy to the target
    targeted (the authors' losses). `n_queries` counts the start's query too, so the oracle's per-sample
    count never exceeds it; the default 20,000 is the catalogue's score-based budget (the authors' untargeted
    runs take 10,000, their targeted ones 50,000 to 100,000). `alpha_init` null takes the authors' value
    for the threat and goal (`ALPHA_INIT`)."""

    norms = ("l0", "patch")
    hyperparameters = {"n_queries": hyper.Whole(1), "alpha_init": hyper.Real(0, 1, open_low=True, optional=True),
                       "seed": hyper.Whole(None)}

    def __init__(self, *, n_queries: int = 20000, alpha_init: float | None = None, seed: int = 0) -> None:
        self.set_hyperparameters(locals())

    def run(self, oracle: ScoreOracle, x: torch.Tensor, y: torch.Tensor, *, eps: torch.Tensor, norm: str,
            target: torch.Tensor | None, sample_id: torch.Tensor) -> AttackResult:
        if x.dim() != 4:
            raise AdvbenchError(f"Sparse-RS attacks images (N, C, H, W), got inputs of shape {tuple(x.shape)}")
        patch = norm_of(norm) is PATCH
        alpha = self.alpha_init if self.alpha_init is not None else ALPHA_INIT[(patch, target is not None)]
        search = (PatchSearch if patch else PixelSearch)(x, eps, sample_id, self.seed, oracle.bounds, alpha,
                                                         self.n_queries)
        everyone = torch.arange(x.shape[0], device=x.device)
        x_best = search.best.clone()
        logits = oracle.logits(x_best, everyone)
        first = torch.where(oracle.verdict(x_best, y, target, everyone, logits), 1, -1)
        active = (first < 0) & search.searching
        rows, loss = everyone[active], _loss(logits, y, target)[active]
        search.keep(active)
        ya, ta, fa = y[rows], None if target is None else target[rows], first[rows]
        for t in range(1, self.n_queries):
            if rows.numel() == 0:
                break
            cand = search.propose(t)
            logits = oracle.logits(cand, rows)
            new = _loss(logits, ya, ta)
            hit = oracle.verdict(cand, ya, ta, rows, logits, undated=fa < 0)
            better = (new < loss) | hit
            search.accept(better)
            loss = torch.where(better, new, loss)
            fa = torch.where(hit & (fa < 0), t + 1, fa)
            if oracle.stops_on_hit and bool(hit.any()):
                x_best[rows], first[rows] = search.best, fa
                keep = ~hit
                rows, loss, ya, fa = rows[keep], loss[keep], ya[keep], fa[keep]
                ta = None if ta is None else ta[keep]
                search.keep(keep)
        x_best[rows], first[rows] = search.best, fa
        return AttackResult(x_adv=x_best, success=first >= 0, first_success=first)


def _loss(logits: torch.Tensor, y: torch.Tensor, target: torch.Tensor | None) -> torch.Tensor:
    """What a step must lower: the margin Z_y − max_{i≠y} Z_i untargeted, the target's cross-entropy targeted."""
    return goal_margin(logits, y, None) if target is None else F.cross_entropy(logits, target, reduction="none")
