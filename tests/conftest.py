"""Shared fixtures: a tiny digits classifier trained in a second, used by attack tests."""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from pathlib import Path

import numpy as np
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


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """For modules of tiny-batch tests: intra-op threads only add overhead, and thrash a busy CPU."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


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


@pytest.fixture(scope="session")
def substitute(digits_tensors, tiny_model) -> nn.Module:
    """The target's architecture trained with another seed and data order: the attacker's own model
    under transfer threats."""
    xtr, ytr, _, _ = digits_tensors
    torch.manual_seed(1)
    model = type(tiny_model)()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    order = torch.randperm(len(xtr), generator=torch.Generator().manual_seed(1))
    xtr, ytr = xtr[order], ytr[order]
    for _ in range(15):
        for i in range(0, len(xtr), 64):
            opt.zero_grad()
            nn.functional.cross_entropy(model(xtr[i:i + 64]), ytr[i:i + 64]).backward()
            opt.step()
    return model.eval().requires_grad_(False)


def write_fake_cifar(root: Path, per_batch: int = 4) -> Path:
    """CIFAR-10 in torchvision's real python-pickle layout, a few random images per file."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for name in [*(f"data_batch_{i}" for i in range(1, 6)), "test_batch"]:
        entry = {
            "batch_label": f"fake {name}",
            "labels": rng.integers(0, 10, per_batch).tolist(),
            "data": rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8),
            "filenames": [f"img_{i}.png" for i in range(per_batch)],
        }
        with open(folder / name, "wb") as fh:
            pickle.dump(entry, fh)
    with open(folder / "batches.meta", "wb") as fh:
        pickle.dump({"label_names": [f"class{i}" for i in range(10)], "num_cases_per_batch": per_batch}, fh)
    return root


@pytest.fixture(scope="session")
def fake_cifar_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_fake_cifar(tmp_path_factory.mktemp("cifar"))


@pytest.fixture(scope="session")
def trained_digits_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache folder holding a natural digits small_cnn, trained briefly once per session."""
    from advbench.cli.config import compose_config
    from advbench.cli.spec_builder import train_main

    cache = tmp_path_factory.mktemp("cache")
    cfg = compose_config("train", ["defense=natural", "defense.recipe.epochs=4", f"cache_dir={cache}"])
    train_main(cfg)
    return cache
