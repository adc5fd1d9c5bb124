"""Projections onto the sparse balls intersected with the input box, for `core.norms`: ℓ1's exact
Euclidean projection, and ℓ0's keep-the-k-pixels step (a pixel: every channel at one place).

Apart from the norm classes so that each stays one short class beside the others.
"""

from __future__ import annotations

import torch

_TINY = 1e-12


def l1_box_projection(y: torch.Tensor, eps: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """argmin ‖δ − y‖₂ s.t. ‖δ‖₁ ≤ ε and lo ≤ δ ≤ hi (lo ≤ 0 ≤ hi), per sample.

    KKT: δ_i = sign(y_i)·clamp(|y_i| − λ, 0, u_i), u_i the room towards y_i's side, with λ ≥ 0 the
    root of S(λ) = Σ_i clamp(|y_i| − λ, 0, u_i) = ε (λ = 0 when S(0) ≤ ε). S is piecewise linear and
    non-increasing with kinks at |y_i| − u_i and |y_i|: evaluated at every kink after one sort, the
    root is interpolated exactly inside its segment.
    """
    shape, n = y.shape, y.shape[0]
    y, lo, hi = y.flatten(1), lo.flatten(1), hi.flatten(1)
    a = y.abs().double()
    room = torch.where(y >= 0, hi, -lo).clamp_min(0).double()
    # Past a_i − u_i coordinate i leaves its cap (S's slope −1 more); past a_i it is 0 (+1 back).
    t, order = torch.cat([(a - room).clamp_min(0), a], dim=1).sort(dim=1)
    turns = torch.cat([torch.full_like(a, -1.0), torch.ones_like(a)], dim=1)
    slope = turns.gather(1, order).cumsum(dim=1)          # S's slope right after each kink
    s0 = torch.minimum(a, room).sum(dim=1, keepdim=True)
    gaps = torch.diff(t, dim=1, prepend=torch.zeros_like(t[:, :1]))
    before = torch.cat([torch.zeros_like(slope[:, :1]), slope[:, :-1]], dim=1)
    s_at = s0 + (before * gaps).cumsum(dim=1)             # S at each kink
    e = eps.double().reshape(n, 1)
    k = ((s_at > e).sum(dim=1, keepdim=True) - 1).clamp(0, t.shape[1] - 1)  # the last kink with S above ε
    lam = t.gather(1, k) + (s_at.gather(1, k) - e) / (-slope.gather(1, k)).clamp_min(_TINY)
    lam = torch.where(s0 > e, lam, torch.zeros_like(lam))
    delta = torch.minimum((a - lam).clamp_min(0), room).to(y.dtype)
    return (y.sign() * delta).reshape(shape)


def pixel_sums(v: torch.Tensor) -> torch.Tensor:
    """(N, P): v summed over the channels of each pixel; axis 1 of an (N, C, ...) batch holds the
    channels, and each coordinate of an (N, D) batch is a pixel of its own."""
    return v.flatten(2).sum(dim=1) if v.dim() > 2 else v


def keep_pixels(x: torch.Tensor, values: torch.Tensor, score: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """x with its k (N,) pixels of the highest `score` (N, P) taken from `values`, every channel
    together; ties go to the earlier pixel, so exactly min(k, P) pixels are taken (a threshold at the
    k-th score would take every pixel tied with it)."""
    order = score.argsort(dim=1, descending=True, stable=True)
    ranks = torch.arange(score.shape[1], device=score.device).expand_as(order)
    rank = torch.empty_like(order).scatter_(1, order, ranks)
    keep = rank < k.to(score.device)[:, None]
    keep = keep.reshape(x.shape[0], 1, *x.shape[2:]) if x.dim() > 2 else keep
    return torch.where(keep, values, x)


def whole_pixels(eps: torch.Tensor) -> torch.Tensor:
    """The pixels a budget ε (N,) allows, ⌊ε⌋ (a budget a hair under a whole number from float rounding is it)."""
    return torch.floor(eps.double() + 1e-6).clamp_min(0).long()
