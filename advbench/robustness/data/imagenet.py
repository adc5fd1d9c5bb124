"""ImageNet validation set: a class-folder set plus the benchmark's fixed 1000-image subset."""

from __future__ import annotations

from typing import Any

from advbench.robustness.data.folder import ImageFolderDataset


class ImageNet(ImageFolderDataset):
    """`<root>/<wnid>/*.JPEG`; sorted wnids give the standard 1000 class indices.

    Only the defaults differ from a plain folder set (Inception-v3 input size, the seed's
    1000-image subset, 1000 classes); every other option is `ImageFolderDataset`'s.
    """

    what = "ImageNet validation folder"

    def __init__(
        self,
        root: str,
        name: str = "imagenet",
        image_size: int = 299,
        n_subset: int | None = 1000,
        num_classes: int | None = 1000,
        **options: Any,
    ) -> None:
        super().__init__(root, name=name, image_size=image_size, n_subset=n_subset, num_classes=num_classes, **options)
