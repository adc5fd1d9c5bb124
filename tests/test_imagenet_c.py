"""ImageNet-C's released folders: matched to a class-folder set by `<wnid>/<file>`, framed as its clean images, checked up front."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from PIL import Image
from torch import nn

import advbench
from advbench.core.errors import AdvbenchError
from advbench.robustness.corruptions import SEVERITIES
from advbench.robustness.corruptions.released import layout, read_released
from advbench.robustness.data.imagenet import ImageNet

FILES = {"n01/a.JPEG": 0, "n01/b.JPEG": 0, "n02/c.JPEG": 1, "n02/d.JPEG": 1}
"""The clean set: two wnids of two images each; sample ids are the sorted files' positions."""

GREY = {"fog": {"n01/a.JPEG": [60, 100, 200, 200, 200], "n01/b.JPEG": [60] * 5,
                "n02/c.JPEG": [200, 60, 60, 60, 60], "n02/d.JPEG": [60] * 5},
        "contrast": {"n01/a.JPEG": [200] * 5, "n01/b.JPEG": [60, 60, 60, 60, 200],
                     "n02/c.JPEG": [200] * 5, "n02/d.JPEG": [200, 200, 200, 60, 60]}}
"""The grey level of each released image per corruption and severity 1-5: a sample reads as class 1 where it is bright."""


class _Brightness(nn.Module):
    """Class 1 where the image's mean is above one half, else class 0."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(20.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m = x.mean(dim=(1, 2, 3)) - 0.5
        return torch.stack([-m, m], 1) * self.scale


def _grey(path: Path, level: int, side: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (side, side), (level,) * 3).save(path, quality=95)


@pytest.fixture()
def folders(tmp_path: Path) -> tuple[Path, Path]:
    """A clean ImageNet-style folder (40-px images) and its ImageNet-C tree (2 corruptions × 5 severities, 28-px crops)."""
    clean, released = tmp_path / "val", tmp_path / "ImageNet-C"
    for rel, label in FILES.items():
        _grey(clean / rel, 200 if label else 60, 40)
    for name, levels in GREY.items():
        for rel, per_severity in levels.items():
            for s, level in zip(SEVERITIES, per_severity):
                _grey(released / name / str(s) / rel, level, 28)
    return clean, released


def _run(clean: Path, released: Path, out: Path):
    return advbench.evaluate(_Brightness(), "imagenet", threat="corruptions", out_dir=out,
                             overrides=[f"dataset.root={clean}", "dataset.image_size=16", "dataset.n_subset=null",
                                        "dataset.num_classes=2", f"threat.released={released}"])


def test_imagenet_c_folders_give_per_sample_records(folders, tmp_path: Path) -> None:
    clean, released = folders
    assert layout(released) == "imagenet-c"
    records = _run(clean, released, tmp_path / "out")
    assert sorted(set(records["corruption"])) == ["contrast", "fog"] and len(records) == 8
    assert set(records["corruption_source"]) == {"released"}
    rel = sorted(FILES)
    for _, row in records.iterrows():
        path, label = rel[row["sample_id"]], FILES[rel[row["sample_id"]]]
        reads = [int(level > 128) for level in GREY[row["corruption"]][path]]
        assert row["label"] == label and row["clean_pred"] == label
        assert [row[f"pred_s{s}"] for s in SEVERITIES] == reads
        wrong = [s for s, p in zip(SEVERITIES, reads) if p != label]
        assert row["min_severity"] == (float(wrong[0]) if wrong else math.inf)
    assert records["min_severity"].lt(math.inf).any() and records["min_severity"].eq(math.inf).any()


def test_a_missing_imagenet_c_file_is_named_in_one_line(folders, tmp_path: Path) -> None:
    clean, released = folders
    (released / "fog" / "3" / "n02" / "c.JPEG").unlink()
    (released / "fog" / "5" / "n01" / "a.JPEG").unlink()
    with pytest.raises(AdvbenchError) as caught:
        _run(clean, released, tmp_path / "out")
    message = str(caught.value)
    assert "\n" not in message and message.startswith("no released file")
    assert f"'{released / 'fog' / '3' / 'n02' / 'c.JPEG'}'" in message


def test_the_layout_is_told_by_the_folder(tmp_path: Path) -> None:
    (tmp_path / "rb").mkdir()
    (tmp_path / "rb" / "labels.npy").write_bytes(b"")
    assert layout(tmp_path / "rb") == "robustbench"
    (tmp_path / "other" / "fog").mkdir(parents=True)
    for folder, message in ((tmp_path / "missing", "not found"), (tmp_path / "other", "neither .npy files nor severity")):
        with pytest.raises(AdvbenchError, match=message):
            layout(folder)


def _ramp(side: int) -> Image.Image:
    """A picture whose every crop differs: brightness grows with the distance from the centre."""
    r = torch.linspace(-1, 1, side).abs()
    grey = ((r[:, None] + r[None, :]) / 2 * 255).round().to(torch.uint8)
    return Image.fromarray(torch.stack([grey, grey.T, 255 - grey], 2).numpy())


@pytest.mark.parametrize("fraction", [0.875, 0.5])
def test_released_images_are_framed_as_the_clean_ones(tmp_path: Path, fraction: float) -> None:
    """An ImageNet-C copy made as ImageNet-C made them (Resize, then the central 0.875) reads as the clean image does."""
    clean, released = tmp_path / "val", tmp_path / "ImageNet-C"
    for rel in FILES:
        (clean / rel).parent.mkdir(parents=True, exist_ok=True)
        _ramp(64).save(clean / rel, quality=95)
        copy = released / "fog" / "1" / rel
        copy.parent.mkdir(parents=True, exist_ok=True)
        _ramp(64).resize((32, 32), Image.BILINEAR).crop((2, 2, 30, 30)).save(copy, quality=95)
    dataset = ImageNet(str(clean), image_size=16, crop_fraction=fraction, n_subset=None, num_classes=2)
    want = dataset.eval_set()[0][0]
    got = read_released(released, "fog", 1, torch.tensor([0]), torch.tensor([0]), dataset)[0]
    assert got.shape == want.shape == (3, 16, 16)
    assert (got - want).abs().mean() < 0.015  # JPEG and the rounding of the resize
    naive = dataset.eval_set().transform(Image.open(released / "fog" / "1" / "n01" / "a.JPEG").convert("RGB"))
    assert (naive - want).abs().mean() > 0.02, "the dataset's own Resize + CenterCrop would frame less than the clean image"


def test_a_wider_crop_than_imagenet_c_kept_is_refused(folders) -> None:
    clean, released = folders
    dataset = ImageNet(str(clean), image_size=16, crop_fraction=1.0, n_subset=None, num_classes=2)
    with pytest.raises(AdvbenchError, match="crop_fraction=1.0 frames more"):
        read_released(released, "fog", 1, torch.tensor([0]), torch.tensor([0]), dataset)
