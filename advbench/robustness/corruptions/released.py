"""The released corrupted test sets as RobustBench lays them out, read as they are.

`<folder>/<corruption>.npy`: uint8 NHWC images, the five severities one after another (CIFAR-10-C:
50,000 = 5 × 10,000, severity s in rows (s - 1)·10,000 to s·10,000), and `<folder>/labels.npy`
beside them. Row (s - 1)·n + i is test image i at severity s, so a data set's sample id i is read
from there; the file's label must be the data set's, or the files are not of these images.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from advbench.core.errors import AdvbenchError
from advbench.robustness.corruptions import SEVERITIES


def _load(path: Path) -> np.ndarray:
    """The array in `path`, memory-mapped (a released file is 150 MB to 3 GB), or one line saying why not."""
    if not path.is_file():
        raise AdvbenchError(f"no released file '{path}' (RobustBench's layout: <folder>/<corruption>.npy and "
                            "<folder>/labels.npy, e.g. CIFAR-10-C/)")
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise AdvbenchError(f"'{path}' is not a readable .npy file: {exc}") from None


def read_released(folder: str | Path, name: str, severity: int, sample_id: torch.Tensor,
                  labels: torch.Tensor) -> torch.Tensor:
    """The images of `sample_id` with corruption `name` at `severity`, (N, C, H, W) floats in [0, 1]."""
    folder = Path(folder).expanduser()
    images, file_labels = _load(folder / f"{name}.npy"), _load(folder / "labels.npy")
    if images.dtype != np.uint8 or images.ndim != 4 or len(images) % len(SEVERITIES):
        raise AdvbenchError(f"'{folder / name}.npy' holds {images.dtype} {tuple(images.shape)}, expected uint8 "
                            "images (5 × n, H, W, C): the five severities one after another")
    per = len(images) // len(SEVERITIES)
    ids = sample_id.cpu().numpy().astype(np.int64)
    if len(ids) and (ids.min() < 0 or ids.max() >= per):
        raise AdvbenchError(f"'{folder / name}.npy' holds {per} images per severity; the data set's sample ids "
                            f"run to {ids.max()}")
    rows = (severity - 1) * per + ids
    if len(file_labels) != len(images) or not np.array_equal(file_labels[rows], labels.cpu().numpy()):
        raise AdvbenchError(f"the labels in '{folder / 'labels.npy'}' are not the data set's for these samples: "
                            "the released files are of other images (or another order)")
    return torch.from_numpy(np.ascontiguousarray(images[rows])).permute(0, 3, 1, 2).float() / 255
