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


def _shr(v: torch.Tensor, k: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """Logical right shift of int64 bits (torch's >> is arithmetic), into `out` if given."""
    return torch.bitwise_right_shift(v, k, out=out).bitwise_and_((1 << (64 - k)) - 1)


def _mix(v: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser: a bijection on 64-bit words with full avalanche (int64 wraps)."""
    return _mix_(v.clone())


def _mix_(v: torch.Tensor) -> torch.Tensor:
    """`_mix` in place, with one scratch tensor: the draws' words are the bulk of a draw's memory
    traffic, and eleven fresh tensors of them cost three times the arithmetic (page faults)."""
    scratch = torch.empty_like(v)
    v.bitwise_xor_(_shr(v, 30, scratch)).mul_(_M1)
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
        stream, stream_m1 = _i64(streams), _i64(streams * _M1)
    else:
        stream = torch.as_tensor(streams, device=sid.device).to(torch.int64).reshape(1, -1)
        stream_m1 = stream * _M1                                      # int64 wraps like _i64
    key = _mix(torch.full_like(sid, _i64(seed * 0x100000001 + domain)) + _GOLDEN)
    key = _mix(key ^ (sid * _GOLDEN + stream))                        # (n, S)
    key = _mix(key + stream_m1)
    counter = (torch.arange(1, count + 1, device=sid.device, dtype=torch.int64) * _GOLDEN)
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


# Draws of randomized models (`defenses.wrappers`), keyed per row by (sample id, call index): the
# k-th forward pass that includes a sample draws the same noise whatever the batch, the chunk, the
# process (a resume) or the other rows of the call.

_CALLS = _i64(0xD6E8FEB86659FD93)


def call_keys(sample_id: torch.Tensor, call: torch.Tensor) -> torch.Tensor:
    """(n,) int64 keys of (sample_id[i], call[i]): a randomized model's draw of one row in one pass."""
    return _mix(_mix(sample_id.to(torch.int64) * _GOLDEN + _CALLS) + call.to(torch.int64) * _M1)


class RowCalls:
    """How many forward passes of a randomized model each sample of one batch has been through.

    `take(rows)` gives the draw keys of one pass over batch rows `rows` and counts it: the k-th
    pass that includes a sample draws with `call_keys(sample id, k)`. A sample that appears j times
    in one pass (the probes of a decision attack) takes j consecutive call indices, so each probe
    draws anew, in the order the attack lays its own probes out.
    """

    def __init__(self, sample_id: torch.Tensor) -> None:
        self.sample_id = sample_id.to(torch.int64).reshape(-1)
        self.count = torch.zeros_like(self.sample_id)

    def take(self, rows: torch.Tensor) -> torch.Tensor:
        """The (len(rows),) keys of one pass over batch rows `rows` (repeats allowed)."""
        rows = rows.to(device=self.count.device, dtype=torch.int64).reshape(-1)
        order = torch.argsort(rows, stable=True)
        ranked = rows[order]
        rank = torch.empty_like(rows)
        rank[order] = torch.arange(rows.shape[0], device=rows.device) - torch.searchsorted(ranked, ranked)
        keys = call_keys(self.sample_id[rows], self.count[rows] + rank)
        self.count.index_add_(0, rows, torch.ones_like(rows))
        return keys

    def pass_of(self, model: object, rows: torch.Tensor) -> Drawing:
        """The context of one forward pass of `model` over batch rows `rows`: a randomized model's
        row keys, this pass counted; one that does not read them (`keyed_draws` unset: a user's
        model on torch's generator) gets that generator seeded. A deterministic model: nothing."""
        if not getattr(model, "randomized", False):
            return Drawing(None)
        return Drawing(self.take(rows), torch_generator=not getattr(model, "keyed_draws", False))


class Drawing:
    """While open, the randomized model's forward pass in flight draws row i with `keys[i]`
    (`draw_keys`; None: a pass that draws nothing). With `torch_generator`, torch's global
    generator is seeded from all the keys too, for a model that draws from it: exact on a rerun
    of the same batch, not row by row."""

    _in_flight: torch.Tensor | None = None

    def __init__(self, keys: torch.Tensor | None, *, torch_generator: bool = False) -> None:
        self.keys, self.torch_generator = keys, torch_generator
        self.outer: torch.Tensor | None = None

    def __enter__(self) -> None:
        if self.torch_generator and self.keys is not None:
            torch.manual_seed(int(_mix(self.keys.sum().reshape(1))[0]) & _MASK64)
        self.outer, Drawing._in_flight = Drawing._in_flight, self.keys

    def __exit__(self, *exc: object) -> None:
        Drawing._in_flight = self.outer


def draw_keys() -> torch.Tensor | None:
    """The row keys of the pass in flight (`Drawing`), None outside one (a direct call of the model)."""
    return Drawing._in_flight
