"""Square's random numbers and squares, batched over samples and steps, are the per-sample ones bit for bit.

The counter generator is checked against a pure-Python splitmix64, one sample and one number
at a time (the definition, slow); Square's block draws against a `draws.uniform` call per
step (how Square drew before); its square masks against a per-sample loop; and whole runs
against results recorded from the per-step version (commit ad4c800), so records do not move.
"""

from __future__ import annotations

import math

import pytest
import torch
from sklearn.datasets import load_digits

from advbench.core import sample_draws as rng
from advbench.core.square_search import RESAMPLES as _RESAMPLES
from advbench.core.square_search import SquareDraws as _Draws
from advbench.core.square_search import window as _window
from advbench.robustness.attacks.oracles import ScoreOracle
from advbench.robustness.attacks.score import Square, _corner
from advbench.robustness.models import build_model

_MASK = (1 << 64) - 1
_GOLDEN, _M1, _M2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def _mix(v: int) -> int:
    v = ((v ^ (v >> 30)) * _M1) & _MASK
    v = ((v ^ (v >> 27)) * _M2) & _MASK
    return v ^ (v >> 31)


def reference_bits(seed: int, sample: int, stream: int, domain: int, count: int) -> list[int]:
    """The generator's definition for one sample: unsigned 64-bit words, element by element."""
    key = _mix((seed * 0x100000001 + domain + _GOLDEN) & _MASK)
    key = _mix(key ^ ((sample * _GOLDEN + stream) & _MASK))
    key = _mix((key + stream * _M1) & _MASK)
    return [_mix((key + k * _GOLDEN) & _MASK) for k in range(1, count + 1)]


def reference_uniform(seed: int, ids: list[int], shape: tuple[int, ...], stream: int, dtype: torch.dtype) -> torch.Tensor:
    m = min(round(-math.log2(torch.finfo(dtype).eps)) + 1, 53)
    rows = [[(b >> (64 - m)) * 2.0 ** -m for b in reference_bits(seed, i, stream, rng._UNIFORM,
                                                                     math.prod(shape))] for i in ids]
    return torch.tensor(rows, dtype=torch.float64).to(dtype).reshape(len(ids), *shape)


IDS = [0, 3, 17, 2**40 + 5, -2]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
@pytest.mark.parametrize("stream", [0, 7, 2**32 + 3])
def test_uniform_is_the_per_sample_definition(stream: int, dtype: torch.dtype) -> None:
    got = rng.uniform(11, torch.tensor(IDS), (3, 2), stream, dtype=dtype)
    assert torch.equal(got, reference_uniform(11, IDS, (3, 2), stream, dtype))


def test_uniform_streams_are_each_streams_uniform() -> None:
    streams = torch.tensor([0, 1, 8, 2**32 + 3])
    got = rng.uniform_streams(5, torch.tensor(IDS), (4,), streams)
    assert got.shape == (len(IDS), 4, 4)
    for k, stream in enumerate(streams.tolist()):
        assert torch.equal(got[:, k], reference_uniform(5, IDS, (4,), stream, torch.float32))
    assert rng.uniform_streams(5, torch.tensor([], dtype=torch.long), (4,), streams).shape == (0, 4, 4)


def test_normal_is_box_muller_on_the_per_sample_words() -> None:
    bits = [reference_bits(2, i, 9, rng._NORMAL, 6) for i in IDS]
    u = torch.tensor([[(b >> 11) * 2.0 ** -53 for b in row] for row in bits], dtype=torch.float64)
    z = torch.sqrt(-2.0 * torch.log(1.0 - u[:, :3])) * torch.cos(2.0 * math.pi * u[:, 3:])
    assert torch.equal(rng.normal(2, torch.tensor(IDS), (3,), 9), z.float())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_block_draws_are_the_per_step_draws_as_samples_leave(dtype: torch.dtype) -> None:
    """Square's linf numbers: stream 2t places, 2t + 1 colours; rows dropped mid-block and across blocks."""
    seed, sample_id, c, last = 4, torch.tensor([9, 2, 40, 7, 13, 100]), 3, 70
    draws = _Draws(seed, sample_id, 2, (_RESAMPLES, c), torch.zeros(1, dtype=dtype), last, lambda u: u < 0.5)
    rows = torch.arange(len(sample_id))
    for t in range(1, last + 1):
        place, minus = draws.at(t, rows)
        ids = sample_id[rows]
        assert torch.equal(place, rng.uniform(seed, ids, (2,), 2 * t))
        assert torch.equal(minus, rng.uniform(seed, ids, (_RESAMPLES, c), 2 * t + 1, dtype=dtype) < 0.5)
        if t in (5, 33, 50):                       # mid-block, at a block's first step, and again
            keep = torch.ones(len(rows), dtype=torch.bool)
            keep[t % len(rows)] = False
            rows = rows[keep]
            draws.keep(keep)


@pytest.mark.parametrize("s,h,w", [(1, 8, 8), (3, 8, 8), (7, 8, 8), (4, 10, 6), (2, 5, 9)])
def test_window_is_the_per_sample_square(s: int, h: int, w: int) -> None:
    u = torch.cat([rng.uniform(0, torch.arange(40), (2,), 1), torch.tensor([[0.0, 0.0], [1 - 2**-24, 1 - 2**-24]])])
    got = _window(u[:, 0], u[:, 1], s, h, w)
    want = torch.zeros(len(u), 1, h, w, dtype=torch.bool)
    for i in range(len(u)):
        top, left = int(_corner(u[i, 0], h - s)), int(_corner(u[i, 1], w - s))
        want[i, 0, top:top + s, left:left + s] = True
    assert torch.equal(got, want)


def _digits() -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    x = torch.tensor(load_digits().images[:16], dtype=torch.float32).unsqueeze(1) / 16.0
    return build_model("small_cnn", num_classes=10, in_channels=1).eval(), x


def _colour() -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(1)
    x = torch.rand(12, 3, 10, 10, generator=torch.Generator().manual_seed(2))
    return build_model("small_cnn", num_classes=10, in_channels=3).eval(), x


# Square(n_queries=200) as committed at ad4c800 (a uniform call per stream per step): each
# sample's first_success and the sum of x_adv, on random-weight nets labelling their own inputs.
# first_success and the queries are compared exactly; the sum to SUM_REL, relative: CPU float results
# are not bit-reproducible across machines (vector width, oneDNN's kernels), and on another CPU the l2
# sums moved by up to 1e-8 (the score-budget runs by 3.5e-7), with the same first_success. 1e-5 stays
# well above that and well below what a changed attack moves: one query less (199) moves these sums
# by 6e-4 to 6e-3, and a different draw changes first_success.
SUM_REL = 1e-5
RECORDED = {
    ("digits", "linf"): (0.05, False, 0, [94, 12, 3, -1, -1, 3, 44, -1, -1, -1, -1, -1, 67, 112, 5, -1],
                         323.6499997638166),
    ("digits", "l2"): (0.5, False, 0, [129, 1, 5, -1, 65, 1, 31, -1, -1, 24, -1, 61, 4, 5, 2, -1], 324.56075423795846),
    ("colour", "linf"): (0.2, True, 3, [23, 9, 6, 11, 6, 1, 29, 4, -1, 10, 13, 59], 1736.542786732316),
    ("colour", "l2"): (3.0, True, 3, [31, 1, 49, 52, 92, 37, 49, 16, -1, 21, 52, -1], 1770.9379848678363),
}


@pytest.mark.parametrize("data,norm", sorted(RECORDED))
def test_square_runs_as_recorded_from_the_per_step_draws(data: str, norm: str, one_thread) -> None:
    eps, targeted, seed, first, total = RECORDED[data, norm]
    model, x = _digits() if data == "digits" else _colour()
    with torch.inference_mode():
        y = model(x).argmax(dim=1)
    oracle = ScoreOracle(model, len(y))
    res = Square(n_queries=200, seed=seed)(oracle, x, y, eps=torch.full((len(y),), eps), norm=norm,
                                           target=(y + 1) % 10 if targeted else None, sample_id=torch.arange(len(y)))
    assert res.first_success.tolist() == first
    assert float(res.x_adv.double().sum()) == pytest.approx(total, rel=SUM_REL)
    assert torch.equal(oracle.queries, torch.where(res.success, res.first_success, 200))
