"""Any class-folder image set (`<root>/<class>/<image>`), resized and centre-cropped.

Sample ids are indices into the sorted file list, so they survive reruns and machines. The
evaluation order is a seeded permutation of that list: `n_subset` fixes the benchmark
subset (ImageNet's 1000 images) and `n_samples` takes a class-mixed prefix for smoke runs.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable

import torch
from PIL import Image, UnidentifiedImageError
from torch.utils.data import Dataset
from torchvision import transforms

from advbench.core.errors import AdvbenchError
from advbench.robustness.data.image_dataset import ImageDataset

IMAGE_EXTENSIONS = (".jpeg", ".jpg", ".png", ".bmp", ".ppm", ".webp", ".tif", ".tiff")


def scan_class_folders(root: Path, what: str) -> tuple[list[str], list[tuple[Path, int]]]:
    """Sorted class names and sorted (file, label) pairs under `root`."""
    if not root.is_dir():
        raise AdvbenchError(f"{what} not found: expected class folders '{root}/<class>/<image>'; set dataset.root=<folder>")
    classes = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    files = [
        (f, label)
        for label, cls in enumerate(classes)
        for f in sorted((root / cls).iterdir())
        if f.is_file() and f.suffix.lower() in IMAGE_EXTENSIONS
    ]
    if not files:
        raise AdvbenchError(f"{what} at '{root}' holds no images: expected '<class>/<image>' with {', '.join(IMAGE_EXTENSIONS)}")
    if len(classes) < 2:  # one class trains to 100 % accuracy and nothing can be misclassified
        raise AdvbenchError(f"{what} at '{root}' has {len(classes)} class folder ({', '.join(classes)}); "
                            "a classifier needs at least two: '<root>/<class>/<image>'")
    return classes, files


class FolderImages(Dataset):
    """Decodes files on access; items `(x, y, id)` or `(x, y)` when `ids` is None."""

    def __init__(self, files: list[tuple[Path, int]], transform: Callable, ids: list[int] | None = None) -> None:
        self.files = files
        self.transform = transform
        self.ids = ids

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> tuple:
        path, label = self.files[index]
        try:
            with warnings.catch_warnings():
                # PIL only warns between its pixel limit and twice that; either way the file is refused
                warnings.simplefilter("error", Image.DecompressionBombWarning)
                with Image.open(path) as img:
                    x = self.transform(img.convert("RGB"))
        except (UnidentifiedImageError, OSError, Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
            raise AdvbenchError(f"cannot decode image '{path}': {exc}") from None
        if self.ids is None:
            return x, label
        return x, label, self.ids[index]


class ImageFolderDataset(ImageDataset):
    """Class-folder evaluation set; `train_root` (same layout) is needed only for training."""

    what = "image folder"

    def __init__(
        self,
        root: str,
        name: str = "folder",
        budgets: Mapping[str, Any] | None = None,
        n_samples: int | None = None,
        image_size: int = 224,
        crop_fraction: float = 0.875,
        n_subset: int | None = None,
        subset_seed: int = 0,
        num_classes: int | None = None,
        train_root: str | None = None,
    ) -> None:
        super().__init__(name, budgets, n_samples)
        if not 0.0 < crop_fraction <= 1.0:
            raise AdvbenchError(f"dataset crop_fraction must be in (0, 1], got {crop_fraction}")
        self.root = Path(root).expanduser()
        self.classes, self.files = scan_class_folders(self.root, self.what)
        if num_classes is not None and num_classes != len(self.classes):
            raise AdvbenchError(
                f"{self.what} '{self.root}' has {len(self.classes)} class folders, expected {num_classes} "
                "(labels are the indices of the sorted folder names)"
            )
        self.num_classes = len(self.classes)
        self.input_shape = (3, image_size, image_size)
        self.image_size = image_size
        self.crop_fraction = crop_fraction
        self.train_root = train_root
        order = torch.randperm(len(self.files), generator=torch.Generator().manual_seed(subset_seed))
        if n_subset is not None:
            order = order[:n_subset]
        self.order: list[int] = order[: self._first_n(len(order))].tolist()

    def _eval_transform(self) -> Callable:
        return transforms.Compose(
            [
                transforms.Resize(round(self.image_size / self.crop_fraction)),
                transforms.CenterCrop(self.image_size),
                transforms.ToTensor(),
            ]
        )

    def eval_set(self) -> FolderImages:
        return FolderImages([self.files[i] for i in self.order], self._eval_transform(), ids=self.order)

    def train_set(self, augment: bool = True) -> FolderImages:
        if self.train_root is None:
            raise AdvbenchError(f"{self.what} '{self.root}' is an evaluation set; set dataset.train_root=<class folders> to train")
        classes, files = scan_class_folders(Path(self.train_root).expanduser(), f"{self.what} training split")
        if classes != self.classes:
            raise AdvbenchError(f"training folders of '{self.train_root}' differ from the evaluation classes of '{self.root}'")
        if not augment:
            return FolderImages(files, self._eval_transform())
        augmentation = transforms.Compose(
            [transforms.RandomResizedCrop(self.image_size), transforms.RandomHorizontalFlip(), transforms.ToTensor()]
        )
        return FolderImages(files, augmentation)
