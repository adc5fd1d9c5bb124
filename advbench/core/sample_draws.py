"""Per-sample random numbers that do not depend on batch position or batch size, for both halves.

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

MASK64 = (1 << 64) - 1


def as_int64(v: int) -> int:
    """A Python int reduced mod 2**64 to the signed int64 with the same bits."""
    v &= MASK64
    return v - (1 << 64) if v >= 1 << 63 else v


GOLDEN = as_int64(0x9E3779B97F4A7C15)
"""splitmix64's increment (2**64 / golden ratio): spreads consecutive ids and counters over the words."""
M1 = as_int64(0xBF58476D1CE4E5B9)
"""splitmix64's first multiplier: keys a second coordinate (a stream, a call) apart from the first."""
_M2 = as_int64(0x94D049BB133111EB)
_UNIFORM, _NORMAL = 0x5BD1E995, 0x1B873593


def _shr(v: torch.Tensor, k: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """Logical right shift of int64 bits (torch's >> is arithmetic), into `out` if given."""
    return torch.bitwise_right_shift(v, k, out=out).bitwise_and_((1 << (64 - k)) - 1)


def mix(v: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser: a bijection on 64-bit words with full avalanche (int64 wraps)."""
    return _mix_(v.clone())


def _mix_(v: torch.Tensor) -> torch.Tensor:
    """`mix` in place, with one scratch tensor: the draws' words are the bulk of a draw's memory
    traffic, and eleven fresh tensors of them cost three times the arithmetic (page faults)."""
    scratch = torch.empty_like(v)
    v.bitwise_xor_(_shr(v, 30, scratch)).mul_(M1)
    v.bitwise_xor_(_shr(v, 27, scratch)).mul_(_M2)
    return v.bitwise_xor_(_shr(v, 31, scratch))


def _bits(seed: int, sample_id: torch.Tensor, count: int, streams: int | torch.Tensor, domain: int,
          device: torch.device | str | None) -> torch.Tensor:
    """(n, S, count) independent 64-bit words, one hash per (seed, sample, stream, domain, element).

    `streams`: one stream (S = 1, kept a Python number: no host-to-device copy) or a 1-D tensor
    of S. All streams of all samples take one pass: a call costs a few dozen tensor ops whatever
    its size, so an attack that needs a few numbers a sample a step (Square) draws a block of
    steps at once instead of paying those ops every step.
    """
    sid = torch.as_tensor(sample_id, device=device).to(torch.int64).reshape(-1, 1)
    if isinstance(streams, int):
        stream, stream_m1 = as_int64(streams), as_int64(streams * M1)
    else:
        stream = torch.as_tensor(streams, device=sid.device).to(torch.int64).reshape(1, -1)
        stream_m1 = stream * M1                                      # int64 wraps like as_int64
    key = mix(torch.full_like(sid, as_int64(seed * 0x100000001 + domain)) + GOLDEN)
    key = mix(key ^ (sid * GOLDEN + stream))                        # (n, S)
    key = mix(key + stream_m1)
    counter = (torch.arange(1, count + 1, device=sid.device, dtype=torch.int64) * GOLDEN)
    return _mix_(key[:, :, None] + counter)


def _unit(bits: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Top mantissa-many bits as a float in [0, 1), exact in `dtype` (never rounds up to 1).

    Shifts `bits` in place (every caller's are its own, fresh from `_bits`): one tensor of the
    draw's size less to allocate and fault in."""
    m = min(round(-math.log2(torch.finfo(dtype).eps)) + 1, 53)
    return _shr(bits, 64 - m, bits).to(torch.float64).mul_(2.0 ** -m).to(dtype)


def uniform(seed: int, sample_id: torch.Tensor, shape: tuple[int, ...], stream: int, *,
            device: torch.device | str | None = None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """U[0, 1) numbers of shape (n, *shape), row i a function of (seed, sample_id[i], stream)."""
    return uniform_streams(seed, sample_id, shape, stream, device=device, dtype=dtype)[:, 0]


def uniform_streams(seed: int, sample_id: torch.Tensor, shape: tuple[int, ...], streams: int | torch.Tensor, *,
                    device: torch.device | str | None = None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(n, S, *shape): `uniform(seed, sample_id, shape, streams[k])` for every k, in one pass."""
    count = math.prod(shape)
    bits = _bits(seed, sample_id, count, streams, _UNIFORM, device)
    return _unit(bits, dtype).reshape(*bits.shape[:2], *shape)


def normal(seed: int, sample_id: torch.Tensor, shape: tuple[int, ...], stream: int, *,
           device: torch.device | str | None = None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """N(0, 1) numbers of shape (n, *shape) by Box–Muller on two per-element uniforms (float64)."""
    count = math.prod(shape)
    bits = _bits(seed, sample_id, 2 * count, stream, _NORMAL, device)[:, 0]
    u = _unit(bits, torch.float64)
    radius = u[:, :count].neg_().add_(1.0).log_().mul_(-2.0).sqrt_()   # 1 - u in (0, 1]: the log is finite
    z = radius.mul_(u[:, count:].mul_(2.0 * math.pi).cos_())           # in place: u is this call's own
    return z.to(dtype).reshape(-1, *shape)


def row_keys(x: torch.Tensor) -> torch.Tensor:
    """(n,) int64 hash of each row's exact float32 bits: a per-sample key that needs no sample id."""
    bits = x.detach().float().reshape(x.shape[0], -1).view(torch.int32).to(torch.int64)
    weights = mix(torch.arange(1, bits.shape[1] + 1, device=x.device, dtype=torch.int64) * GOLDEN) | 1
    return mix((bits * weights).sum(dim=1))


def member_keys(rows: torch.Tensor, members: int) -> torch.Tensor:
    """(n * members,) keys: row key i mixed with the member index, rows repeated in place."""
    member = torch.arange(1, members + 1, device=rows.device, dtype=torch.int64) * GOLDEN
    return mix(rows[:, None] ^ member[None, :]).reshape(-1)


def signs(u: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """±1 from uniforms (below one half: −1), in `like`'s dtype."""
    return torch.where(u < 0.5, -1.0, 1.0).to(like)


def rademacher(seed: int, sample_id: torch.Tensor, shape: tuple[int, ...], stream: int, like: torch.Tensor) -> torch.Tensor:
    """±1 per entry of `shape` for each sample, drawn from (seed, sample id, stream) in `like`'s dtype."""
    return signs(uniform(seed, sample_id, shape, stream, device=like.device, dtype=like.dtype), like)
