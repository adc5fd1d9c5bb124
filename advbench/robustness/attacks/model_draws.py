"""The draws of randomized models, keyed per row by (sample id, call index).

The numbers themselves come from the counter generator of `advbench.core.sample_draws`.
"""

from __future__ import annotations

import torch

from advbench.core.runtime import pieces
from advbench.core.sample_draws import GOLDEN, M1, MASK64, as_int64, mix

# Draws of randomized models (`defenses.wrappers`), keyed per row by (sample id, call index): the
# k-th forward pass that includes a sample draws the same noise whatever the batch, the chunk, the
# process (a resume) or the other rows of the call.

_CALLS = as_int64(0xD6E8FEB86659FD93)


def call_keys(sample_id: torch.Tensor, call: torch.Tensor) -> torch.Tensor:
    """(n,) int64 keys of (sample_id[i], call[i]): a randomized model's draw of one row in one pass."""
    return mix(mix(sample_id.to(torch.int64) * GOLDEN + _CALLS) + call.to(torch.int64) * M1)


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

    def calls_of(self, model: object, rows: torch.Tensor, copies: list[int]) -> list[Drawing]:
        """The contexts of consecutive calls of `model` over batch rows `rows`, call i stacking
        `copies[i]` copies of them: what `pass_of` gives each call in turn, with every call's keys
        taken at once (a vote or an EOT gradient of k calls draws k times, and on a model on torch's
        generator its passes go one call each: the keys of a call cost as much as a small forward)."""
        if not getattr(model, "randomized", False):
            return [Drawing(None) for _ in copies]
        keys = self.take(stacked(rows, sum(copies))).split([c * rows.shape[0] for c in copies])
        if getattr(model, "keyed_draws", False):
            return [Drawing(k) for k in keys]
        seeds = mix(torch.stack([k.sum() for k in keys])).tolist()  # one host read for every call's seed
        return [Drawing(k, torch_generator=True, seed=seed & MASK64) for k, seed in zip(keys, seeds)]


class Drawing:
    """While open, the randomized model's forward pass in flight draws row i with `keys[i]`
    (`draw_keys`; None: a pass that draws nothing). With `torch_generator`, torch's global
    generator is seeded from all the keys too (`seed`, when the caller has it already), for a
    model that draws from it: exact on a rerun of the same batch, not row by row."""

    _in_flight: torch.Tensor | None = None

    def __init__(self, keys: torch.Tensor | None, *, torch_generator: bool = False, seed: int | None = None) -> None:
        self.keys, self.torch_generator, self.seed = keys, torch_generator, seed
        self.outer: torch.Tensor | None = None

    def __enter__(self) -> None:
        if self.torch_generator and self.keys is not None:
            seed_torch(int(mix(self.keys.sum().reshape(1))[0]) & MASK64 if self.seed is None else self.seed)
        self.outer, Drawing._in_flight = Drawing._in_flight, self.keys

    def __exit__(self, *exc: object) -> None:
        Drawing._in_flight = self.outer


def seed_torch(seed: int) -> None:
    """torch's CPU generator and, once CUDA is initialised, every CUDA generator seeded with `seed`:
    what `torch.manual_seed` seeds for a model on either device, without queueing the seed for
    devices not started (CUDA, XPU, MTIA), which formats the call stack each time: 0.3 ms a pass."""
    torch.random.default_generator.manual_seed(seed)
    if torch.cuda.is_initialized():
        torch.cuda.manual_seed_all(seed)


def draw_keys() -> torch.Tensor | None:
    """The row keys of the pass in flight (`Drawing`), None outside one (a direct call of the model)."""
    return Drawing._in_flight


STACKED_ON = ("cuda",)
"""Device types on which a model's passes go stacked as copies in one call (`eot_copies`) as many as
the call's rows allow. On CUDA one call of k copies fills a device that a shrinking active set leaves
idle and launches its kernels once."""

CPU_STACK_ELEMENTS = 1 << 17
"""Elsewhere (the CPU), the most input elements one call of stacked copies takes: 42 CIFAR-size
rows, 2,048 digits. A pass's fixed cost (the wrapper's draws and row keys, the call itself) is most
of a small call's, so few rows gain most from stacking (20 draws of 4 CIFAR-size rows: 0.37× the
time of a call a draw, of 4 digits 0.02×); beyond, the cost per row rises once a call's
activations outgrow the caches (20 draws of 64 CIFAR-size rows, ResNet-8 of width 8, one thread:
2.2× stacked)."""


def eot_copies(model: object, passes: int, x: torch.Tensor, cap: int) -> int:
    """How many of `passes` passes at `x` one call of `model` takes as stacked copies: as many as fit
    in `cap` rows (at least one), on a device not in `STACKED_ON` also in `CPU_STACK_ELEMENTS`.

    A model drawing per row from its keys (`keyed_draws`, the defense wrappers) draws in one
    call of k copies exactly what k calls draw (`RowCalls.take` gives the j-th copy of a row the
    j-th call index), and a deterministic one has nothing to draw. A randomized model on torch's
    generator gets one call a pass, as before: it may draw once for a whole batch (one random
    crop for every row), which stacked copies would share, so the passes would not be independent.
    """
    rows = x.shape[0]
    if rows == 0 or (getattr(model, "randomized", False) and not getattr(model, "keyed_draws", False)):
        return 1
    if x.device.type not in STACKED_ON:
        cap = min(cap, CPU_STACK_ELEMENTS // max(1, x[0].numel()))
    return max(1, min(passes, cap // rows))


def copy_counts(passes: int, copies: int) -> list[int]:
    """The copies each call stacks when `passes` passes go `copies` a call at most (`pieces`' near-equal split)."""
    return [min(s.stop, passes) - s.start for s in pieces(passes, copies)]


def stacked(t: torch.Tensor, copies: int) -> torch.Tensor:
    """`copies` copies of `t` one after another along its first dimension; `t` itself for one."""
    return t if copies == 1 else t.repeat(copies, *[1] * (t.dim() - 1))
