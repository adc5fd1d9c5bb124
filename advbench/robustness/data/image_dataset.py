"""The data-set contract shared by every benchmark data set, plus in-memory helpers.

Attacks and the engine only see `ImageDataset`; each concrete class turns its on-disk format
into float images in [0, 1] with stable sample ids, so records from different runs (and
machines) refer to the same images.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

import torch
from torch.utils.data import Dataset

from advbench.core.errors import AdvbenchError


class ImageDataset(ABC):
    """A classification data set with a fixed evaluation split.

    `name` is the option name the user chose (it lands in records and checkpoint paths),
    `budgets` the default perturbation budgets of the data set (`linf`, `l2`,
    `l2_normalized`), and `n_samples` keeps only the first n evaluation images of the fixed
    order so that small smoke runs are deterministic.
    """

    num_classes: int
    input_shape: tuple[int, int, int]
    trains_on_first_use: bool = False
    """Whether a missing checkpoint of a model on this data set is trained when first asked for
    (seconds on a CPU), rather than named as the `advbench train` line that makes it."""

    def __init__(self, name: str, budgets: Mapping[str, Any] | None = None, n_samples: int | None = None) -> None:
        if n_samples is not None and n_samples < 1:
            raise AdvbenchError(f"dataset n_samples must be >= 1 or null, got {n_samples}")
        self.name = name
        self.budgets: dict[str, Any] = dict(budgets or {})
        self.n_samples = n_samples

    @abstractmethod
    def eval_set(self) -> Dataset:
        """Items `(x: FloatTensor[C,H,W] in [0,1], y: int, sample_id: int)`."""

    @abstractmethod
    def train_set(self, augment: bool = True) -> Dataset:
        """Items `(x, y)`; `augment` adds the data set's usual random augmentation."""

    def _first_n(self, count: int) -> int:
        """How many evaluation items to keep out of `count`."""
        return count if self.n_samples is None else min(self.n_samples, count)


class RandomShift:
    """Translate by up to `pad` pixels (zero fill), optionally with a horizontal flip.

    The classic CIFAR augmentation (pad 4 + random crop + flip), written as one tensor op per
    image so it works on any in-memory data set without PIL round trips.
    """

    def __init__(self, pad: int, flip: bool) -> None:
        self.pad = pad
        self.flip = flip

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        _, h, w = x.shape
        padded = torch.nn.functional.pad(x, (self.pad,) * 4)
        dy, dx = torch.randint(0, 2 * self.pad + 1, (2,)).tolist()
        out = padded[:, dy : dy + h, dx : dx + w]
        if self.flip and torch.rand(()) < 0.5:
            out = out.flip(-1)
        return out


class TensorImageSet(Dataset):
    """Images held as a uint8 or float tensor, scaled to [0, 1] on access.

    Keeping uint8 (CIFAR) costs a quarter of the memory of float32; `scale` is the value that
    maps to 1.0 (255 for bytes, 16 for the digits' grey levels).
    """

    def __init__(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        scale: float,
        sample_ids: torch.Tensor | None = None,
        transform: RandomShift | None = None,
    ) -> None:
        if len(images) != len(labels) or (sample_ids is not None and len(sample_ids) != len(images)):
            raise ValueError(f"images, labels and ids differ in length: {len(images)}, {len(labels)}")
        self.images = images
        self.labels = labels.to(torch.int64)
        self.scale = scale
        self.sample_ids = sample_ids
        self.transform = transform

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple:
        x = self.images[index].to(torch.float32) / self.scale
        if self.transform is not None:
            x = self.transform(x)
        y = int(self.labels[index])
        if self.sample_ids is None:
            return x, y
        return x, y, int(self.sample_ids[index])
