"""CIFAR-10 from torchvision's on-disk format (`<root>/cifar-10-batches-py/*` pickles).

The batches are pickles, so they are read with an unpickler that only admits the numpy
array machinery: a data file someone hands you cannot run code, like a checkpoint cannot.
"""

from __future__ import annotations

import pickle
import socket
import urllib.error
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from advbench.core.errors import DISK_ERRNOS, AdvbenchError, disk_error
from advbench.robustness.data.image_dataset import ImageDataset, RandomShift, TensorImageSet

FOLDER = "cifar-10-batches-py"
TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_BATCH = "test_batch"
# What numpy 1.x/2.x pickles reference to rebuild an array (protocol 5 uses `_frombuffer`,
# protocol 2 written by Python 3 encodes the raw bytes with `_codecs.encode`).
_ALLOWED = {
    *((f"numpy.{core}.multiarray", "_reconstruct") for core in ("core", "_core")),
    *((f"numpy.{core}.numeric", "_frombuffer") for core in ("core", "_core")),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("_codecs", "encode"),
}


class _ArrayUnpickler(pickle.Unpickler):
    """Unpickler that resolves only the globals needed to rebuild numpy arrays."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _ALLOWED:
            raise pickle.UnpicklingError(f"global '{module}.{name}' is not allowed in a CIFAR-10 batch")
        return super().find_class(module, name)


def read_batch(path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """One batch file -> (uint8 images N x 3 x 32 x 32, int64 labels)."""
    try:
        with open(path, "rb") as fh:
            entry = _ArrayUnpickler(fh, encoding="latin1").load()
        data = np.asarray(entry["data"], dtype=np.uint8).reshape(-1, 3, 32, 32)
        labels = np.asarray(entry["labels"], dtype=np.int64)
    except (pickle.UnpicklingError, EOFError, KeyError, TypeError, ValueError) as exc:
        raise AdvbenchError(f"'{path}' is not a CIFAR-10 batch (expected a pickle with 'data' and 'labels'): {exc}") from None
    if len(labels) != len(data) or labels.min(initial=0) < 0 or labels.max(initial=0) > 9:
        raise AdvbenchError(f"'{path}' is not a CIFAR-10 batch: {len(data)} images, {len(labels)} labels in 0..9 expected")
    return torch.from_numpy(data.copy()), torch.from_numpy(labels)


class CIFAR10(ImageDataset):
    """3x32x32 CIFAR-10; the eval set is the official 10,000-image test batch, id = its index."""

    num_classes = 10
    input_shape = (3, 32, 32)

    def __init__(
        self,
        root: str,
        name: str = "cifar10",
        budgets: Mapping[str, Any] | None = None,
        n_samples: int | None = None,
        download: bool = False,
    ) -> None:
        super().__init__(name, budgets, n_samples)
        self.folder = Path(root).expanduser() / FOLDER
        if download:
            self._download(Path(root).expanduser())
        if not (self.folder / TEST_BATCH).is_file():
            raise AdvbenchError(
                f"CIFAR-10 not found: expected '{self.folder / TEST_BATCH}' (torchvision's python format); "
                f"set dataset.root=<folder holding {FOLDER}> or fetch it with dataset.download=true"
            )

    @staticmethod
    def _download(root: Path) -> None:
        """Fetch and unpack the archive with torchvision (only when the user asks)."""
        from torchvision.datasets import CIFAR10 as TorchvisionCIFAR10

        instead = ("download it where there is a network (https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz), "
                   f"unpack it and set dataset.root=<folder holding {FOLDER}> without dataset.download")
        try:
            TorchvisionCIFAR10(str(root), train=False, download=True)
        except (urllib.error.URLError, socket.timeout, ConnectionError) as exc:
            reason = getattr(exc, "reason", None) or exc
            raise AdvbenchError(f"CIFAR-10 download failed: no network ({reason}); {instead}") from None
        except OSError as exc:
            if exc.errno in DISK_ERRNOS:
                raise disk_error(exc) from None
            raise AdvbenchError(f"CIFAR-10 download failed ({exc}); {instead}") from None
        except RuntimeError as exc:  # torchvision: the archive's checksum does not match
            raise AdvbenchError(f"CIFAR-10 download failed: {exc}; {instead}") from None

    def eval_set(self) -> TensorImageSet:
        images, labels = read_batch(self.folder / TEST_BATCH)
        n = self._first_n(len(labels))
        return TensorImageSet(images[:n], labels[:n], 255.0, sample_ids=torch.arange(n))

    def train_set(self, augment: bool = True) -> TensorImageSet:
        missing = [b for b in TRAIN_BATCHES if not (self.folder / b).is_file()]
        if missing:
            raise AdvbenchError(
                f"CIFAR-10 training batches missing in '{self.folder}': {', '.join(missing)}; "
                "fetch the full set with dataset.download=true"
            )
        parts = [read_batch(self.folder / b) for b in TRAIN_BATCHES]
        images = torch.cat([p[0] for p in parts])
        labels = torch.cat([p[1] for p in parts])
        shift = RandomShift(pad=4, flip=True) if augment else None
        return TensorImageSet(images, labels, 255.0, transform=shift)
