"""`advbench uap ...` as a user meets it: help, one-line errors, and small end-to-end runs."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Iterator

import pandas as pd
import pytest
from click.testing import CliRunner, Result

from advbench.cli.quality import uap
from advbench.core.records import read_records

SEED_PNG = Path(__file__).parent / "data" / "uap" / "pretrained_uap_paq2piq.png"
TINY_TRAIN = ["metric=niqe_fitted", "uap=quick", "subset=8", "validate.n_images=4", "progress=false"]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A scratch working directory with its own metric cache (NIQE fits its model there once)."""
    root = tmp_path_factory.mktemp("uap-cli")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        mp.setenv("ADVBENCH_CACHE", str(root / "cache"))
        yield root


def invoke(*args: str) -> Result:
    return CliRunner().invoke(uap, list(args))


def assert_one_line_error(result: Result, *needles: str) -> None:
    assert result.exit_code == 1, result.output
    err = result.stderr.strip()
    assert len(err.splitlines()) == 1, f"expected one line, got:\n{err}"
    assert "Traceback" not in result.output
    for needle in needles:
        assert needle in err


@pytest.mark.parametrize("command", [[], ["train"], ["eval"], ["stability"], ["ablation"]])
def test_help(command: list[str]) -> None:
    from advbench.cli.main import main

    result = CliRunner().invoke(main, ["uap", *command, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output and len(result.output.splitlines()) > 5


def test_cfg_job_shows_the_seed_hyperparameters(workdir: Path) -> None:
    result = invoke("train", "metric=niqe_fitted", "--cfg", "job")
    assert result.exit_code == 0, result.output
    assert "lr: 0.001" in result.output and "batch_size: 8" in result.output and "epochs: 5" in result.output


@pytest.mark.parametrize("command", ["train", "eval", "stability"])
def test_unknown_metric_lists_valid_ones(workdir: Path, command: str) -> None:
    assert_one_line_error(invoke(command, "metric=nope"), "unknown metric 'nope'; valid:", "cnnqa", "niqe")


def test_amplitude_out_of_range(workdir: Path) -> None:
    result = invoke("eval", "metric=niqe_fitted", f"perturbation={SEED_PNG}", "amplitudes=[0.02,1.5]", "methods=[uap]")
    assert_one_line_error(result, "amplitude must be in (0, 1], got 1.5")


def test_missing_uap_file(workdir: Path) -> None:
    assert_one_line_error(invoke("eval", "metric=niqe_fitted", "perturbation=nowhere/uap.pt"), "no UAP at", "nowhere/uap.pt")


def test_missing_metric_weights(workdir: Path) -> None:
    result = invoke("eval", "metric=cnnqa", "metric.weights=nowhere/cnnqa.pt", f"perturbation={SEED_PNG}")
    assert_one_line_error(result, "weights file", "nowhere/cnnqa.pt")


def test_train_eval_and_ablation_end_to_end(workdir: Path) -> None:
    out = workdir / "e2e"
    result = invoke("train", "-m", *TINY_TRAIN, f"out_dir={out}", "seed=0,1")
    assert result.exit_code == 0, result.output
    folder = out / "niqe_fitted"
    assert sorted(p.name for p in folder.glob("*.p*")) == [
        "photos-seed0-n8-ep1.parquet", "photos-seed0-n8-ep1.png", "photos-seed0-n8-ep1.pt",
        "photos-seed1-n8-ep1.parquet", "photos-seed1-n8-ep1.png", "photos-seed1-n8-ep1.pt",
    ]
    records = read_records([folder])
    assert set(records["seed"]) == {0, 1} and (records["train_images_per_s"] > 0).all()

    result = invoke("eval", "metric=niqe_fitted", f"uap_dir={out}", "n_images=3", "amplitudes=[0.04,0.4]",
                    "madc.steps=3", "progress=false")
    assert result.exit_code == 0, result.output
    table = pd.read_csv(folder / "table1_photos-seed1-n8-ep1.csv")
    assert list(table["attack"]) == ["UAP", "MADC"]
    assert {"0.04", "0.4", "CPU time"} <= set(table.columns) and (table["seconds"] > 0).all()
    assert (table["0.4"].notna()).all()
    assert "| attack | a = 0.04 | a = 0.4 | CPU time |" in (folder / "table1_photos-seed1-n8-ep1.md").read_text()

    figure = workdir / "ablation.png"
    result = invoke("ablation", str(folder), "--out", str(figure))
    assert result.exit_code == 0, result.output
    assert figure.is_file()


def test_stability_records_rd_points(workdir: Path) -> None:
    out = workdir / "stability"
    result = invoke("stability", "metric=niqe_fitted", f"perturbation={SEED_PNG}", f"out_dir={out}", "synthetic.n=1",
                    "synthetic.size=[96,128]", "synthetic.frames=4", "amplitudes=[0.1]", "bitrates_kbps=[2000]",
                    "progress=false")
    assert result.exit_code == 0, result.output
    rd = read_records([out]).sort_values("amplitude")
    assert list(rd["amplitude"]) == [0.0, 0.1]
    assert rd["psnr"].iloc[1] < rd["psnr"].iloc[0] - 3  # the perturbation costs PSNR against the source
    assert (rd["metric"] == "niqe_fitted").all()


def test_stability_reruns_when_the_uap_file_or_csf_changes(workdir: Path) -> None:
    """Same path, other content; csf on: the points are recomputed, not skipped; a plain rerun skips."""
    from PIL import Image

    uap_file = workdir / "moving_uap.png"
    shutil.copy(SEED_PNG, uap_file)
    out = workdir / "stability-key"
    args = ("stability", "metric=niqe_fitted", f"perturbation={uap_file}", f"out_dir={out}", "synthetic.n=1",
            "synthetic.size=[96,96]", "synthetic.frames=2", "amplitudes=[0.1]", "bitrates_kbps=[2000]",
            "progress=false")

    def run(*extra: str) -> pd.DataFrame:
        result = invoke(*args, *extra)
        assert result.exit_code == 0, result.output
        return read_records([out]).sort_values("amplitude", ignore_index=True)

    first = run()
    assert "0 RD points written, 2 already there" in invoke(*args).output
    with Image.open(SEED_PNG) as im:
        im.transpose(Image.Transpose.FLIP_LEFT_RIGHT).save(uap_file)
    flipped = run()
    assert flipped["settings_key"].nunique() == 1 and flipped["settings_key"][0] != first["settings_key"][0]
    assert flipped["metric_score"][1] != first["metric_score"][1]  # the perturbed clip changed
    assert flipped["metric_score"][0] == first["metric_score"][0]  # the clean one did not
    masked = run("csf=true")
    assert masked["psnr"][1] > flipped["psnr"][1]  # the CSF mask weakens the perturbation
    assert "uap=" in masked["settings"][0] and "csf=True" in masked["settings"][0]
    assert masked["settings_key"][0] not in set(flipped["settings_key"])


def test_eval_uses_the_seed_png_on_a_folder(workdir: Path) -> None:
    from PIL import Image

    from advbench.quality.images import sample_photo

    images = workdir / "folder"
    images.mkdir()
    for name in ("astronaut", "coffee"):  # full photos of other sizes: centre crop + resize to 256
        pixels = (sample_photo(name) * 255).round().byte().permute(1, 2, 0).numpy()
        Image.fromarray(pixels).save(images / f"{name}.jpg", quality=95)
    shutil.copy(SEED_PNG, workdir / "seed.png")
    result = invoke("eval", "metric=niqe_fitted", f"perturbation={workdir / 'seed.png'}", f"data={images}", "methods=[uap]",
                    f"out_dir={workdir / 'folder-eval'}")
    assert result.exit_code == 0, result.output
    table = pd.read_csv(workdir / "folder-eval" / "niqe_fitted" / "table1_seed.csv")
    assert list(table["attack"]) == ["UAP"] and len(table.columns) == 11
