"""Per-sample random numbers that do not depend on batch position or batch size.

A counter-based generator: every number is a pure function of (seed, sample_id, stream,
element index), computed with the splitmix64 finaliser on int64 tensors for the whole batch
at once. So a sample draws the same random start whether it is attacked alone, in a batch of
64, or re-attacked at another ε by the minimum-ε search. `stream` separates uses (restart,
iteration, ...) so that two uses never see the same numbers; `uniform` and `normal` are
separate domains, so they never share numbers either.
"""

from __future__ import annotations

import math

import torch

_MASK64 = (1 << 64) - 1


def _i64(v: int) -> int:
    """A Python int reduced mod 2**64 to the signed int64 with the same bits."""
    v &= _MASK64
    return v - (1 << 64) if v >= 1 << 63 else v


_GOLDEN = _i64(0x9E3779B97F4A7C15)
_M1 = _i64(0xBF58476D1CE4E5B9)
_M2 = _i64(0x94D049BB133111EB)
_UNIFORM, _NORMAL = 0x5BD1E995, 0x1B873593


def _shr(v: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 bits (torch's >> is arithmetic)."""
    return (v >> k) & ((1 << (64 - k)) - 1)


def _mix(v: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser: a bijection on 64-bit words with full avalanche (int64 wraps)."""
    v = (v ^ _shr(v, 30)) * _M1
    v = (v ^ _shr(v, 27)) * _M2
    return v ^ _shr(v, 31)


def _bits(seed: int, sample_id: torch.Tensor, count: int, stream: int, domain: int,
          device: torch.device | str | None) -> torch.Tensor:
    """(n, count) independent 64-bit words, one hash per (seed, sample, stream, domain, element)."""
    sid = torch.as_tensor(sample_id, device=device).to(torch.int64).reshape(-1)
    key = _mix(torch.full_like(sid, _i64(seed * 0x100000001 + domain)) + _GOLDEN)
    key = _mix(key ^ (sid * _GOLDEN + _i64(stream)))
    key = _mix(key + _i64(stream * _M1))
    counter = (torch.arange(1, count + 1, device=sid.device, dtype=torch.int64) * _GOLDEN)
    return _mix(key[:, None] + counter[None, :])


def _unit(bits: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Top mantissa-many bits as a float in [0, 1), exact in `dtype` (never rounds up to 1)."""
    m = min(round(-math.log2(torch.finfo(dtype).eps)) + 1, 53)
    return (_shr(bits, 64 - m).to(torch.float64) * 2.0 ** -m).to(dtype)


def uniform(seed: int, sample_id: torch.Tensor, shape: tuple[int, ...], stream: int, *,
            device: torch.device | str | None = None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """U[0, 1) numbers of shape (n, *shape), row i a function of (seed, sample_id[i], stream)."""
    count = math.prod(shape)
    bits = _bits(seed, sample_id, count, stream, _UNIFORM, device)
    return _unit(bits, dtype).reshape(-1, *shape)


def normal(seed: int, sample_id: torch.Tensor, shape: tuple[int, ...], stream: int, *,
           device: torch.device | str | None = None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """N(0, 1) numbers of shape (n, *shape) by Box–Muller on two per-element uniforms (float64)."""
    count = math.prod(shape)
    bits = _bits(seed, sample_id, 2 * count, stream, _NORMAL, device)
    u = _unit(bits, torch.float64)
    u1, u2 = 1.0 - u[:, :count], u[:, count:]          # u1 in (0, 1]: the log is finite
    z = torch.sqrt(-2.0 * torch.log(u1)) * torch.cos(2.0 * math.pi * u2)
    return z.to(dtype).reshape(-1, *shape)
