"""`metric=pyiqa` against the real IQA-PyTorch package, one test per family of its no-reference metrics
(docs/quality.md tables them): networks (MUSIQ, CNNIQA, MetaIQA, WaDIQaM) built without their pretrained
weights and given a file written here in pyiqa's layout; metrics that read a parameter file (NIQE, BRISQUE)
given one written here in pyiqa's format; the classic ones that need nothing (PIQE, entropy). advbench's
scores must be pyiqa's own for the same weights, and `iqa run` must attack MUSIQ end to end. Nothing is
downloaded: a metric that needs a missing package, or a file pyiqa would fetch at build, is one line.

Skipped where pyiqa is not installed (an optional extra; scripts/setup.sh installs it)."""

from __future__ import annotations

import sys
import urllib.error
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from test_cli import run_cli

from advbench.core.errors import AdvbenchError
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


NETWORKS = {"cnniqa": None, "metaiqa": False, "wadiqam_nr": False}
"""Networks beside MUSIQ that build offline, and the value of their `pretrained` argument that turns the download off."""


@pytest.mark.parametrize(("name", "off"), NETWORKS.items())
def test_networks_score_as_pyiqa_with_the_same_weights(name: str, off: bool | None, tmp_path: Path) -> None:
    """CNNIQA's `pretrained` names a data set (off is None), the others' is a flag: each gets its own off value."""
    torch.manual_seed(1)
    theirs = pyiqa.create_metric(name, as_loss=False, device="cpu", pretrained=off)
    for p in theirs.net.parameters():
        p.data.normal_(0, 0.05)
    torch.save({"params": theirs.net.state_dict()}, tmp_path / "w.pth")
    theirs.net.eval()
    ours = PyiqaMetric(name, weights=str(tmp_path / "w.pth"))
    x = images()
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x).reshape(-1), rtol=1e-5, atol=1e-6)
    assert ours.pretrained


def _niqe_file(path: Path) -> Path:
    """pyiqa's NIQE parameters (`mu_prisparam`, `cov_prisparam` in a .mat), seeded, positive definite."""
    from scipy.io import savemat

    g = np.random.default_rng(0)
    factor = g.normal(size=(36, 36))
    savemat(path, {"mu_prisparam": g.normal(size=(1, 36)), "cov_prisparam": factor @ factor.T + np.eye(36)})
    return path


def _brisque_file(path: Path) -> Path:
    """pyiqa's BRISQUE support vectors: `(sv_coef, sv)` as torch.save writes them, tensors only."""
    g = torch.Generator().manual_seed(0)
    torch.save((torch.randn(20, generator=g, dtype=torch.float64), torch.rand(20, 36, generator=g, dtype=torch.float64)),
               path)
    return path


@pytest.mark.parametrize(("name", "write"), [("niqe", _niqe_file), ("brisque", _brisque_file)])
def test_parameter_file_metrics_read_the_configs_file(name: str, write, tmp_path: Path) -> None:
    """NIQE and BRISQUE take no `pretrained` (passing it was a TypeError): metric.weights is their parameter file."""
    path = write(tmp_path / ("params.mat" if name == "niqe" else "params.pth"))
    ours = PyiqaMetric(name, weights=str(path))
    theirs = pyiqa.create_metric(name, as_loss=False, device="cpu", pretrained_model_path=str(path))
    x = images(size=128)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x).reshape(-1).to(ours(x).dtype), rtol=1e-5, atol=1e-6)
    assert ours.pretrained and not ours.higher_better


def test_a_parameter_file_must_be_a_file_and_hold_tensors_only(tmp_path: Path) -> None:
    """BRISQUE's file goes to pyiqa's pickle-allowing load: advbench reads it tensors-only first."""
    torch.save({"svm": torch.nn.Linear(2, 2)}, tmp_path / "pickled.pth")
    for path, needle in [(tmp_path / "absent.mat", "which is not a file"), (tmp_path / "pickled.pth", "parameter file")]:
        with pytest.raises(AdvbenchError, match=needle) as caught:
            PyiqaMetric("brisque" if path.suffix == ".pth" else "niqe", weights=str(path))
        assert "\n" not in str(caught.value)


@pytest.mark.parametrize("name", ["piqe", "entropy"])
def test_classic_metrics_need_nothing(name: str, recwarn: pytest.WarningsRecorder) -> None:
    """No file, no `pretrained` (PIQE's constructor refused it), and no warning of random weights: they have none."""
    ours = PyiqaMetric(name, weights=None)
    assert ours.pretrained and not [w for w in recwarn if "random weights" in str(w.message)]
    theirs = pyiqa.create_metric(name, as_loss=False, device="cpu")
    x = images(size=128)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x).reshape(-1).to(ours(x).dtype), rtol=1e-5, atol=1e-6)


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Every download pyiqa or torchvision would start fails at once, and their caches are empty folders."""
    def refuse(url: str, *args: object, **kwargs: object) -> None:
        raise urllib.error.URLError("no network in tests")

    download_util = sys.modules["pyiqa.utils.download_util"]
    monkeypatch.setattr(download_util, "download_url_to_file", refuse)
    monkeypatch.setattr(download_util, "DEFAULT_CACHE_DIR", str(tmp_path / "pyiqa"))
    monkeypatch.setattr(torch.hub, "download_url_to_file", refuse)
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))


@pytest.mark.parametrize("name", ["niqe", "dbcnn"])
def test_a_file_fetched_at_build_is_one_line_offline(name: str, offline: None) -> None:
    """NIQE without metric.weights wants pyiqa's parameter file, DBCNN torchvision's VGG-16: one line, no traceback."""
    with pytest.raises(AdvbenchError, match=f"pyiqa metric '{name}' downloads a file when built, which failed") as caught:
        PyiqaMetric(name, weights=None)
    assert "\n" not in str(caught.value)


def test_a_missing_package_is_named_with_its_pip_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """HyperIQA's module imports timm, CLIP-IQA's `clip` (pip: openai-clip); neither comes with pyiqa --no-deps."""
    registry = sys.modules["pyiqa.utils.registry"].ARCH_REGISTRY
    for name, module, arch, package in [("hyperiqa", "timm", "HyperNet", "pip install timm"),
                                        ("clipiqa", "clip", "CLIPIQA", "pip install openai-clip")]:
        if arch in registry:
            pytest.skip(f"{module} is installed here and {arch} already registered")
        monkeypatch.setitem(sys.modules, module, None)
        with pytest.raises(AdvbenchError, match=f"pyiqa metric '{name}' needs the package '{module}'") as caught:
            PyiqaMetric(name, weights=None)
        assert str(caught.value).endswith(package) and "\n" not in str(caught.value)
