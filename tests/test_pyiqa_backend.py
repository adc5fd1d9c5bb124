"""`metric=pyiqa` against the real IQA-PyTorch package: MUSIQ, built without its pretrained weights
(nothing is downloaded), its weights a file written here in pyiqa's layout. advbench's scores must be
pyiqa's own scores of the same network, and `iqa run` must attack it end to end.

Skipped where pyiqa is not installed (it is an optional extra; .ci/run installs it)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import torch
from test_cli import run_cli

from advbench.core.records import read_kind
from advbench.quality.metrics.pyiqa_backend import PyiqaMetric

pyiqa = pytest.importorskip("pyiqa")


@pytest.fixture(scope="module")
def musiq_weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A MUSIQ network of pyiqa's, seeded, saved as pyiqa saves its released weights (under `params`)."""
    torch.manual_seed(0)
    reference = pyiqa.create_metric("musiq", as_loss=False, device="cpu", pretrained=False)
    path = tmp_path_factory.mktemp("pyiqa") / "musiq.pth"
    torch.save({"params": reference.net.state_dict()}, path)
    return path


def images(n: int = 2, size: int = 96) -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    smooth = torch.nn.functional.interpolate(torch.rand(n, 3, 12, 12, generator=g), size=size, mode="bilinear")
    return (smooth + 0.05 * torch.rand(n, 3, size, size, generator=g)).clamp(0, 1)


def test_scores_are_pyiqas_own_for_the_same_weights(musiq_weights: Path) -> None:
    ours = PyiqaMetric("musiq", weights=str(musiq_weights)).eval()
    theirs = pyiqa.create_metric("musiq", as_loss=False, device="cpu", pretrained=False)
    theirs.net.load_state_dict(torch.load(musiq_weights, weights_only=True)["params"])
    theirs.net.eval()
    x = images()
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x).reshape(-1), rtol=1e-5, atol=1e-5)
    assert ours.higher_better and not theirs.lower_better


def test_the_score_has_an_input_gradient(musiq_weights: Path) -> None:
    metric = PyiqaMetric("musiq", weights=str(musiq_weights)).eval()
    x = images().requires_grad_(True)
    (grad,) = torch.autograd.grad(metric(x).sum(), x)
    assert torch.isfinite(grad).all() and grad.abs().sum() > 0


def test_iqa_run_attacks_a_pyiqa_metric_end_to_end(musiq_weights: Path, tmp_path: Path) -> None:
    proc = run_cli("iqa", "run", "metric=pyiqa", "metric.name=musiq", f"metric.weights={musiq_weights}",
                   "attack=ifgsm", "n_images=2", "size=96", "eps=[0.03137254901960784]", "device=cpu", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    parts = sorted((tmp_path / "advbench-out" / "iqa" / "records").glob("*.parquet"))
    records = read_kind(parts, kinds=("iqa",))[1]
    assert isinstance(records, pd.DataFrame) and len(records) == 2 and set(records["metric"]) == {"pyiqa"}
    delta = (records["score_attacked"] - records["score_clean"])
    assert (delta > 0).all(), records[["score_clean", "score_attacked"]]


def test_a_name_pyiqa_does_not_know_is_one_line(tmp_path: Path) -> None:
    proc = run_cli("iqa", "run", "metric=pyiqa", "metric.name=no_such_metric", cwd=tmp_path)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "no_such_metric" in proc.stderr, proc.stderr
