"""scikit-learn's bundled 8x8 handwritten digits: the offline default data set.

It ships inside scikit-learn, so the whole benchmark (training included) runs without any
download; a small CNN trains on it in seconds on a CPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from advbench.robustness.data.base import ImageDataset, RandomShift, TensorImageSet

GREY_LEVELS = 16.0  # pixel values are integers 0..16


class Digits(ImageDataset):
    """1x8x8 digits, fixed stratified train/test split; sample id = index in `load_digits()`."""

    num_classes = 10
    input_shape = (1, 8, 8)

    def __init__(
        self,
        name: str = "digits",
        budgets: Mapping[str, Any] | None = None,
        n_samples: int | None = None,
        test_fraction: float = 0.3,
        split_seed: int = 0,
    ) -> None:
        super().__init__(name, budgets, n_samples)
        bunch = load_digits()
        images = torch.from_numpy(bunch.images.astype(np.float32)).unsqueeze(1)
        labels = torch.from_numpy(bunch.target.astype(np.int64))
        train_idx, test_idx = train_test_split(
            np.arange(len(labels)), test_size=test_fraction, stratify=bunch.target, random_state=split_seed
        )
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
