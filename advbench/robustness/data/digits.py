"""scikit-learn's bundled 8x8 handwritten digits: the offline default data set.

It ships inside scikit-learn, so the whole benchmark (training included) runs without any
download; a small CNN trains on it in seconds on a CPU. The file is read, and the split drawn,
without importing scikit-learn: its import pulls in SciPy, over a second of every run's start.
`load_digits` and `stratified_split` give exactly what `sklearn.datasets.load_digits` and
`train_test_split(..., stratify=...)` give (tests/test_startup.py compares them), so sample ids
and trained checkpoints stay those of earlier releases.
"""

from __future__ import annotations

import gzip
import importlib.util
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from advbench.core.errors import AdvbenchError
from advbench.robustness.data.image_dataset import ImageDataset, RandomShift, TensorImageSet

GREY_LEVELS = 16.0  # pixel values are integers 0..16


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """The images (n, 8, 8, float64) and labels (int) of `sklearn.datasets.load_digits()`, read the same way."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise AdvbenchError("dataset=digits reads the digits bundled with scikit-learn: pip install scikit-learn")
    path = Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / "digits.csv.gz"
    with gzip.open(path, mode="rt", encoding="utf-8") as file:
        data = np.loadtxt(file, delimiter=",")
    return data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(int, copy=False)


def stratified_split(labels: np.ndarray, test_fraction: float, seed: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Train and test indices as `train_test_split(arange(n), test_size=test_fraction, stratify=labels,
    random_state=seed)`: scikit-learn's StratifiedShuffleSplit, with its random draws in the same order."""
    if isinstance(test_fraction, bool) or not isinstance(test_fraction, float) or not 0 < test_fraction < 1:
        raise AdvbenchError(f"dataset test_fraction must be a fraction between 0 and 1, got {test_fraction}")
    n_test = math.ceil(test_fraction * len(labels))
    n_train = len(labels) - n_test
    classes, inverse, counts = np.unique(labels, return_inverse=True, return_counts=True)
    if min(n_train, n_test) < len(classes):
        raise AdvbenchError(f"dataset test_fraction {test_fraction} leaves {n_train} training and {n_test} test "
                            f"samples: each split needs one per class ({len(classes)})")
    by_class = np.split(np.argsort(inverse, kind="stable"), np.cumsum(counts)[:-1])
    rng = np.random.RandomState(seed)
    n_i = _approximate_mode(counts, n_train, rng)
    t_i = _approximate_mode(counts - n_i, n_test, rng)
    shuffled = [members.take(rng.permutation(len(members)), mode="clip") for members in by_class]
    train = np.concatenate([s[:n] for s, n in zip(shuffled, n_i)])
    test = np.concatenate([s[n:n + t] for s, n, t in zip(shuffled, n_i, t_i)])
    return rng.permutation(train), rng.permutation(test)


def _approximate_mode(class_counts: np.ndarray, n_draws: int, rng: np.random.RandomState) -> np.ndarray:
    """Per-class draws: scikit-learn's `_approximate_mode` (floored shares, the remainder to the largest
    leftovers, ties broken at random)."""
    continuous = class_counts / class_counts.sum() * n_draws
    floored = np.floor(continuous)
    need_to_add = int(n_draws - floored.sum())
    if need_to_add <= 0:
        return floored.astype(int)
    remainder = continuous - floored
    for value in np.sort(np.unique(remainder))[::-1]:
        (tied,) = np.where(remainder == value)
        add_now = min(len(tied), need_to_add)
        floored[rng.choice(tied, size=add_now, replace=False)] += 1
        need_to_add -= add_now
        if need_to_add == 0:
            break
    return floored.astype(int)


class Digits(ImageDataset):
    """1x8x8 digits, fixed stratified train/test split; sample id = index in `load_digits()`."""

    num_classes = 10
    input_shape = (1, 8, 8)
    trains_on_first_use = True

    def __init__(
        self,
        name: str = "digits",
        budgets: Mapping[str, Any] | None = None,
        n_samples: int | None = None,
        test_fraction: float = 0.3,
        split_seed: int = 0,
    ) -> None:
        super().__init__(name, budgets, n_samples)
        pixels, target = load_digits()
        images = torch.from_numpy(pixels.astype(np.float32)).unsqueeze(1)
        labels = torch.from_numpy(target.astype(np.int64))
        train_idx, test_idx = stratified_split(target, test_fraction, split_seed)
        self._images, self._labels = images, labels
        self._train_idx = torch.from_numpy(train_idx)
        self._test_idx = torch.from_numpy(test_idx[: self._first_n(len(test_idx))])

    def eval_set(self) -> TensorImageSet:
        idx = self._test_idx
        return TensorImageSet(self._images[idx], self._labels[idx], GREY_LEVELS, sample_ids=idx)

    def train_set(self, augment: bool = True) -> TensorImageSet:
        idx = self._train_idx
        shift = RandomShift(pad=1, flip=False) if augment else None
        return TensorImageSet(self._images[idx], self._labels[idx], GREY_LEVELS, transform=shift)
