"""The common corruptions: range and shape, severity, per-sample seeding, small images, the released files."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from advbench.core.errors import AdvbenchError
from advbench.robustness.corruptions import NAMES, SEVERITIES, corrupt, why_not
from advbench.robustness.corruptions.released import read_released

GENERATED = [n for n in NAMES if why_not(n, 32) is None]


def smooth_images(n: int, side: int, channels: int = 3, seed: int = 0) -> torch.Tensor:
    """Images with structure (blurred noise), not flat: blur and zoom must change them."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, channels, side // 4, side // 4, generator=g)
    return torch.nn.functional.interpolate(x, size=(side, side), mode="bilinear", align_corners=False)


@pytest.mark.parametrize("name", GENERATED)
def test_every_severity_keeps_range_and_shape(name: str) -> None:
    x = smooth_images(2, 32)
    for severity in SEVERITIES:
        out = corrupt(x, torch.tensor([3, 9]), name, severity, seed=0)
        assert out.shape == x.shape and out.dtype == x.dtype
        assert float(out.min()) >= 0.0 and float(out.max()) <= 1.0
        assert not torch.equal(out, (x * 255).round() / 255), f"{name} at severity {severity} changed nothing"


def test_a_sample_is_corrupted_alike_in_any_batch() -> None:
    x = smooth_images(4, 32)
    ids = torch.tensor([10, 11, 12, 13])
    for name in ("gaussian_noise", "shot_noise", "glass_blur", "snow", "fog", "elastic_transform"):
        whole = corrupt(x, ids, name, 3, seed=7)
        alone = corrupt(x[2:3], ids[2:3], name, 3, seed=7)
        assert torch.equal(whole[2:3], alone), name
        other = corrupt(x[2:3], ids[2:3], name, 3, seed=8)
        assert not torch.equal(other, alone), name


def test_small_images_get_what_applies_and_the_rest_is_refused_in_one_line() -> None:
    x = smooth_images(2, 8, channels=1)
    refused = {n for n in NAMES if why_not(n, 8) is not None}
    assert refused == {"motion_blur", "snow", "frost"}
    for name in sorted(set(NAMES) - refused):
        out = corrupt(x, torch.arange(2), name, 5, seed=0)
        assert out.shape == x.shape and 0 <= float(out.min()) <= float(out.max()) <= 1
    with pytest.raises(AdvbenchError, match=r"^motion_blur does not apply to 8-px images: [^\n]*$"):
        corrupt(x, torch.arange(2), "motion_blur", 1, seed=0)
    with pytest.raises(AdvbenchError, match="frost cannot be generated"):
        corrupt(smooth_images(1, 32), torch.arange(1), "frost", 1, seed=0)
    with pytest.raises(AdvbenchError, match="unknown corruption 'fogg'"):
        corrupt(x, torch.arange(2), "fogg", 1, seed=0)
    with pytest.raises(AdvbenchError, match="severity must be one of 1-5, got 6"):
        corrupt(x, torch.arange(2), "fog", 6, seed=0)


def test_severity_lowers_accuracy_of_a_non_robust_model() -> None:
    """A nearest-class-mean classifier of the digits: accuracy over the corruptions that apply to 8 px,
    averaged, falls with severity (Hendrycks & Dietterich's severities are ordered); one step may rise by
    less than one sample in 100 of the 300, the noise of a few samples."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32)[:, None] / 16
    y = torch.tensor(digits.target)
    means = torch.stack([x[y == k].mean(0) for k in range(10)])
    test = torch.arange(0, len(y), 6)

    def accuracy(images: torch.Tensor) -> float:
        d = ((images[:, None] - means[None]) ** 2).flatten(2).sum(-1)
        return float((d.argmin(1) == y[test]).float().mean())

    names = [n for n in NAMES if why_not(n, 8) is None]
    curve = [np.mean([accuracy(corrupt(x[test], test, n, s, seed=0)) for n in names]) for s in SEVERITIES]
    clean = accuracy(x[test])
    assert clean > curve[0]
    assert all(later <= earlier + 0.01 for earlier, later in zip(curve, curve[1:])), curve
    assert curve[4] < curve[0] - 0.05


def write_released(folder, name: str, images: np.ndarray, labels: np.ndarray) -> None:
    """Five severities of `images` (n, H, W, C) uint8, one after another, as RobustBench lays them out."""
    folder.mkdir(parents=True, exist_ok=True)
    np.save(folder / f"{name}.npy", images)
    np.save(folder / "labels.npy", labels)


def test_released_files_are_read_as_they_are(tmp_path) -> None:
    n = 6
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(5 * n, 32, 32, 3), dtype=np.uint8)
    labels = np.tile(rng.integers(0, 10, size=n), 5)
    write_released(tmp_path / "CIFAR-10-C", "fog", images, labels)
    ids = torch.tensor([1, 4])
    got = read_released(tmp_path / "CIFAR-10-C", "fog", 3, ids, torch.tensor(labels[[1, 4]]))
    want = torch.from_numpy(images[[2 * n + 1, 2 * n + 4]]).permute(0, 3, 1, 2).float() / 255
    assert torch.equal(got, want)
    with pytest.raises(AdvbenchError, match="not the data set's"):
        read_released(tmp_path / "CIFAR-10-C", "fog", 3, ids, torch.tensor(labels[[1, 4]]) + 1)
    with pytest.raises(AdvbenchError, match="no released file .*snow.npy"):
        read_released(tmp_path / "CIFAR-10-C", "snow", 3, ids, torch.tensor(labels[[1, 4]]))
    with pytest.raises(AdvbenchError, match="images per severity"):
        read_released(tmp_path / "CIFAR-10-C", "fog", 1, torch.tensor([n]), torch.tensor(labels[[0]]))
