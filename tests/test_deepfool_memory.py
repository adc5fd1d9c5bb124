"""DeepFool's candidate backwards on the CPU take at most `CPU_GRAD_ELEMENTS` input elements
(their activations grow with the input), and the smaller backwards give one backward's results."""

from __future__ import annotations

import pytest
import torch
from test_chunked_probes import assert_same, rows_seen
from torch import nn

from advbench.robustness.attacks import minimum_norm
from advbench.robustness.attacks.attack_contract import AttackResult
from advbench.robustness.attacks.minimum_norm import DeepFool
from advbench.robustness.attacks.oracles import WhiteBoxOracle

pytestmark = pytest.mark.usefixtures("one_thread")

N = 16  # one forward under `grad_rows`' 256 rows; two of 8 samples under a cap of 8 CIFAR images' elements


def test_cifar_size_backwards_stay_under_the_element_cap_with_one_backwards_results(monkeypatch) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten(),
                          nn.Linear(64, 10)).eval()
    x = torch.rand(N, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        y = model(x).argmax(dim=1)
    cap = 8 * x[0].numel()

    def run(elements: int) -> tuple[AttackResult, list[int]]:
        monkeypatch.setattr(minimum_norm, "CPU_GRAD_ELEMENTS", elements)
        with rows_seen(model, backward=True)() as sizes:
            res = DeepFool(steps=3)(WhiteBoxOracle(model, N), x, y, eps=torch.full((N,), 1.0), norm="l2",
                                    sample_id=torch.arange(N))
        return res, sizes

    whole, s_whole = run(10 ** 9)
    cut, s_cut = run(cap)
    assert max(s_whole) == N and max(s_cut) * x[0].numel() <= cap < N * x[0].numel()
    assert sum(s_cut) == sum(s_whole)
    assert_same(whole, cut)
