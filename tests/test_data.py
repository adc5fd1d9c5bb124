"""Data sets: shapes, ranges, stable ids, real on-disk formats, one-line errors."""

from __future__ import annotations

import math
import pickle
from pathlib import Path

import hydra.utils
import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from PIL import Image
from sklearn.datasets import load_digits

from advbench.cli.config import compose_config
from advbench.core.errors import AdvbenchError
from advbench.robustness.data.cifar10 import CIFAR10
from advbench.robustness.data.digits import Digits
from advbench.robustness.data.folder import ImageFolderDataset
from advbench.robustness.data.imagenet import ImageNet

CONF = Path(__file__).resolve().parents[1] / "conf" / "dataset"


def _eval_tensors(dataset) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    items = [dataset.eval_set()[i] for i in range(len(dataset.eval_set()))]
    return torch.stack([x for x, _, _ in items]), torch.tensor([y for _, y, _ in items]), torch.tensor([i for _, _, i in items])


# ---------------------------------------------------------------- digits


def test_digits_eval_items_match_the_source_images_by_id() -> None:
    ds = hydra.utils.instantiate(OmegaConf.load(CONF / "digits.yaml"))
    assert (ds.name, ds.num_classes, ds.input_shape) == ("digits", 10, (1, 8, 8))
    x, y, ids = _eval_tensors(ds)
    raw = load_digits()
    assert x.shape == (len(ids), 1, 8, 8) and x.dtype == torch.float32
    assert 0.0 <= x.min() and x.max() == 1.0
    assert len(set(ids.tolist())) == len(ids) == math.ceil(0.3 * len(raw.target))
    torch.testing.assert_close(x[:, 0], torch.tensor(raw.images[ids.numpy()], dtype=torch.float32) / 16)
    assert torch.equal(y, torch.tensor(raw.target[ids.numpy()]))
    assert set(y.tolist()) == set(range(10))


def test_digits_split_is_fixed_disjoint_and_prefixable() -> None:
    a, b = Digits(), Digits()
    _, _, ids_a = _eval_tensors(a)
    _, _, ids_b = _eval_tensors(b)
    assert torch.equal(ids_a, ids_b)
    train = a.train_set(augment=False)
    assert len(train) + len(ids_a) == 1797
    train_x = torch.stack([train[i][0] for i in range(len(train))]).flatten(1)
    x, _, _ = _eval_tensors(a)
    # A test image may coincide with a training image by chance, but not most of them.
    duplicates = (torch.cdist(x.flatten(1), train_x) == 0).any(1).sum()
    assert duplicates < len(x) // 20
    _, _, first = _eval_tensors(Digits(n_samples=7))
    assert torch.equal(first, ids_a[:7])


def test_digits_augmentation_shifts_without_leaving_range() -> None:
    torch.manual_seed(0)
    plain, augmented = Digits().train_set(augment=False), Digits().train_set(augment=True)
    pairs = [(plain[i], augmented[i]) for i in range(200)]
    assert all(p[1] == a[1] for p, a in pairs)
    assert all(0.0 <= a[0].min() and a[0].max() <= 1.0 for _, a in pairs)
    changed = sum(not torch.equal(p[0], a[0]) for p, a in pairs)
    assert changed > 100


def test_bad_n_samples_is_an_error() -> None:
    with pytest.raises(AdvbenchError, match="n_samples"):
        Digits(n_samples=0)


# ---------------------------------------------------------------- CIFAR-10


def _write_batch(path: Path, data: np.ndarray, labels: list[int], protocol: int) -> None:
    entry = {"batch_label": path.name, "labels": labels, "data": data, "filenames": [f"{i}.png" for i in labels]}
    path.write_bytes(pickle.dumps(entry, protocol=protocol))


@pytest.fixture()
def cifar_root(tmp_path: Path) -> Path:
    """Real CIFAR-10 python layout; each batch written with a different pickle protocol."""
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    rng = np.random.default_rng(1)
    for k, name in enumerate([*(f"data_batch_{i}" for i in range(1, 6)), "test_batch"]):
        _write_batch(folder / name, rng.integers(0, 256, (3, 3072), dtype=np.uint8), [k % 10, 3, 9], protocol=2 + k % 4)
    (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": [f"c{i}" for i in range(10)], "num_cases_per_batch": 3}))
    return tmp_path


def test_cifar_eval_set_decodes_channel_planes(cifar_root: Path) -> None:
    ds = CIFAR10(root=str(cifar_root), n_samples=2)
    entry = pickle.loads((cifar_root / "cifar-10-batches-py" / "test_batch").read_bytes())
    x, y, ids = _eval_tensors(ds)
    assert ds.input_shape == (3, 32, 32) and ids.tolist() == [0, 1]
    assert y.tolist() == entry["labels"][:2]
    # CIFAR rows are 1024 red, then green, then blue values, each row-major.
    expected = torch.from_numpy(entry["data"][:2].reshape(2, 3, 32, 32)).float() / 255
    torch.testing.assert_close(x, expected)


def test_cifar_train_set_concatenates_five_batches(cifar_root: Path) -> None:
    train = CIFAR10(root=str(cifar_root)).train_set(augment=True)
    assert len(train) == 15
    assert sorted({train[i][1] for i in range(0, 15, 3)}) == [0, 1, 2, 3, 4]
    assert all(train[i][0].shape == (3, 32, 32) for i in range(15))


def test_cifar_via_yaml_and_the_shared_fixture(fake_cifar_root: Path) -> None:
    cfg = compose_config("config", ["dataset=cifar10", f"dataset.root={fake_cifar_root}"])
    ds = hydra.utils.instantiate(cfg.dataset)
    assert ds.budgets["linf"] == pytest.approx(8 / 255) and len(ds.eval_set()) == 4


def test_missing_cifar_names_path_and_fix(tmp_path: Path) -> None:
    with pytest.raises(AdvbenchError) as err:
        CIFAR10(root=str(tmp_path / "nowhere"))
    msg = str(err.value)
    assert "\n" not in msg and str(tmp_path / "nowhere") in msg and "dataset.download=true" in msg


def test_cifar_without_training_batches(cifar_root: Path) -> None:
    (cifar_root / "cifar-10-batches-py" / "data_batch_3").unlink()
    with pytest.raises(AdvbenchError, match="data_batch_3"):
        CIFAR10(root=str(cifar_root)).train_set()


def test_cifar_batch_cannot_run_code(cifar_root: Path, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (Path.touch, (marker,))

    (cifar_root / "cifar-10-batches-py" / "test_batch").write_bytes(pickle.dumps({"data": Evil(), "labels": []}))
    with pytest.raises(AdvbenchError, match="not a CIFAR-10 batch"):
        CIFAR10(root=str(cifar_root)).eval_set()
    assert not marker.exists()


def test_cifar_labels_out_of_range(cifar_root: Path) -> None:
    _write_batch(cifar_root / "cifar-10-batches-py" / "test_batch", np.zeros((2, 3072), np.uint8), [1, 12], 4)
    with pytest.raises(AdvbenchError, match="0..9"):
        CIFAR10(root=str(cifar_root)).eval_set()


# ---------------------------------------------------------------- ImageNet / folders

WNIDS = ["n01440764", "n01443537", "n01484850"]


@pytest.fixture()
def imagenet_root(tmp_path: Path) -> Path:
    """Three wnid folders of JPEGs with different sizes; colour encodes (class, index)."""
    root = tmp_path / "val"
    for c, wnid in enumerate(WNIDS):
        (root / wnid).mkdir(parents=True)
        for i in range(4):
            colour = (40 + 60 * c, 30 * i, 200)
            Image.new("RGB", (30 + 7 * i, 24 + 5 * c), colour).save(root / wnid / f"ILSVRC2012_val_{c}{i}.JPEG", quality=95)
    (root / WNIDS[0] / "README.txt").write_text("not an image")
    return root


def test_imagenet_subset_is_a_seeded_prefix_of_sorted_files(imagenet_root: Path) -> None:
    ds = ImageNet(root=str(imagenet_root), image_size=16, n_subset=5, num_classes=3)
    x, y, ids = _eval_tensors(ds)
    assert ds.input_shape == (3, 16, 16) and x.shape == (5, 3, 16, 16)
    assert 0.0 <= x.min() and x.max() <= 1.0
    perm = torch.randperm(12, generator=torch.Generator().manual_seed(0))
    assert ids.tolist() == perm[:5].tolist()
    # Sorted files: 4 per class in wnid order, so id // 4 is the label and id % 4 the index.
    assert torch.equal(y, ids // 4)
    red = 40 + 60 * (ids // 4)
    green = 30 * (ids % 4)
    assert (x[:, 0].mean((1, 2)) * 255 - red).abs().max() < 4
    assert (x[:, 1].mean((1, 2)) * 255 - green).abs().max() < 4
    _, _, again = _eval_tensors(ImageNet(root=str(imagenet_root), image_size=16, n_subset=5, num_classes=3, n_samples=2))
    assert again.tolist() == ids[:2].tolist()
    _, _, other_seed = _eval_tensors(ImageNet(root=str(imagenet_root), image_size=16, num_classes=3, subset_seed=1))
    assert sorted(other_seed.tolist()) == list(range(12)) and other_seed.tolist() != perm.tolist()


def test_resize_then_centre_crop(tmp_path: Path) -> None:
    img = Image.new("RGB", (60, 30), (255, 0, 0))
    img.paste((0, 255, 0), (20, 0, 40, 30))  # green middle third
    (tmp_path / "a").mkdir()
    img.save(tmp_path / "a" / "wide.png")
    (tmp_path / "b").mkdir()  # a classifier's folder needs two classes; the same image in both
    img.save(tmp_path / "b" / "wide.png")
    x, _, _ = _eval_tensors(ImageFolderDataset(root=str(tmp_path), image_size=16, crop_fraction=1.0))
    # Shorter side -> 16 (32 x 16), centre 16 columns = columns 8..24 of 32: green in the middle.
    assert x.shape == (2, 3, 16, 16)
    assert x[0, 1, :, 4:12].min() > 0.9 and x[0, 0, :, 4:12].max() < 0.1
    assert x[0, 0, :, 0].mean() > 0.5


def test_imagenet_image_size_follows_the_model() -> None:
    sizes = {
        m: compose_config("config", ["dataset=imagenet", "dataset.root=/x", f"model={m}"]).dataset.image_size
        for m in ("inception_v3", "resnet50", "resnet152")
    }
    assert sizes == {"inception_v3": 299, "resnet50": 224, "resnet152": 224}


def test_folder_errors_are_one_line(imagenet_root: Path, tmp_path: Path) -> None:
    cases = [
        (lambda: ImageNet(root=str(tmp_path / "missing")), "ImageNet validation folder not found"),
        (lambda: ImageNet(root=str(imagenet_root)), "has 3 class folders, expected 1000"),
        (lambda: ImageFolderDataset(root=str(imagenet_root)).train_set(), "dataset.train_root"),
        (lambda: ImageFolderDataset(root=str(imagenet_root), crop_fraction=0.0), "crop_fraction"),
    ]
    empty = tmp_path / "empty" / "cls"
    empty.mkdir(parents=True)
    cases.append((lambda: ImageFolderDataset(root=str(empty.parent)), "holds no images"))
    for make, expected in cases:
        with pytest.raises(AdvbenchError, match=expected) as err:
            make()
        assert "\n" not in str(err.value)


def test_corrupt_image_names_the_file(imagenet_root: Path) -> None:
    bad = imagenet_root / WNIDS[1] / "ILSVRC2012_val_10.JPEG"
    bad.write_bytes(b"not a jpeg")
    ds = ImageFolderDataset(root=str(imagenet_root), image_size=8)
    position = ds.order.index(ds.files.index((bad, 1)))
    with pytest.raises(AdvbenchError, match="ILSVRC2012_val_10.JPEG"):
        ds.eval_set()[position]


def test_folder_train_split(imagenet_root: Path) -> None:
    ds = ImageFolderDataset(root=str(imagenet_root), image_size=8, train_root=str(imagenet_root))
    train = ds.train_set(augment=True)
    assert len(train) == 12 and train[5][0].shape == (3, 8, 8) and train[5][1] == 1
    assert len(ds.train_set(augment=False)[0]) == 2
