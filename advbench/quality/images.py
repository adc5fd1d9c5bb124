"""Still images for UAP training and evaluation: any image folder, or the offline sample photos.

The seed trains its 256x256 perturbation on COCO crops; without a download the default data are
the natural photos that scikit-image ships (`skimage.data`), cut into overlapping 256x256
crops. The photos are split once, by photo, so that a metric or UAP fitted on one split is
always judged on photos it never saw:

* ``train``: camera, chelsea, rocket, coins, moon, grass, gravel, brick, hubble_deep_field,
  immunohistochemistry, retina, cell (12 photos; also the NIQE pristine set and CNNQA's
  training photos);
* ``test``: astronaut, coffee, and both views of stereo_motorcycle (4 photos).
"""

from __future__ import annotations

import math
import warnings
from functools import lru_cache
from pathlib import Path
from typing import Callable, Literal

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, UnidentifiedImageError
from torch.utils.data import Dataset

from advbench.core.digests import tensor_digest
from advbench.core.errors import AdvbenchError

Split = Literal["train", "test", "all"]

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".webp", ".ppm")
MAX_SIDE = 512  # photos are first shrunk so the shorter side is at most this (COCO-like scale)


def skimage_photo(name: str) -> Callable[[], np.ndarray]:
    """A loader of one scikit-image sample photo by name (uint8, grey or RGB)."""
    def load() -> np.ndarray:
        from skimage import data

        if name.startswith("motorcycle_"):
            left, right, _ = data.stereo_motorcycle()
            return left if name.endswith("left") else right
        return getattr(data, name)()

    return load


TRAIN_PHOTOS = ("camera", "chelsea", "rocket", "coins", "moon", "grass", "gravel", "brick",
                "hubble_deep_field", "immunohistochemistry", "retina", "cell")
TEST_PHOTOS = ("astronaut", "coffee", "motorcycle_left", "motorcycle_right")


def photo_names(split: Split) -> tuple[str, ...]:
    """Names of the sample photos in `split`."""
    if split == "train":
        return TRAIN_PHOTOS
    if split == "test":
        return TEST_PHOTOS
    if split == "all":
        return TRAIN_PHOTOS + TEST_PHOTOS
    raise AdvbenchError(f"unknown photo split '{split}'; valid: all, test, train")


def to_tensor(array: np.ndarray) -> torch.Tensor:
    """HxW or HxWxC uint8/bool/float array -> float (3, H, W) in [0, 1] (grey replicated, alpha dropped)."""
    arr = np.asarray(array)
    if arr.dtype == np.uint8:
        arr = arr.astype(np.float32) / 255.0
    else:
        arr = arr.astype(np.float32)
    if arr.ndim == 2:
        arr = np.repeat(arr[..., None], 3, axis=2)
    return torch.from_numpy(np.ascontiguousarray(arr[..., :3])).permute(2, 0, 1).clamp(0, 1)


def shrink(image: torch.Tensor, max_short_side: int) -> torch.Tensor:
    """Downscale (antialiased) so the shorter side is at most `max_short_side`."""
    h, w = image.shape[-2:]
    scale = max_short_side / min(h, w)
    if scale >= 1:
        return image
    size = (max(1, round(h * scale)), max(1, round(w * scale)))
    return F.interpolate(image[None], size=size, mode="bilinear", antialias=True, align_corners=False)[0].clamp(0, 1)


@lru_cache(maxsize=None)
def sample_photo(name: str) -> torch.Tensor:
    """One scikit-image sample photo as (3, H, W) in [0, 1], shorter side at most 512."""
    if name not in photo_names("all"):
        raise AdvbenchError(f"unknown sample photo '{name}'; valid: {', '.join(sorted(photo_names('all')))}")
    return shrink(to_tensor(skimage_photo(name)()), MAX_SIDE)


def sample_photos(split: Split = "all") -> list[torch.Tensor]:
    """The sample photos of `split`, each (3, H, W) in [0, 1] (sizes differ)."""
    return [sample_photo(n) for n in photo_names(split)]


def grid_crops(image: torch.Tensor, size: int = 256, stride: int = 128) -> torch.Tensor:
    """Overlapping size x size crops covering the whole image, evenly spaced, (K, 3, size, size).

    An image smaller than `size` is first upscaled so its shorter side equals `size`.
    """
    h, w = image.shape[-2:]
    if min(h, w) < size:
        scale = size / min(h, w)
        image = F.interpolate(image[None], size=(max(size, math.ceil(h * scale)), max(size, math.ceil(w * scale))),
                              mode="bilinear", align_corners=False)[0].clamp(0, 1)
        h, w = image.shape[-2:]
    ys = torch.linspace(0, h - size, math.ceil((h - size) / stride) + 1).round().long().tolist()
    xs = torch.linspace(0, w - size, math.ceil((w - size) / stride) + 1).round().long().tolist()
    return torch.stack([image[:, y:y + size, x:x + size] for y in ys for x in xs])


def photo_crops(split: Split = "train", size: int = 256, stride: int | None = None) -> torch.Tensor:
    """Every grid crop of the sample photos in `split`, (N, 3, size, size): the offline UAP data."""
    return torch.cat([grid_crops(p, size, stride or size // 2) for p in sample_photos(split)])


def center_resize(image: torch.Tensor, size: int) -> torch.Tensor:
    """Resize the shorter side to `size` (antialiased) and take the centre size x size square."""
    h, w = image.shape[-2:]
    scale = size / min(h, w)
    nh, nw = max(size, round(h * scale)), max(size, round(w * scale))
    if (nh, nw) != (h, w):
        image = F.interpolate(image[None], size=(nh, nw), mode="bilinear", antialias=scale < 1,
                              align_corners=False)[0].clamp(0, 1)
    top, left = (nh - size) // 2, (nw - size) // 2
    return image[:, top:top + size, left:left + size]


def read_image(path: Path) -> torch.Tensor:
    """An image file as (3, H, W) in [0, 1]; unreadable files are a one-line error."""
    try:
        with warnings.catch_warnings():
            # PIL only warns between its pixel limit and twice that; either way the file is refused
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as im:
                return to_tensor(np.asarray(im.convert("RGB")))
    except (UnidentifiedImageError, OSError, Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise AdvbenchError(f"cannot read image '{path}': {exc}") from None


class ImageFolder(Dataset):
    """Every image under a folder (recursively, sorted), centre-cropped to size x size on load.

    Images are read lazily, so a 10,000-image COCO folder never sits in memory whole.
    """

    def __init__(self, folder: str | Path, size: int = 256, limit: int | None = None) -> None:
        root = Path(folder).expanduser()
        if not root.is_dir():
            raise AdvbenchError(f"image folder '{root}' does not exist: expected a folder of image files")
        files = sorted(p for p in root.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
        if not files:
            raise AdvbenchError(f"no images in '{root}': expected files ending in {', '.join(IMAGE_SUFFIXES)}")
        self.files = files[:limit] if limit else files
        self.size = size

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> torch.Tensor:
        return center_resize(read_image(self.files[index]), self.size)


def uap_images(data: str | Path | None, *, split: Split = "train", size: int = 256,
               limit: int | None = None) -> Dataset | torch.Tensor:
    """UAP data: a folder (`data`) or, when `data` is None, the sample-photo crops of `split`.

    `limit` keeps the first N images (the data-size ablation); crops are shuffled with a fixed
    seed first so that a small subset still spans several photos.
    """
    if limit is not None and limit < 1:
        raise AdvbenchError(f"image limit must be >= 1, got {limit}")
    if data is not None:
        return ImageFolder(data, size=size, limit=limit)
    crops = photo_crops(split, size)
    order = torch.randperm(len(crops), generator=torch.Generator().manual_seed(0))
    return crops[order[:limit]] if limit else crops[order]


def as_batch(images: Dataset | torch.Tensor, limit: int | None = None) -> torch.Tensor:
    """The first `limit` (default: all) images of a data set stacked into one (N, 3, H, W) tensor."""
    n = len(images) if limit is None else min(limit, len(images))
    if isinstance(images, torch.Tensor):
        return images[:n]
    return torch.stack([images[i] for i in range(n)])


def given_images(images: torch.Tensor) -> tuple[torch.Tensor, str]:
    """Images handed in as a tensor (the Python API), checked, and what the records call their
    source: `tensor:` and the start of their content digest (which keys the cell in full)."""
    if images.dim() != 4 or images.shape[1] != 3 or 0 in images.shape:
        raise AdvbenchError(f"images must be a float tensor (N, 3, H, W) in [0, 1], got shape {tuple(images.shape)}")
    if not images.is_floating_point():
        raise AdvbenchError(f"images must be floats in [0, 1], got {images.dtype} (divide 8-bit images by 255)")
    if not torch.isfinite(images).all() or images.min() < 0 or images.max() > 1:
        raise AdvbenchError(f"images must lie in [0, 1], got values in [{images.min().item():.4g}, "
                            f"{images.max().item():.4g}]")
    images = images.detach().float().cpu().contiguous()
    return images, f"tensor:{tensor_digest(images)[:12]}"
