"""A user's own evaluation data as an `ImageDataset`: a pair of tensors, or a torch `Dataset` of (x, y).

The Python API takes data a script already holds; sample ids are positions, so a rerun on the
same tensors keys and resumes its cells like any shipped data set, and the content digest of
the images and labels stands for the data set's configuration in the cell key.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch.utils.data import Dataset

from advbench.core.digests import tensor_digest
from advbench.core.errors import AdvbenchError
from advbench.robustness.data.image_dataset import ImageDataset, TensorImageSet


class TensorData(ImageDataset):
    """Images (N, C, H, W) floats in [0, 1] and labels (N,) held in memory, for evaluation only."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, *, name: str = "tensors",
                 num_classes: int | None = None, budgets: Mapping[str, Any] | None = None) -> None:
        super().__init__(name, budgets)
        _check_images(images)
        labels = torch.as_tensor(labels)
        if labels.shape != (images.shape[0],) or labels.is_floating_point():
            raise AdvbenchError(f"data labels must be whole numbers, one per image ({images.shape[0]}), "
                                f"got shape {tuple(labels.shape)}")
        self.images, self.labels = images.detach().cpu(), labels.cpu().long()
        self.num_classes = int(num_classes if num_classes is not None else int(self.labels.max()) + 1)
        if len(self.labels) and (int(self.labels.min()) < 0 or int(self.labels.max()) >= self.num_classes):
            raise AdvbenchError(f"data labels must lie in 0..{self.num_classes - 1} for {self.num_classes} classes "
                                f"(num_classes=, else the logits the model returns per image), got "
                                f"{int(self.labels.min())}..{int(self.labels.max())}: a classifier returns one "
                                "logit per class")
        self.input_shape = tuple(int(s) for s in images.shape[1:])  # type: ignore[assignment]

    @classmethod
    def of(cls, data: Any, **options: Any) -> TensorData:
        """From `(x, y)` tensors or a `Dataset` whose items start with (x, y)."""
        if isinstance(data, (tuple, list)) and len(data) == 2:
            return cls(data[0], data[1], **options)
        if isinstance(data, Dataset):
            items = [data[i] for i in range(len(data))]  # type: ignore[arg-type]
            if not items:
                raise AdvbenchError("data is an empty Dataset")
            return cls(torch.stack([torch.as_tensor(item[0]) for item in items]),
                       torch.tensor([int(item[1]) for item in items]), **options)
        raise AdvbenchError(f"data must be a data set option name, a torch Dataset of (x, y) or a pair of tensors "
                            f"(x, y); got {type(data).__name__}")

    def identity(self) -> dict[str, str]:
        """What stands for the data set's configuration in a cell key: the content of images and labels."""
        return {"images_sha256": tensor_digest(self.images), "labels_sha256": tensor_digest(self.labels)}

    def eval_set(self) -> Dataset:
        return TensorImageSet(self.images, self.labels, 1.0, sample_ids=torch.arange(len(self.labels)))

    def train_set(self, augment: bool = True) -> Dataset:
        raise AdvbenchError("data handed to advbench.evaluate is for evaluation only; train with a data set option")


def _check_images(images: Any) -> None:
    """Images a model can be attacked on: a non-empty float tensor (N, C, H, W), finite, in [0, 1]."""
    if not isinstance(images, torch.Tensor) or images.dim() != 4:
        shape = tuple(images.shape) if isinstance(images, torch.Tensor) else type(images).__name__
        raise AdvbenchError(f"data images must be a float tensor (N, C, H, W) in [0, 1], got {shape}")
    if not images.is_floating_point():
        hint = " (uint8 pixels: divide by 255)" if images.dtype == torch.uint8 else ""
        raise AdvbenchError(f"data images must be floats in [0, 1], got dtype {str(images.dtype).removeprefix('torch.')}"
                            f"{hint}")
    if not images.shape[0]:
        raise AdvbenchError("data holds no images: give at least one (x, y) pair")
    if not bool(torch.isfinite(images).all()):
        raise AdvbenchError(f"data images must be finite; {int((~torch.isfinite(images)).sum())} values are NaN or "
                            "infinite")
    if float(images.min()) < 0 or float(images.max()) > 1:
        raise AdvbenchError("data images must lie in [0, 1]; normalisation belongs to the model (mean=, std=)")
