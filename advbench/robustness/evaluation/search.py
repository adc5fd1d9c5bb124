"""The minimum-ε search of budgeted attacks: probes of the whole attack at other ε, per sample.

Every probe is one batched attack call from scratch over the samples whose bracket is still
wider than the resolution; `margin` places probes at the estimated root of the deployed model's
goal margin as a function of ε, `bisect` halves brackets. Under a norm of whole budgets (ℓ0's
pixels) every probe is a whole number and the resolution at least 1 (`Norm.snap`,
`Norm.search_resolution`), so a closed bracket [k − 1, k] makes min_eps exact.
"""

from __future__ import annotations

import math

import torch

from advbench.robustness.evaluation.batch import Batch
from advbench.robustness.specs import SearchSettings


def min_eps_search(b: Batch, hi: torch.Tensor, lo: torch.Tensor, adv_norm: torch.Tensor, margin: torch.Tensor,
                   search: SearchSettings) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Narrow each sample's bracket of probed ε values (float64, threat units).

    `hi` is the smallest probe at which the attack succeeded (inf: none yet), `lo` the largest
    probe below it at which it failed (0: the clean input, when every probe below `hi`
    succeeded; NaN: nothing below, hi is 0); `margin` is the deployed model's goal margin on
    the budget run's example. Every probe is one batched attack call, from scratch, over the
    samples whose bracket is wider than the resolution, each at its own ε strictly inside its
    bracket. A failed budget run is never probed below, and a succeeded one never above, so
    success at the budget ⇔ hi ≤ budget. `adv_norm` tracks the smallest adversarial example
    any probe verified.

    `bisect` halves from the budget while it succeeds, doubles while it fails, then bisects.
    `margin` places each probe at the root of the final margin as a function of ε, estimated
    from the probes so far (`_margin_probe`), for as long as bisection could still close the
    sample's bracket with the probes left; then it bisects.
    """
    ball = b.threat.ball  # a whole norm (ℓ0's pixels) probes whole budgets only: `Norm.snap`
    resolution = ball.search_resolution(search.resolution * b.threat.eps)
    wider = resolution * (1 + 1e-12)  # a probe at lo + resolution closes the bracket despite rounding
    max_eps = float(ball.snap(torch.tensor(search.max_factor * b.threat.eps, dtype=torch.float64)))
    hi, lo, adv_norm = hi.clone(), lo.clone(), adv_norm.clone()
    everyone = torch.arange(b.x.shape[0], device=b.x.device)
    m0 = b.margin(b.clean, everyone)
    m_lo = torch.where(lo > 0, margin, m0)   # the failing end's margin: the budget run's, or the clean input's
    m_hi = torch.where(torch.isfinite(hi), margin, math.nan)
    for round_ in range(search.max_probes):
        idx = ((hi - lo > wider) & (lo < max_eps)).nonzero().squeeze(1)
        if idx.numel() == 0:
            break
        upper, lower = hi[idx], lo[idx]
        probe = ball.snap(torch.where(torch.isinf(upper), torch.clamp(2 * lower, max=max_eps), (lower + upper) / 2))
        if search.method == "margin":
            placed = _margin_probe(lower, upper, m0[idx], m_lo[idx], m_hi[idx], adv_norm[idx], resolution, max_eps)
            placed = ball.snap(placed, up=torch.isinf(upper))
            # Guided only while bisection could still close the bracket with the probes left after this one.
            spare = search.max_probes - round_ - 1 >= _bisection_probes(lower, upper, wider, max_eps)
            probe = torch.where(torch.isfinite(placed) & spare & (placed > lower) & (placed < upper), placed, probe)
        res = b.attack_at(idx, probe)
        verdict = b.judge(res.x_adv, idx)
        won, m = res.success if res.pred is not None else verdict.met, b.margin(verdict, idx)  # pred: judged itself
        hi[idx] = torch.where(won, probe, upper)
        lo[idx] = torch.where(won, lower, probe)
        m_hi[idx] = torch.where(won, m, m_hi[idx])
        m_lo[idx] = torch.where(won, m_lo[idx], m)
        adv_norm[idx] = torch.where(won, torch.minimum(adv_norm[idx], b.norm(res.x_adv, idx)), adv_norm[idx])
    return hi, lo, adv_norm


def _bisection_probes(lo: torch.Tensor, hi: torch.Tensor, resolution: float, max_eps: float) -> torch.Tensor:
    """Probes bisection needs at most to close [lo, hi] (doubling up to max_eps first when hi is inf)."""
    bisect = lambda width: torch.ceil(torch.log2(torch.clamp(width / resolution, min=1.0)))  # noqa: E731
    doubling = torch.ceil(torch.log2(torch.clamp(max_eps / lo, min=1.0)))
    return torch.where(torch.isinf(hi), doubling + bisect(torch.full_like(lo, max_eps / 2)), bisect(hi - lo))


_SPREAD = 0.03
"""How far below (above, with no success yet) its estimate a probe goes, as a fraction of the
estimate's distance from the failing end: estimates from a failure near the root are within a few
percent. Chosen on the digits benchmark: natural BIM ℓ∞ costs 1.57, 1.59, 1.95 full runs at 0.03,
0.06, 0.1 (before `_SURFACE` and `_GRID`)."""


_SURFACE = 0.99
"""An example at a norm above this fraction of its probe's ε counts as on the ball's surface."""


_GRID = 4
"""Guided probes lie on multiples of resolution / _GRID (so does the budget: 1 / resolution is whole)."""


def _margin_probe(lo: torch.Tensor, hi: torch.Tensor, m0: torch.Tensor, m_lo: torch.Tensor, m_hi: torch.Tensor,
                  smallest: torch.Tensor, resolution: float, max_eps: float) -> torch.Tensor:
    """The next probe per sample from the final margins seen so far (NaN: no usable estimate).

    Estimates of the root r of margin(ε): the line through the clean margin `m0` (ε = 0) and
    the failing end's `m_lo` (extrapolated; exact for a linear margin), and regula falsi between
    the failing end and the smallest verified example (norm `smallest`, margin `m_hi` <= 0); the
    smaller wins. The probe then aims to end the search in two steps: one failure just below r
    and one success within the resolution above it, or the closing probe itself when r lies
    within the resolution of an end.
    """
    slope = (m0 - m_lo) / lo
    extrapolated = torch.where((lo > 0) & (slope > 0), lo + m_lo / slope, math.inf)
    ref = torch.where(torch.isfinite(smallest) & (smallest > lo), smallest, hi)
    falsi = torch.where(torch.isfinite(ref) & (m_hi < 0) & (m_lo > 0), lo + (ref - lo) * m_lo / (m_lo - m_hi), math.inf)
    r = torch.minimum(extrapolated, falsi)
    spread = _SPREAD * (r - lo)
    up = torch.isinf(hi)
    # no success yet: probe above the estimate (a success), up to max_eps
    above = torch.clamp(torch.maximum(r + spread, lo + resolution), max=max_eps)
    # bracketed: the closing success from lo, the closing failure below hi, or a failure just below r
    below = torch.where(r + spread <= lo + resolution, lo + resolution,
                        torch.where(r - spread >= hi - resolution, hi - resolution, r - spread))
    # With no failure yet and the example on the ball's surface, nothing measured says how far below hi the
    # root lies (an early-stopped success's margin is barely negative): probe no higher than halfway.
    blind = (lo == 0) & ~(smallest < hi * _SURFACE)
    below = torch.where(blind, torch.minimum(below, hi / 2), below)
    probe = torch.where(up, above, below)
    # On a grid of resolution / _GRID, which the bracket's ends (0, the budget, earlier probes) lie on too:
    # the last bits of a margin change with the batch a sample is in, and must not move its probes.
    step = resolution / _GRID
    probe = torch.where(up, torch.ceil(probe / step - 1e-9), torch.floor(probe / step + 1e-9)) * step
    inside = torch.isfinite(r) & (probe > lo + step / 2) & (probe < hi - step / 2)
    return torch.where(inside, probe, math.nan)
