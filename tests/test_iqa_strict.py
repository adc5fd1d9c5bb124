"""The quality half held to the robustness half's standard: a metric that fails after the up-front check, or
whose scores stop being numbers, is one line naming the metric, the image and the budget, and nothing is
written; the console says what its scaled gain is scaled by; a UAP too weak for 8-bit frames is named."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from click.testing import CliRunner
from PIL import Image
from test_cli import assert_one_line_error

import advbench
from advbench.cli.main import main
from advbench.core.errors import AdvbenchError
from advbench.core.user_code import resolve_target
from advbench.quality.attacks.metric_attack import check_attackable
from advbench.quality.iqa.guard import check_judged, is_user_metric
from advbench.quality.iqa.run import summarize
from advbench.quality.metrics.defended import BlurParams, DefendedMetric, MetricDefense
from advbench.quality.metrics.metric_contract import QualityMetric
from advbench.quality.metrics.user import UserMetric
from advbench.quality.stability.uap_rd import check_visible

pytestmark = pytest.mark.usefixtures("one_thread")

METRIC_SOURCE = '''
import sys

import torch
from torch import nn


class Late(nn.Module):
    """A mean-brightness score that passes the up-front checks (the first two, dark images and a probe of
    uniform noise) and goes wrong on a bright image (mean above 0.6), the cell's third."""

    def __init__(self, mode="raise"):
        super().__init__()
        self.mode = mode

    def forward(self, x):
        score = x.mean(dim=(1, 2, 3))
        bright = score > 0.6
        if not bool(bright.any()):
            return score
        if self.mode == "raise":
            raise ValueError("broke on a bright image\\nand a second line")
        if self.mode == "exit":
            sys.exit(3)
        off_grid = ((x * 255 - (x * 255).round()).abs() > 1e-3).flatten(1).any(dim=1)
        wrong = {"nan": bright, "attacked_nan": bright & torch.is_grad_enabled(),
                 "off_grid_nan": bright & off_grid & (not torch.is_grad_enabled())}.get(self.mode)
        if wrong is not None:
            return score.masked_fill(wrong, float("nan"))
        return torch.where(bright, score + float("inf"), score) if self.mode == "inf" else score
'''
EPS = [1 / 255, 4 / 255]
TINY = ["data=imgs", "size=16", "eps=[0.00392156862745098,0.01568627450980392]", "progress=false", "threads=1",
        "out_dir=out", "attack=fgsm", "metric=python", "metric.target=late.py:Late", "metric.higher_better=true"]


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "late.py").write_text(METRIC_SOURCE)
    (tmp_path / "imgs").mkdir()
    for name, image in zip("abc", _images()):
        Image.fromarray((image.permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)).save(tmp_path / "imgs" / f"{name}.png")
    return tmp_path


def _late(mode: str) -> torch.nn.Module:
    return resolve_target("late.py:Late", "metric")(mode)


def _images() -> torch.Tensor:
    """Two dark images, then a bright one, on the 8-bit grid."""
    noise = (torch.rand(3, 3, 16, 16, generator=torch.Generator().manual_seed(0)) * 0.3 * 255).round() / 255
    return noise + torch.tensor([0.0, 0.0, 179 / 255]).view(3, 1, 1, 1)


def _parts(where: Path) -> list[Path]:
    return sorted(where.rglob("*.parquet"))


# ---------------------------------------------------------------- a metric failing after the check


@pytest.mark.parametrize(("mode", "says"), [
    ("raise", "fgsm on images 0–2 at ε=1/255, ε=4/255 failed: ValueError: broke on a bright image"),
    ("exit", "fgsm on images 0–2 at ε=1/255, ε=4/255 failed: exited with status 3"),
])
def test_a_metric_raising_mid_cell_is_one_line_naming_it_the_images_and_budgets(folder: Path, mode: str,
                                                                                 says: str) -> None:
    with pytest.raises(AdvbenchError) as caught:
        advbench.evaluate_metric(advbench.Metric(_late(mode), label="late"), _images(), attack="fgsm", eps=EPS, out_dir=folder / "o")
    message = str(caught.value)
    assert message.startswith("metric 'late': ") and says in message and "\n" not in message
    assert _parts(folder / "o") == []


def test_rows_are_named_as_a_user_reads_them() -> None:
    from advbench.quality.iqa.guard import rows_named

    assert rows_named(torch.tensor([0, 1, 2, 5, 7, 8])) == "images 0–2, 5, 7, 8"
    assert rows_named(torch.tensor([3, 3]), torch.tensor([4 / 255, 1 / 255])) == "image 3 at ε=1/255, ε=4/255"


def test_a_batch_of_one_row_names_its_image_and_budget(folder: Path) -> None:
    with pytest.raises(AdvbenchError, match=r"metric 'late': fgsm on image 2 at ε=1/255 failed: ValueError"):
        advbench.evaluate_metric(advbench.Metric(_late("raise"), label="late"), _images(), attack="fgsm", eps=EPS,
                                 overrides=["batch_size=1"])


def test_the_command_line_says_it_in_one_line_and_exits_1(folder: Path) -> None:
    result = CliRunner().invoke(main, ["iqa", "run", *TINY, "metric.kwargs={mode:raise}", "metric.label=late"])
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert errors == ["Error: metric 'late': fgsm on images 0–2 at ε=1/255, ε=4/255 failed: ValueError: broke on "
                      "a bright image"], result.output
    assert _parts(folder / "out" / "records") == []


def test_a_process_ends_with_one_line_and_status_1(folder: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "advbench", "iqa", "run", *TINY, "metric.kwargs={mode:raise}"],
                          capture_output=True, text=True, timeout=600, cwd=folder)
    assert_one_line_error(proc, "fgsm on images 0–2 at ε=1/255, ε=4/255 failed: ValueError")


def test_only_a_users_metric_is_blamed() -> None:
    """advbench's own metrics failing is a bug, whose traceback stays; a user's metric, defended or not, is named."""

    class Shipped(QualityMetric):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.mean(dim=(1, 2, 3))

    user = UserMetric(torch.nn.Identity(), "mine", True)
    assert is_user_metric(user) and is_user_metric(DefendedMetric(user, MetricDefense("blur", BlurParams(1.0))))
    assert not is_user_metric(Shipped())


# ---------------------------------------------------------------- scores that are not numbers


@pytest.mark.parametrize(("mode", "says"), [
    ("nan", "metric 'late' gave the clean score nan for image 2 at ε=1/255 (2 of 6 rows of its batch)"),
    ("inf", "metric 'late' gave the clean score inf for image 2 at ε=1/255 (2 of 6 rows of its batch)"),
    ("attacked_nan", "metric 'late' gave a score or input gradient of nan during fgsm for image 2 at ε=1/255 "
                     "(2 of 6 rows of its batch)"),
    ("off_grid_nan", "metric 'late' gave the attacked score nan for image 2 at ε=0.5/255 (1 of 3 rows of its batch)"),
])
def test_non_finite_scores_after_the_check_write_nothing(folder: Path, mode: str, says: str) -> None:
    eps = [0.5 / 255] if mode == "off_grid_nan" else EPS
    with pytest.raises(AdvbenchError) as caught:
        advbench.evaluate_metric(advbench.Metric(_late(mode), label="late"), _images(), attack="fgsm", eps=eps, out_dir=folder / "o")
    assert str(caught.value) == f"{says}; no records are written for the cell"
    assert _parts(folder / "o") == []


@pytest.mark.parametrize(("mode", "says"), [
    ("raise", "metric 'late': scoring the clean images without the defense on images 0–2 failed: ValueError: broke on "
              "a bright image"),
    ("nan", "metric 'late' gave the undefended clean score nan for image 2 (1 of 3 rows of its batch); no records are "
            "written for the cell"),
])
def test_a_defended_metrics_undefended_scores_are_checked_too(folder: Path, mode: str, says: str) -> None:
    with pytest.raises(AdvbenchError) as caught:
        advbench.evaluate_metric(advbench.Metric(_late(mode), label="late"), _images(), attack="fgsm", eps=EPS, out_dir=folder / "o",
                                 overrides=["defense=median"])
    assert str(caught.value) == says and _parts(folder / "o") == []


def test_the_command_line_refuses_nan_scores_and_writes_no_part(folder: Path) -> None:
    result = CliRunner().invoke(main, ["iqa", "run", *TINY, "metric.kwargs={mode:attacked_nan}"])
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert result.exit_code == 1 and len(errors) == 1 and "gave a score or input gradient of nan during fgsm for image 2" in errors[0], \
        result.output
    assert "+nan" not in result.output and _parts(folder / "out" / "records") == []


def test_a_judge_turning_nan_is_named() -> None:
    columns = {"judges": [np.array(["a", "b"], dtype=object)] * 2, "judge_clean": [np.array([1.0, 2.0])] * 2,
               "judge_attacked": [np.array([1.0, 2.0]), np.array([1.0, np.inf])]}
    with pytest.raises(AdvbenchError, match=r"^judge 'b' gave the attacked score inf for image 1 at ε=4/255 "
                                            r"\(1 of 2 rows of its batch\)"):
        check_judged(columns, torch.tensor([0, 1]), torch.tensor([1 / 255, 4 / 255]))


# ---------------------------------------------------------------- the zero-gradient error's way out


def test_a_zero_gradient_points_to_the_score_based_attack() -> None:
    metric = UserMetric(torch.nn.Identity(), "flat", True)
    metric.forward = lambda x: (x * 0).sum(dim=(1, 2, 3))  # type: ignore[method-assign]
    with pytest.raises(AdvbenchError, match=r"zero input gradient .*attack=\"square\" in Python"):
        check_attackable(metric, "flat", _images())


# ---------------------------------------------------------------- the console's gain


def _cell(clean: list[float], attacked: list[float]) -> pd.DataFrame:
    return pd.DataFrame({"metric": "m", "attack": "fgsm", "eps": 8 / 255, "cell_key": "k", "image_id": range(len(clean)),
                         "score_clean": clean, "score_attacked": attacked, "higher_better": True, "psnr": 40.0,
                         "ssim": 0.99})


def test_the_console_gain_does_not_depend_on_the_cells_size(capsys: pytest.CaptureFixture) -> None:
    """The same per-image change (+1 on every image) in a cell of 2 and one of 4 images: the raw gain is
    the same, the scaled one is not, and the line says what it divided by."""
    summarize(_cell([0.0, 2.0], [1.0, 3.0]), "m/fgsm", Path("a.parquet"))
    summarize(_cell([0.0, 2.0, 4.0, 8.0], [1.0, 3.0, 5.0, 9.0]), "m/fgsm", Path("b.parquet"))
    small, large = capsys.readouterr().out.splitlines()[:2]
    assert "ε=8/255: +1 (+0.5 scaled, 40.0 dB)" in small and "÷ 2, the range of the cell's 2 clean scores" in small
    assert "ε=8/255: +1 (+0.125 scaled, 40.0 dB)" in large and "÷ 8, the range of the cell's 4 clean scores" in large


# ---------------------------------------------------------------- a UAP too weak for 8-bit frames


def test_a_uap_changing_no_8_bit_level_is_refused_with_what_to_do(tmp_path: Path) -> None:
    uap = torch.full((3, 8, 8), 0.002)   # times amplitude / 0.1 × 255: 0.41 of a level at 0.08
    with pytest.raises(AdvbenchError, match=r"adds at most 0\.41 of one 8-bit level at amplitude 0\.08, which rounds "
                                            r"away: .*stability curve would be empty; train it longer .*amplitudes "
                                            r"of at least 0\.098"):
        check_visible(uap, [0.02, 0.08], tmp_path / "u.pt")


def test_a_uap_too_weak_at_some_amplitudes_is_a_warning(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    check_visible(torch.full((3, 8, 8), 0.002), [0.02, 0.08, 0.4], tmp_path / "u.pt")
    said = " ".join(capsys.readouterr().err.split())
    assert "amplitudes 0.02, 0.08 change no 8-bit frame" in said and "0.41 of one 8-bit level at amplitude 0.08" in said
    check_visible(torch.full((3, 8, 8), 0.002), [0.4, 0.6], tmp_path / "u.pt")
    assert capsys.readouterr().err == ""


def test_records_of_a_uap_that_changed_no_frame_say_why_there_is_no_curve() -> None:
    """Records written before the check (or by hand): zero PSNR loss at every amplitude names the cause."""
    from advbench.quality.stability import scores

    curves = pd.DataFrame({"metric": ["weak", "weak", "fine", "fine"], "amplitude": [0.02, 0.08] * 2,
                           "loss": [0.0, 0.0, 0.1, 0.3], "gain": [0.0, 0.0, 0.1, 0.2]})
    with pytest.raises(AdvbenchError, match=r"^the perturbation of weak cost no PSNR at any amplitude: it changed no "
                                            r"8-bit frame"):
        scores.stability_scores(curves)
