"""Transfer between metrics: judges score the very images a cell attacked, and the A × B matrix of
`advbench plot` holds each judge's gain in the MSU gain's scale, the attacked metric's own on its diagonal.

NIQE's pristine parameters here are a model fitted on four sample photos, written where `advbench weights
fetch niqe` puts the authors' file and in its format: these tests need neither basicsr nor a download."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from test_cli import assert_one_line_error
from test_iqa_run import iqa
from torch import nn

import advbench
from advbench.cli.config import compose_config
from advbench.core.errors import AdvbenchError
from advbench.core.records import read_kind
from advbench.quality.attacks.iterative import IFGSM
from advbench.quality.images import as_batch, sample_photos, uap_images
from advbench.quality.iqa.metric_transfer import render_transfer, transfer_gains, transfer_matrix
from advbench.quality.iqa.msu_scores import msu_scores
from advbench.quality.iqa.run import IqaSpec, MetricAttackSpec, iqa_cell
from advbench.quality.metrics.learned import CNNQA, save_weights, train_cnnqa
from advbench.quality.metrics.metric_contract import QualityMetric
from advbench.quality.metrics.niqe import NIQE
from advbench.quality.metrics.niqe_pristine import FETCHED_FILE, fit_pristine_model
from advbench.quality.metrics.user import UserMetric

BUDGETS = [2 / 255, 8 / 255]


class Recording(IFGSM):
    """I-FGSM that keeps every batch it returns, so a test can score the attacked images itself."""

    name = "ifgsm"

    def __init__(self) -> None:
        super().__init__(steps=2)
        self.batches: list[torch.Tensor] = []

    def run(self, metric, x, eps):
        result = super().run(metric, x, eps)
        self.batches.append(result.x_adv.detach().clone())
        return result


class HalfBrightness(nn.Module):
    """Mean brightness of the left or the right half of the image: attacking one half leaves the other alone."""

    def __init__(self, side: str) -> None:
        super().__init__()
        self.side = side

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        return (x[..., :half] if self.side == "left" else x[..., half:]).mean(dim=(1, 2, 3))


def spec(records: Path, metric: str, attack: IFGSM) -> IqaSpec:
    return IqaSpec(metric=metric, attack=MetricAttackSpec(attack, ("steps",)), eps=BUDGETS, data=None, n_images=2,
                   size=96, seed=0, device="cpu", batch_size=16, chunk_size=64, force=False, run_id="test",
                   progress=False, records_dir=str(records))


def run(records: Path, name: str, metric: QualityMetric, judges: dict, images: torch.Tensor,
        attack: IFGSM | None = None) -> pd.DataFrame:
    part = iqa_cell(spec(records, name, attack or Recording()), metric, (images, "test"), judges)
    return read_kind([part], kinds=("iqa",))[1]


@pytest.fixture(scope="module", autouse=True)
def niqe_parameters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """NIQE's parameter file, basicsr's keys and shapes, in a weights folder that this module's runs (and their
    subprocesses) use."""
    model = fit_pristine_model(sample_photos("train")[4:8])
    folder = tmp_path_factory.mktemp("weights")
    np.savez(folder / FETCHED_FILE, mu_pris_param=model["mu"].numpy()[None], cov_pris_param=model["cov"].numpy())
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ADVBENCH_WEIGHTS", str(folder))
        yield folder / FETCHED_FILE


@pytest.fixture(scope="module")
def metrics(tmp_path_factory: pytest.TempPathFactory) -> dict[str, QualityMetric]:
    weights = save_weights(train_cnnqa(steps=60, progress=False), tmp_path_factory.mktemp("cnnqa") / "w.pt")
    return {"cnnqa": CNNQA(weights=str(weights)).eval(), "niqe": NIQE(cache_dir=str(tmp_path_factory.mktemp("niqe"))).eval()}


@pytest.fixture(scope="module")
def images() -> torch.Tensor:
    return as_batch(uap_images(None, split="test", size=96, limit=2))


@pytest.fixture(scope="module")
def sweep(metrics: dict, images: torch.Tensor, tmp_path_factory: pytest.TempPathFactory) -> tuple[pd.DataFrame, dict]:
    """Both offline metrics attacked, each judged by both: the records, and each cell's attacked images."""
    records, attacks = tmp_path_factory.mktemp("records"), {}
    frames = []
    for name, metric in metrics.items():
        attacks[name] = Recording()
        frames.append(run(records, name, metric, metrics, images, attacks[name]))
    return pd.concat(frames, ignore_index=True), attacks


def test_judges_score_the_attacked_image(sweep: tuple, metrics: dict, images: torch.Tensor) -> None:
    frame, attacks = sweep
    for name, attack in attacks.items():
        cell = frame[frame["metric"] == name].sort_values("sample_id")
        other = "niqe" if name == "cnnqa" else "cnnqa"
        assert [list(j) for j in cell["judges"]] == [[other]] * len(cell), "the attacked metric is no judge of itself"
        assert list(cell["judge_higher_better"].map(lambda d: bool(d[0]))) == [metrics[other].higher_better] * len(cell)
        (x_adv,) = attacks[name].batches  # one batch holds the cell's 4 rows
        with torch.no_grad():
            attacked = metrics[other](x_adv).double().numpy()
            clean = metrics[other](images[torch.tensor(cell["image_id"].to_numpy())]).double().numpy()
        np.testing.assert_allclose(np.stack(cell["judge_attacked"].to_numpy())[:, 0], attacked, rtol=1e-5)
        np.testing.assert_allclose(np.stack(cell["judge_clean"].to_numpy())[:, 0], clean, rtol=1e-5)
        assert not np.allclose(attacked, clean, rtol=1e-6), "the attack changed what the judge sees"


def test_diagonal_equals_the_own_gain(sweep: tuple) -> None:
    frame, _ = sweep
    gains = transfer_gains(frame)
    own = msu_scores(frame).set_index(["metric", "attack", "eps"])["abs_gain"]
    diagonal = gains[gains["metric"] == gains["judge"]].set_index(["metric", "attack", "eps"])["gain"]
    assert len(diagonal) == 2 * len(BUDGETS)
    np.testing.assert_allclose(diagonal.sort_index().to_numpy(), own.sort_index().to_numpy(), rtol=1e-9)


def test_off_diagonal_is_the_judges_gain_scaled_on_its_clean_scores(sweep: tuple) -> None:
    """NIQE (lower is better) judging CNNQA's images, worked out from the records by hand."""
    frame, _ = sweep
    cell = frame[(frame["metric"] == "cnnqa") & np.isclose(frame["eps"], BUDGETS[1])]
    clean = -np.stack(cell["judge_clean"].to_numpy())[:, 0]
    attacked = -np.stack(cell["judge_attacked"].to_numpy())[:, 0]
    every_clean = -np.stack(frame.loc[frame["metric"] == "cnnqa", "judge_clean"].to_numpy())[:, 0]
    width = every_clean.max() - every_clean.min()
    expected = np.mean((attacked - clean) / width)
    gains = transfer_gains(frame)
    got = gains[(gains["metric"] == "cnnqa") & (gains["judge"] == "niqe") & np.isclose(gains["eps"], BUDGETS[1])]
    np.testing.assert_allclose(got["gain"].to_numpy(), [expected], rtol=1e-9)


def test_matrix_has_the_runs_metrics_as_rows_and_columns(sweep: tuple, tmp_path: Path) -> None:
    frame, _ = sweep
    gains = transfer_gains(frame)
    matrix = transfer_matrix(gains, "ifgsm", BUDGETS[1])
    assert list(matrix.index) == ["cnnqa", "niqe"] and list(matrix.columns) == ["cnnqa", "niqe"]
    assert np.isfinite(matrix.to_numpy()).all()
    written = render_transfer(frame, tmp_path)
    assert [p.name for p in written] == ["transfer.csv", "transfer.md", "transfer.png"]
    assert all(p.stat().st_size > 0 for p in written)
    assert len(pd.read_csv(tmp_path / "transfer.csv")) == len(BUDGETS) * 2 * 2
    table = (tmp_path / "transfer.md").read_text(encoding="utf-8")
    assert "| attacked \\ judge | cnnqa | niqe |" in table
    assert table.count("\n| cnnqa |") == 1 and table.count("\n| niqe |") == 1


def test_no_judges_no_matrix_and_parts_without_judges_beside_others(sweep: tuple, tmp_path: Path) -> None:
    frame, _ = sweep
    unjudged = frame.drop(columns=["judges", "judge_higher_better", "judge_clean", "judge_attacked"])
    assert render_transfer(unjudged, tmp_path) == []
    assert not (tmp_path / "transfer.md").exists()
    mixed = pd.concat([frame[frame["metric"] == "niqe"], unjudged[unjudged["metric"] == "cnnqa"]], ignore_index=True)
    matrix = transfer_matrix(transfer_gains(mixed), "ifgsm", BUDGETS[1])
    assert np.isfinite(matrix.to_numpy()).tolist() == [[True, False], [True, True]]  # cnnqa's images: no judge


def test_a_metric_that_fools_no_one(tmp_path: Path) -> None:
    """Attacking the left half's brightness changes nothing the right half's judge sees: 0 off the diagonal."""
    left, right = (UserMetric(HalfBrightness(side), side, True) for side in ("left", "right"))
    images = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(0)) * 0.8 + 0.1
    judges = {"left": left, "right": right}
    frame = pd.concat([run(tmp_path, "left", left, judges, images), run(tmp_path, "right", right, judges, images)])
    matrix = transfer_matrix(transfer_gains(frame), "ifgsm", BUDGETS[1])
    diagonal, off = np.diag(matrix.to_numpy()), matrix.to_numpy()[~np.eye(2, dtype=bool)]
    assert (diagonal > 0.1).all(), diagonal
    assert (np.abs(off) <= 1e-6 * diagonal.min()).all(), off
    unjudged = run(tmp_path, "left", left, {}, images)
    assert set(unjudged["cell_key"]) != set(frame.loc[frame["metric"] == "left", "cell_key"]), "judges key the cell"
    assert "judges" not in unjudged


def test_a_judge_under_the_attacked_metrics_name_must_be_it(tmp_path: Path) -> None:
    left = UserMetric(HalfBrightness("left"), "left", True)
    impostor = UserMetric(HalfBrightness("right"), "left", True)
    with pytest.raises(AdvbenchError, match="judge 'left' has the attacked metric's name but other weights"):
        run(tmp_path, "left", left, {"left": impostor}, torch.rand(2, 3, 32, 32))


@pytest.mark.parametrize(("judges", "needle"), [
    ("[nope]", "unknown judge 'nope'; valid: cnnqa"),
    ("[niqe,niqe]", "judges repeats a metric"),
    ("[python]", "judge 'python' cannot be built from its name"),
    ("3", "judges must be a list of metric names"),
])
def test_bad_judges_are_one_line_before_any_work(judges: str, needle: str) -> None:
    with pytest.raises(AdvbenchError) as caught:
        compose_config("iqa", ["metric=niqe", f"judges={judges}"])
    assert needle in str(caught.value) and "\n" not in str(caught.value)


def test_unknown_judge_on_the_command_line_and_in_python(tmp_path: Path) -> None:
    assert_one_line_error(iqa(tmp_path, tmp_path / "cache", "judges=[nope]"), "unknown judge 'nope'")
    with pytest.raises(AdvbenchError, match="unknown judge 'nope'"):
        advbench.evaluate_metric(HalfBrightness("left"), torch.rand(2, 3, 32, 32), judges=["nope"])


@pytest.mark.slow
def test_judges_by_name_on_the_command_line_and_plot(tmp_path: Path) -> None:
    """`judges=[niqe]` builds NIQE from its option and records its scores; `advbench plot` draws the matrix."""
    proc = iqa(tmp_path, tmp_path / "cache", "attack=fgsm", "size=96", "judges=[niqe,cnnqa]")
    assert proc.returncode == 0, proc.stderr
    frame = read_kind([tmp_path / "out" / "records"])[1]
    assert [list(j) for j in frame["judges"]] == [["niqe"]] * len(frame)
    assert [list(d) for d in frame["judge_higher_better"]] == [[False]] * len(frame)
    plot = subprocess.run([sys.executable, "-m", "advbench", "plot", str(tmp_path / "out" / "records"),
                           "--out", str(tmp_path / "fig")], capture_output=True, text=True, timeout=600)
    assert plot.returncode == 0, plot.stderr
    assert "| cnnqa | " in (tmp_path / "fig" / "transfer.md").read_text(encoding="utf-8")
    gains = pd.read_csv(tmp_path / "fig" / "transfer.csv")
    assert sorted(set(zip(gains["metric"], gains["judge"]))) == [("cnnqa", "cnnqa"), ("cnnqa", "niqe")]
