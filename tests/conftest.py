"""Shared fixtures: a tiny digits classifier trained in a second, used by attack tests."""

from __future__ import annotations

import pytest
import torch
from sklearn.datasets import load_digits
from torch import nn


class TinyNet(nn.Module):
    """A small conv net on 8x8 digits; inputs in [0, 1], logits out."""

    bounds = (0.0, 1.0)
    randomized = False

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1, stride=2), nn.ReLU(),
            nn.Flatten(), nn.Linear(32 * 16, 10),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net((x - 0.3) / 0.4)


@pytest.fixture(scope="session")
def digits_tensors() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(d.target, dtype=torch.long)
    g = torch.Generator().manual_seed(0)
    perm = torch.randperm(len(x), generator=g)
    train, test = perm[:1300], perm[1300:]
    return x[train], y[train], x[test], y[test]


@pytest.fixture(scope="session")
def tiny_model(digits_tensors) -> TinyNet:
    xtr, ytr, _, _ = digits_tensors
    torch.manual_seed(0)
    model = TinyNet()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(15):
        for i in range(0, len(xtr), 64):
            opt.zero_grad()
            nn.functional.cross_entropy(model(xtr[i:i + 64]), ytr[i:i + 64]).backward()
            opt.step()
    return model.eval()
