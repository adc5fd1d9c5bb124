"""More bad inputs that must end in one `Error: ...` line: huge images, one-class folders, full disks,
x264 settings, wrapper types, NaN step sizes, empty shards, a read-only folder of finished cells.

Commands run in process (CliRunner); where the failing function is enough it is called directly.
A full disk is simulated by a `torch.save` that writes a few bytes and then fails as the kernel
does (ENOSPC): no temporary file may stay behind and the error must be one line.
"""

from __future__ import annotations

import errno
import math
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from click.testing import CliRunner, Result
from PIL import Image
from test_errors import refuse_writes_under

from advbench.cli.main import main
from advbench.core.errors import AdvbenchError, user_error
from advbench.quality.images import read_image
from advbench.quality.metrics.learned import QualityNet, save_weights
from advbench.quality.stability.video import H264Transcoder, transcode
from advbench.quality.uap.perturbation import save_uap
from advbench.robustness.attacks.gradient import BIM, MIM, PGD
from advbench.robustness.data.folder import ImageFolderDataset
from advbench.robustness.defenses.wrappers import check_wrapper
from advbench.robustness.models.checkpoint_files import META_KEYS, save_checkpoint

SMOKE = ["run", "experiment=smoke", "dataset.n_samples=4", "search.enabled=false", "threads=1"]


def one_line(result: Result, *needles: str) -> str:
    """The command failed with exit status 1 and one `Error:` line holding `needles`, no traceback."""
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def invoke(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *argv: str) -> Result:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ADVBENCH_CACHE", str(tmp_path / "cache"))
    return CliRunner().invoke(main, list(argv))


def class_folders(root: Path, *classes: str, size: int = 12) -> Path:
    for name in classes:
        (root / name).mkdir(parents=True)
        Image.new("RGB", (size, size), (40 * len(name), 80, 120)).save(root / name / "a.png")
    return root


# ---- 1. decompression bombs ------------------------------------------------------------------

@pytest.mark.parametrize("limit", [100, 200], ids=["error", "warning"])  # 400 px: > 2x the limit, or between
def test_decompression_bomb_names_the_file(limit: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", limit)
    root = class_folders(tmp_path / "data", "a", "b", size=20)
    bomb = root / "b" / "a.png"
    dataset = ImageFolderDataset(root=str(root), image_size=8)
    position = dataset.order.index(dataset.files.index((bomb, 1)))
    with pytest.raises(AdvbenchError, match=r"cannot decode image '.*b/a\.png'.*exceeds limit") as err:
        dataset.eval_set()[position]
    assert "\n" not in str(err.value)
    with pytest.raises(AdvbenchError, match=r"cannot read image '.*b/a\.png'.*exceeds limit"):
        read_image(bomb)


def test_a_real_20000_pixel_square_png_is_one_line(tmp_path: Path) -> None:
    """PIL's own limit: a 1-bit 20000x20000 PNG is 50 kB on disk and 400 Mpixels decoded."""
    root = tmp_path / "data"
    class_folders(root, "a", "b")
    Image.new("1", (20000, 20000)).save(root / "a" / "huge.png", optimize=False, compress_level=1)
    with pytest.raises(AdvbenchError, match="huge.png"):
        read_image(root / "a" / "huge.png")


# ---- 2. one-class folders ----------------------------------------------------------------------

def test_one_class_folder_is_refused(tmp_path: Path) -> None:
    root = class_folders(tmp_path / "data", "only")
    with pytest.raises(AdvbenchError, match="has 1 class folder .only.; a classifier needs at least two"):
        ImageFolderDataset(root=str(root))


@pytest.mark.parametrize("extra", [["threat=linf_targeted"], ["threat=linf"]])
def test_one_class_folder_run_is_one_line(extra: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = class_folders(tmp_path / "data", "only")
    result = invoke(tmp_path, monkeypatch, "run", "dataset=folder", f"dataset.root={root}", "model=small_cnn", *extra,
                    f"out_dir={tmp_path / 'out'}")
    one_line(result, "1 class folder", "at least two")


def test_one_class_folder_train_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = class_folders(tmp_path / "data", "only")
    result = invoke(tmp_path, monkeypatch, "train", "dataset=folder", f"dataset.root={root}",
                    f"dataset.train_root={root}", "model=small_cnn")
    one_line(result, "1 class folder", "at least two")
    assert not list((tmp_path / "cache").rglob("*.pt"))


# ---- 3. full disks ------------------------------------------------------------------------------

def full_disk_save(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.save writes a few bytes, then the disk is full."""
    def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        if isinstance(f, (str, os.PathLike)):
            Path(f).write_bytes(b"PK\x03\x04partial")
        else:
            f.write(b"PK\x03\x04partial")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(torch, "save", save)


def assert_full_disk_line(exc: BaseException, folder: Path) -> None:
    error = user_error(exc)
    assert error is not None and "No space left on device" in str(error) and "\n" not in str(error)
    assert [p.name for p in folder.iterdir()] == [], "a failed write left a file behind"


def test_full_disk_while_saving_a_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    full_disk_save(monkeypatch)
    folder = tmp_path / "ckpt"
    with pytest.raises(OSError) as err:
        save_checkpoint(folder / "model.pt", torch.nn.Linear(2, 2), dict.fromkeys(META_KEYS, ""))
    assert_full_disk_line(err.value, folder)


def test_full_disk_while_saving_cnnqa_weights(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    net = QualityNet()
    full_disk_save(monkeypatch)
    folder = tmp_path / "weights"
    with pytest.raises(OSError) as err:
        save_weights(net, folder / "cnnqa.pt")
    assert_full_disk_line(err.value, folder)


def test_full_disk_while_saving_a_uap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    full_disk_save(monkeypatch)
    folder = tmp_path / "uap"
    with pytest.raises(OSError) as err:
        save_uap(torch.zeros(3, 8, 8), folder / "uap")
    assert_full_disk_line(err.value, folder)


def test_full_disk_while_writing_the_uap_png(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_space(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(Image.Image, "save", no_space)
    folder = tmp_path / "uap"
    with pytest.raises(OSError) as err:
        save_uap(torch.zeros(3, 8, 8), folder / "uap")
    assert user_error(err.value) is not None
    assert sorted(p.name for p in folder.iterdir()) == ["uap.pt"]


# ---- 4. x264 settings ---------------------------------------------------------------------------

@pytest.mark.parametrize(("override", "needles"), [
    ("bitrates_kbps=[1e12]", ("bitrates_kbps: bitrate (kbps)", "[1, 1e+06]", "got 1000000000000.0")),
    ("bitrates_kbps=[0.5]", ("bitrates_kbps: bitrate (kbps)", "0.5")),
    ("bitrates_kbps=[]", ("bitrates_kbps must be a non-empty list",)),
    ("preset=foo", ("unknown preset 'foo'", "ultrafast", "placebo")),
])
def test_stability_settings_x264_refuses(override: str, needles: tuple[str, ...], tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    result = invoke(tmp_path, monkeypatch, "uap", "stability", override, f"out_dir={tmp_path / 'out'}")
    one_line(result, *needles)


@pytest.mark.parametrize(("bitrate", "preset"), [(1e12, "medium"), (200, "foo")])
def test_encoder_open_failure_names_the_setting(bitrate: float, preset: str) -> None:
    with pytest.raises(AdvbenchError, match=re.escape(f"libx264 refused preset='{preset}' at {bitrate:g} kbps")) as err:
        H264Transcoder(32, 32, 25, bitrate, preset)
    assert "\n" not in str(err.value)


def test_valid_encoder_settings_still_encode() -> None:
    out = transcode(np.random.default_rng(0).random((2, 32, 32, 3), dtype=np.float32), 25, 500, "ultrafast")
    assert out.frames.shape == (2, 32, 32, 3) and out.real_bitrate_kbps > 0


# ---- 5. wrapper parameter types -------------------------------------------------------------------

@pytest.mark.parametrize(("defense", "override", "needle"), [
    ("jpeg", "defense.wrapper.quality=high", "defense.wrapper.quality must be a whole number, got 'high'"),
    ("jpeg", "defense.wrapper.quality=7.5", "defense.wrapper.quality must be a whole number, got 7.5"),
    ("bit_red", "+defense.wrapper.bitz=3",
     "bad defense.wrapper for 'bit_depth': defense.wrapper.bitz is not one of its arguments; valid: bits"),
    ("rp", "defense.wrapper.rate=nan", "defense.wrapper.rate must be a number, got nan"),
])
def test_wrapper_types_are_one_line(defense: str, override: str, needle: str, tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    result = invoke(tmp_path, monkeypatch, *SMOKE, f"defense={defense}", override, f"out_dir={tmp_path / 'out'}")
    one_line(result, needle)
    assert not (tmp_path / "cache").exists(), "the check must come before any training"


def test_valid_wrapper_specs_pass() -> None:
    assert check_wrapper({"type": "jpeg", "quality": 75}).__name__ == "JPEG"
    assert check_wrapper({"type": "random_resize_pad", "rate": 1, "eot_samples": 2}).__name__ == "RandomResizePad"


# ---- 6. NaN and non-positive step sizes ----------------------------------------------------------

@pytest.mark.parametrize("make", [
    lambda: BIM(rel_stepsize=math.nan), lambda: PGD(rel_stepsize=math.inf), lambda: MIM(rel_stepsize=-0.1),
    lambda: MIM(decay=math.nan), lambda: MIM(decay=-1.0),
], ids=["bim-nan", "pgd-inf", "mim-negative", "mim-decay-nan", "mim-decay-negative"])
def test_gradient_attack_constructors_refuse_bad_steps(make: Any) -> None:
    with pytest.raises(AdvbenchError, match="(rel_stepsize|decay) must be a finite number"):
        make()


@pytest.mark.parametrize(("attack", "override"), [
    ("bim", "attack.params.rel_stepsize=nan"), ("pgd", "attack.params.rel_stepsize=nan"),
    ("mim", "attack.params.rel_stepsize=nan"), ("mim", "attack.params.decay=nan"),
    ("nes", "attack.params.sigma=nan"), ("cw", "attack.params.stepsize=nan"),
])
def test_nan_attack_settings_fail_before_any_work(attack: str, override: str, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    result = invoke(tmp_path, monkeypatch, *SMOKE, f"attack={attack}", override, f"out_dir={tmp_path / 'out'}")
    one_line(result, override.split("=")[0].removeprefix("attack.params."), "nan")
    assert not (tmp_path / "cache").exists() and not (tmp_path / "out" / "records").exists()


# ---- 7. a shard with no samples -------------------------------------------------------------------

def test_empty_shard_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    result = invoke(tmp_path, monkeypatch, *SMOKE, "dataset.n_samples=2", "shard.count=4", "shard.index=3",
                    f"out_dir={tmp_path / 'out'}")
    one_line(result, "shard 3 of 4 holds no samples", "the data set has 2", "shard.count <= 2")
    assert not (tmp_path / "cache").exists(), "the check must come before any training"


# ---- 8. a read-only folder whose cells are all done -----------------------------------------------

@pytest.fixture
def finished_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    argv = [*SMOKE, "attack=fgsm", "defense.recipe.epochs=1", f"out_dir={tmp_path / 'out'}"]
    result = invoke(tmp_path, monkeypatch, *argv)
    assert result.exit_code == 0, result.output
    yield argv


def test_read_only_out_dir_with_every_cell_done_says_why_and_what_to_use(
        finished_run: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rerun takes each cell's lock even to skip it (safe beside a concurrent run), so a read-only
    folder is refused, in one line that says why and points at the readers."""
    out = tmp_path / "out"
    for folder in [out, *(p for p in out.rglob("*") if p.is_dir())]:
        folder.chmod(0o555)
    if os.geteuid() == 0:
        refuse_writes_under(out, monkeypatch)
    try:
        result = CliRunner().invoke(main, finished_run)
    finally:
        for folder in [out, *(p for p in out.rglob("*") if p.is_dir())]:
            folder.chmod(0o755)
    assert result.exit_code == 1
    lines = [ln for ln in result.output.strip().splitlines() if ln]
    assert len(lines) == 1 and "not a writable folder" in lines[0] and "advbench plot or check" in lines[0]


def test_a_uap_png_over_the_decompression_limit_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from PIL import Image

    from advbench.quality.uap.perturbation import load_uap

    Image.new("RGB", (64, 64), (128, 128, 128)).save(tmp_path / "uap.png")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 64 * 64 // 4)  # over twice the limit: PIL's error, not a warning
    with pytest.raises(AdvbenchError) as caught:
        load_uap(tmp_path / "uap.png")
    assert "cannot read image" in str(caught.value) and "\n" not in str(caught.value)
