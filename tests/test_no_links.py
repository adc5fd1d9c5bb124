"""Nothing is written, replaced or deleted outside the output folders, even through a symbolic link.

Each test plants a real symlink where advbench expects one of its own files or folders, pointing
at a file or folder outside, and checks that the run stops with a one-line error naming the link
while the outside file or folder keeps every byte. Video file names from data become folder
names only through the safe-name rule, so a clip named `...y4m` stays inside its metric folder.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import torch

from advbench.core.cells import claim_cell, fill_cell
from advbench.core.errors import AdvbenchError
from advbench.core.names import file_name
from advbench.core.records import write_part
from advbench.core.resume import CellFiles, sweep_orphans
from advbench.quality.metrics.metric_contract import QualityMetric
from advbench.quality.stability.clips import make_synthetic_videos
from advbench.quality.stability.rd import part_path, run_rd
from advbench.quality.uap.perturbation import save_uap

KEY, VERSION, IDS = "k0", "v0", [0, 1, 2, 3]


def _outside(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    """A folder outside every output folder, holding a file and a sub-folder with a file."""
    outside = tmp_path / "outside"
    (outside / "sub").mkdir(parents=True)
    (outside / "keep.txt").write_bytes(b"precious")
    (outside / "sub" / "inner.txt").write_bytes(b"also precious")
    return outside, _snapshot(outside)


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else b"<dir>") for p in sorted(folder.rglob("*"))}


def _one_line_link_error(excinfo: pytest.ExceptionInfo[AdvbenchError], link: Path) -> None:
    message = str(excinfo.value)
    assert "\n" not in message
    assert f"'{link}' is a symbolic link" in message


def _compute(positions: list[int]) -> pd.DataFrame:
    return pd.DataFrame({"sample_id": [IDS[p] for p in positions], "cell_key": KEY, "advbench_version": VERSION,
                         "correct": True})


def _run_cell(part: Path) -> None:
    with claim_cell(part, KEY, IDS, force=False) as files:
        assert files is not None
        fill_cell(files, KEY, VERSION, IDS, 2, _compute)


# ---- records/.partial, records/.locks ---------------------------------------------------------


@pytest.mark.parametrize("linked", [".partial/cell", ".partial", ".locks", ".locks/cell.lock"])
def test_a_linked_cell_folder_or_lock_is_refused_and_the_outside_is_untouched(linked: str, tmp_path: Path) -> None:
    records = tmp_path / "records"
    outside, before = _outside(tmp_path)
    link = records / linked
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(outside / "keep.txt" if linked.endswith(".lock") else outside)
    with pytest.raises(AdvbenchError) as excinfo:
        _run_cell(records / "cell.parquet")
    _one_line_link_error(excinfo, link)
    assert _snapshot(outside) == before
    assert not (records / "cell.parquet").exists()


def test_a_linked_chunk_inside_a_cell_folder_is_refused(tmp_path: Path) -> None:
    records = tmp_path / "records"
    outside, _ = _outside(tmp_path)
    foreign = write_part(_compute([0, 1]), outside / "chunk.parquet")
    before = _snapshot(outside)
    link = records / ".partial" / "cell" / "chunk-000000-00002.parquet"
    link.parent.mkdir(parents=True)
    link.symlink_to(foreign)
    with pytest.raises(AdvbenchError) as excinfo:
        _run_cell(records / "cell.parquet")
    _one_line_link_error(excinfo, link)
    assert _snapshot(outside) == before


def test_sweeping_orphans_refuses_a_linked_cell_folder(tmp_path: Path) -> None:
    records = tmp_path / "records"
    outside, before = _outside(tmp_path)
    write_part(_compute([0, 1, 2, 3]), records / "cell.parquet")
    link = records / ".partial" / "cell"
    link.parent.mkdir(parents=True)
    link.symlink_to(outside)
    with pytest.raises(AdvbenchError) as excinfo:
        sweep_orphans(records)
    _one_line_link_error(excinfo, link)
    assert _snapshot(outside) == before


def test_real_cell_folders_still_resume_and_are_cleaned(tmp_path: Path) -> None:
    part = tmp_path / "records" / "cell.parquet"
    write_part(_compute([0, 1]), CellFiles(part).partial / "chunk-000000-00002.parquet")
    _run_cell(part)
    assert sorted(pd.read_parquet(part)["sample_id"]) == IDS
    assert not CellFiles(part).partial.exists()


# ---- synthetic clips and RD parts --------------------------------------------------------------


class Sharpness(QualityMetric):
    score_range = (0.0, 1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x[..., 1:] - x[..., :-1]).abs().mean(dim=(1, 2, 3))


def _noise(frames: torch.Tensor, amplitude: float) -> torch.Tensor:
    return frames + amplitude * torch.linspace(-1, 1, frames.shape[-1])


def _rd(videos: list[Path], out: Path) -> None:
    run_rd(videos, Sharpness(), _noise, out, metric_name="sharp", perturbation_key="n0", amplitudes=[0.04],
           bitrates_kbps=[300], progress=False)


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_synthetic_videos(tmp_path_factory.mktemp("clips"), n=1, size=16, frames=2)[0]


def test_a_linked_clip_file_is_refused_and_the_outside_file_kept(clip: Path, tmp_path: Path) -> None:
    outside, before = _outside(tmp_path)
    link = tmp_path / "videos" / clip.name
    link.parent.mkdir()
    link.symlink_to(outside / "keep.txt")
    with pytest.raises(AdvbenchError) as excinfo:
        make_synthetic_videos(tmp_path / "videos", n=1, size=16, frames=2)
    _one_line_link_error(excinfo, link)
    assert _snapshot(outside) == before


@pytest.mark.parametrize("linked", ["metric", "video", "part"])
def test_a_linked_rd_folder_or_part_is_refused_and_the_outside_kept(linked: str, clip: Path, tmp_path: Path) -> None:
    out = tmp_path / "rd"
    outside, before = _outside(tmp_path)
    part = part_path(out, "sharp", clip.stem, 0.0, 300)
    link = {"metric": out / "sharp", "video": part.parent, "part": part}[linked]
    link.parent.mkdir(parents=True)
    link.symlink_to(outside / "keep.txt" if linked == "part" else outside)
    with pytest.raises(AdvbenchError) as excinfo:
        _rd([clip], out)
    _one_line_link_error(excinfo, link)
    assert _snapshot(outside) == before


def test_a_video_named_dot_dot_writes_inside_its_metric_folder(clip: Path, tmp_path: Path) -> None:
    video = tmp_path / "src" / "...y4m"
    video.parent.mkdir()
    video.write_bytes(clip.read_bytes())
    assert video.stem == ".."
    out = tmp_path / "rd"
    _rd([video], out)
    parts = sorted(out.rglob("*.parquet"))
    assert len(parts) == 2  # amplitude 0 and 0.04 at one bitrate
    assert {p.parent for p in parts} == {out / "sharp" / file_name("..")}
    assert set(pd.concat(pd.read_parquet(p) for p in parts)["video"]) == {".."}


def test_file_names_from_data_are_safe_unique_and_deterministic() -> None:
    assert file_name("clip_01") == "clip_01"
    names = [file_name(s) for s in ("..", ".", "a/b", "a_b", "a b", "-x", "x" * 300)]
    assert len(set(names)) == len(names)
    assert all("/" not in n and not n.startswith((".", "-")) and len(n) <= 128 for n in names)
    assert file_name("a/b") == file_name("a/b")


# ---- UAP files ---------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".png", ".pt.tmp", ".pt"])
def test_a_linked_uap_file_is_refused_and_the_outside_file_kept(suffix: str, tmp_path: Path) -> None:
    outside, before = _outside(tmp_path)
    link = tmp_path / "uaps" / f"u{suffix}"
    link.parent.mkdir()
    link.symlink_to(outside / "keep.txt")
    with pytest.raises(AdvbenchError) as excinfo:
        save_uap(torch.zeros(3, 8, 8), tmp_path / "uaps" / "u")
    _one_line_link_error(excinfo, link)
    assert _snapshot(outside) == before


def test_a_linked_videos_folder_of_the_stability_job_is_refused(tmp_path: Path) -> None:
    from omegaconf import OmegaConf

    from advbench.quality.stability.uap_rd import job_videos as _videos

    outside, before = _outside(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "videos").symlink_to(outside, target_is_directory=True)
    cfg = OmegaConf.create({"videos": None, "out_dir": str(out), "synthetic": {"n": 1, "size": [16, 16], "frames": 2}})
    with pytest.raises(AdvbenchError) as excinfo:
        _videos(cfg)
    _one_line_link_error(excinfo, out / "videos")
    assert _snapshot(outside) == before
