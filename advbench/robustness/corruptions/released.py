"""The released corrupted test sets, read as users have them, in either of their two layouts.

RobustBench's (CIFAR-10-C, CIFAR-100-C): `<folder>/<corruption>.npy`, uint8 NHWC images, the five
severities one after another (CIFAR-10-C: 50,000 = 5 × 10,000, severity s in rows (s - 1)·10,000
to s·10,000), and `<folder>/labels.npy` beside them. Row (s - 1)·n + i is test image i at severity
s, so a data set's sample id i is read from there; the file's label must be the data set's, or the
files are not of these images.

ImageNet-C's: `<folder>/<corruption>/<severity 1-5>/<wnid>/<file>.JPEG`, under the file names of the
ImageNet validation images. A class-folder data set's sample is matched by its path relative to the
data set's root (`<wnid>/<file>`), so its label is the folder's, as the clean image's is. Each
released image is the central 224×224 crop of Resize(256), i.e. the central 0.875 of the short
side; it is resized so that it frames what the data set's own Resize + CenterCrop frames
(`dataset.crop_fraction` of the short side at `dataset.image_size`): at 224 px and 0.875 that is the
image as it is.

The layout is told by what the folder holds: a `.npy` file is RobustBench's, folders of severities ImageNet-C's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torchvision import transforms

from advbench.core.errors import AdvbenchError
from advbench.core.keys import content_key, file_digest
from advbench.robustness.corruptions import NAMES, SEVERITIES
from advbench.robustness.data.folder import FolderImages

IMAGENET_C_FRACTION = 224 / 256
"""The part of each validation image's short side that ImageNet-C kept (Resize(256), CenterCrop(224))."""

LAYOUTS = "RobustBench's <folder>/<corruption>.npy with <folder>/labels.npy, or ImageNet-C's <folder>/<corruption>/<1-5>/<wnid>/<file>"


def layout(folder: str | Path) -> str:
    """`robustbench` where `folder` holds a .npy file, `imagenet-c` where it holds severity folders; else one line."""
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise AdvbenchError(f"threat.released folder '{folder}' not found (expected {LAYOUTS})")
    if any(folder.glob("*.npy")):
        return "robustbench"
    if any((p / str(s)).is_dir() for p in folder.iterdir() if p.is_dir() for s in SEVERITIES):
        return "imagenet-c"
    raise AdvbenchError(f"threat.released folder '{folder}' holds neither .npy files nor severity folders (expected {LAYOUTS})")


def present(folder: str | Path) -> list[str]:
    """The corruptions of the 15 that `folder` holds, in RobustBench's order."""
    folder = Path(folder).expanduser()
    if layout(folder) == "robustbench":
        return [n for n in NAMES if (folder / f"{n}.npy").is_file()]
    return [n for n in NAMES if (folder / n).is_dir()]


def released_identity(folder: str | Path, name: str, dataset: Any, ids: list[int]) -> dict[str, Any]:
    """What the cell's numbers depend on in the released files, so that another copy of them reuses the
    cell: RobustBench's, the sha256 of the corruption's file and of the labels; ImageNet-C's, a digest
    of the names and sizes of the 5 × n files the cell reads (hashing 5 × 50,000 JPEGs per corruption
    would cost as much as the run), after checking that each is there."""
    folder = Path(folder).expanduser()
    if layout(folder) == "robustbench":
        paths = [_present_file(folder / f"{name}.npy"), _present_file(folder / "labels.npy")]
        return {"source": "released", "file_sha256": file_digest(paths[0]), "labels_sha256": file_digest(paths[1])}
    rel = _relative_paths(dataset, ids)
    sizes = [[str(s), r, _present_file(folder / name / str(s) / r).stat().st_size] for s in SEVERITIES for r in rel]
    return {"source": "released", "layout": "imagenet-c", "files": content_key(sizes, length=64)}


def _present_file(path: Path) -> Path:
    if not path.is_file():
        raise AdvbenchError(f"no released file '{path}' (expected {LAYOUTS})")
    return path


def _load(path: Path) -> np.ndarray:
    """The array in `path`, memory-mapped (a released file is 150 MB to 3 GB), or one line saying why not."""
    try:
        return np.load(_present_file(path), mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise AdvbenchError(f"'{path}' is not a readable .npy file: {exc}") from None


def read_released(folder: str | Path, name: str, severity: int, sample_id: torch.Tensor,
                  labels: torch.Tensor, dataset: Any = None) -> torch.Tensor:
    """The images of `sample_id` with corruption `name` at `severity`, (N, C, H, W) floats in [0, 1];
    ImageNet-C's are matched through `dataset`'s files and framed as its clean images are."""
    folder = Path(folder).expanduser()
    if layout(folder) == "imagenet-c":
        paths = [(_present_file(folder / name / str(severity) / r), 0) for r in _relative_paths(dataset, sample_id.tolist())]
        images = FolderImages(paths, _framing(dataset))
        return torch.stack([images[i][0] for i in range(len(images))])
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


def _relative_paths(dataset: Any, ids: list[int]) -> list[str]:
    """`<class>/<file>` of each sample id: how ImageNet-C names the corrupted copy of that image."""
    if not hasattr(dataset, "files") or not hasattr(dataset, "root"):
        raise AdvbenchError(f"ImageNet-C's folders are matched to the data set's images by '<wnid>/<file>'; data set "
                            f"'{getattr(dataset, 'name', dataset)}' is not a class folder (dataset=imagenet or dataset=folder)")
    return [dataset.files[int(i)][0].relative_to(dataset.root).as_posix() for i in ids]


def _framing(dataset: Any) -> Callable:
    """Resize + CenterCrop taking an ImageNet-C image to the framing of the data set's clean image."""
    size, fraction = dataset.image_size, dataset.crop_fraction
    if fraction > IMAGENET_C_FRACTION + 1e-9:
        raise AdvbenchError(f"dataset.crop_fraction={fraction} frames more of each image than ImageNet-C kept (the central "
                            f"{IMAGENET_C_FRACTION} of the short side); set dataset.crop_fraction<={IMAGENET_C_FRACTION}")
    return transforms.Compose([transforms.Resize(round(size * IMAGENET_C_FRACTION / fraction)),
                               transforms.CenterCrop(size), transforms.ToTensor()])
