"""The smallest step from a point onto a hyperplane within a box, in ℓ∞, ℓ2 or ℓ1: FAB's projection.

FAB (`attacks.fab`) linearises the decision boundary into a hyperplane w·z = b and moves towards its
nearest point that is still a valid input. Both problems are, per sample,

    min ‖δ‖  subject to  w·(t + δ) = b,  lo ≤ t + δ ≤ hi,

and both have the same structure once the hyperplane is oriented so that it lies in the direction
of increasing w·δ (c = b − w·t ≥ 0): each coordinate moves only towards the side that helps,
sign(w_i), as far as a common parameter allows and at most its room to the box, r_i. The progress
w·δ is then a nondecreasing piecewise-linear function of that parameter with one kink per
coordinate, so sorting the kinks and summing prefixes finds the parameter that makes the progress
exactly c in one pass per sample: O(d log d), batched over samples, no loop (Croce and Hein run a
bisection over the same sorted kinks). Where even the whole box cannot reach the hyperplane, the
step goes to the box point of most progress (every coordinate at its room), as in the original.
Under ℓ1 the parameter is a price rather than a radius: a coordinate buys |w_i| progress per unit
of norm, so the cheapest step fills the coordinates in order of |w_i| up to their room (a
fractional knapsack; the original's `projection_l1` bisects over the same order).
"""

from __future__ import annotations

import torch

from advbench.core.norms import L1_NORM, L2_NORM, LINF


def _oriented(t: torch.Tensor, w: torch.Tensor, b: torch.Tensor,
              bounds: tuple[float, float]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The hyperplane turned so that it lies ahead (c ≥ 0): w' = ±w, c, and each coordinate's room r_i
    towards the side sign(w'_i) helps (0 where w'_i = 0: such a coordinate does not move)."""
    c = b - (w * t).sum(dim=1)
    sign = torch.where(c < 0, -1.0, 1.0).to(w.dtype)
    w = w * sign[:, None]
    lo, hi = bounds
    room = torch.where(w > 0, hi - t, torch.where(w < 0, t - lo, torch.zeros_like(t))).clamp_min(0)
    return w, c.abs(), room


def _suffix_sum(v: torch.Tensor) -> torch.Tensor:
    """out[:, k] = Σ_{j ≥ k} v[:, j], summed from the end (no cancellation of a total minus a prefix)."""
    return v.flip(1).cumsum(dim=1).flip(1)


def _solve(kinks: torch.Tensor, at_kink: torch.Tensor, slope: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """The parameter s ≥ 0 at which progress(s) = c, per row, for progress(s) = Σ_i min(s·a_i, b_i)
    (a_i ≥ 0): `kinks` s_i = b_i / a_i, `at_kink` b_i (the term's value past its kink), `slope` a_i.

    Sorted by kink, progress at the k-th kink is Σ_{j≤k} b_j + s_k·Σ_{j>k} a_j; the root lies in
    the segment after the last kink where progress is still short of c. inf where the row cannot
    reach c at all (every term saturated).
    """
    order = kinks.argsort(dim=1)
    s, b, a = kinks.gather(1, order), at_kink.gather(1, order), slope.gather(1, order)
    done = b.cumsum(dim=1)                                   # Σ_{j ≤ k} b_j
    ahead = _suffix_sum(a)                                   # Σ_{j ≥ k} a_j
    progress = done + s * (ahead - a)
    k = (progress < c[:, None]).sum(dim=1, keepdim=True)    # kinks passed before the root
    d = s.shape[1]
    before = torch.where(k > 0, done.gather(1, (k - 1).clamp_min(0)), torch.zeros_like(c[:, None]))
    rate = torch.where(k < d, ahead.gather(1, k.clamp_max(d - 1)), torch.zeros_like(c[:, None]))
    root = (c[:, None] - before) / rate.clamp_min(torch.finfo(rate.dtype).tiny)
    return torch.where((k < d) & (rate > 0), root, torch.full_like(root, torch.inf)).squeeze(1)


def project_linf(t: torch.Tensor, w: torch.Tensor, b: torch.Tensor, bounds: tuple[float, float]) -> torch.Tensor:
    """The ℓ∞-smallest step δ (n, d) from points t (n, d) onto w·z = b (w (n, d), b (n,)) within the box.

    At radius ρ the most progress is Σ_i |w_i|·min(ρ, r_i): the smallest ρ reaching c, with
    δ_i = sign(w_i)·min(ρ, r_i).
    """
    w, c, room = _oriented(t, w, b, bounds)
    rho = _solve(room, w.abs() * room, w.abs(), c)
    return w.sign() * torch.minimum(rho[:, None], room)


def project_l2(t: torch.Tensor, w: torch.Tensor, b: torch.Tensor, bounds: tuple[float, float]) -> torch.Tensor:
    """The ℓ2-smallest step δ (n, d) from points t (n, d) onto w·z = b (w (n, d), b (n,)) within the box.

    KKT: δ_i = clip(λ·w_i) to the box, so δ_i = sign(w_i)·min(λ·|w_i|, r_i) and the progress is
    Σ_i |w_i|·min(λ·|w_i|, r_i), with kinks at λ_i = r_i / |w_i|.
    """
    w, c, room = _oriented(t, w, b, bounds)
    mag = w.abs()
    kinks = torch.where(mag > 0, room / mag.clamp_min(torch.finfo(w.dtype).tiny), torch.zeros_like(room))
    lam = _solve(kinks, mag * room, mag * mag, c)
    reach = torch.where(mag > 0, lam[:, None] * mag, torch.zeros_like(mag))  # inf·0 would be NaN
    return w.sign() * torch.minimum(reach, room)


def project_l1(t: torch.Tensor, w: torch.Tensor, b: torch.Tensor, bounds: tuple[float, float]) -> torch.Tensor:
    """The ℓ1-smallest step δ (n, d) from points t (n, d) onto w·z = b (w (n, d), b (n,)) within the box.

    Every unit of |δ_i| adds |w_i| to the progress, so the coordinates of largest |w_i| go first, each
    to its room r_i, until the progress reaches c: the k before the one that completes it in full,
    that one by what is left (c − Σ_{j<k} |w_j|·r_j)/|w_k|, the rest not at all.
    """
    w, c, room = _oriented(t, w, b, bounds)
    rate, order = w.abs().sort(dim=1, descending=True)
    room = room.gather(1, order)                             # from here on in the order of |w_i|
    gain = rate * room
    done = gain.cumsum(dim=1)
    k = (done < c[:, None]).sum(dim=1, keepdim=True)        # coordinates filled before the one completing it
    d = w.shape[1]
    before = torch.where(k > 0, done.gather(1, (k - 1).clamp_min(0)), torch.zeros_like(c[:, None]))
    last = ((c[:, None] - before) / rate.gather(1, k.clamp_max(d - 1)).clamp_min(torch.finfo(w.dtype).tiny))
    at = torch.arange(d, device=w.device)[None]
    moved = torch.where(at < k, room, torch.where(at == k, last, torch.zeros_like(gain)))
    step = torch.empty_like(moved).scatter_(1, order, torch.minimum(moved, room))
    return w.sign() * step


PROJECTIONS = {LINF: project_linf, L2_NORM: project_l2, L1_NORM: project_l1}
"""FAB's box-aware step onto a linearised boundary, per `core.norms` object."""
