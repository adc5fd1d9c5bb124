"""NIQE on the authors' parameters: against basicsr's MATLAB-faithful port, its own reference path, and its files."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import scipy.io
import torch

from advbench.core.errors import AdvbenchError
from advbench.quality.images import photo_crops, photo_names, sample_photo, sample_photos
from advbench.quality.metrics import niqe_pristine
from advbench.quality.metrics.niqe import NIQE
from advbench.quality.metrics.niqe_features import block_features, halve
from advbench.quality.metrics.niqe_pristine import fit_pristine_model, read_pristine_file

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "niqe_vs_basicsr.py"
needs_basicsr = pytest.mark.skipif(importlib.util.find_spec("basicsr") is None, reason="basicsr is not installed")


def load_script():
    spec = importlib.util.spec_from_file_location("niqe_vs_basicsr", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def basicsr_niqe_module():
    """basicsr's niqe module (its `calculate_niqe`'s globals hold the helpers)."""
    return load_script().basicsr_niqe().__globals__


@pytest.fixture(scope="module")
def small_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A pristine model fitted on four textured photos (68 sharp blocks), as basicsr's .npz: no basicsr needed."""
    model = fit_pristine_model(sample_photos("train")[4:8])
    path = tmp_path_factory.mktemp("niqe") / "pris.npz"
    np.savez(path, mu_pris_param=model["mu"].numpy()[None], cov_pris_param=model["cov"].numpy())
    return path


@needs_basicsr
@pytest.mark.slow
def test_reference_parameters_agree_with_basicsr_on_every_sample_photo() -> None:
    rows = load_script().compare(list(photo_names("all")))
    for name, theirs, ours, smooth in rows:
        assert ours == pytest.approx(theirs, rel=1e-2), name
        assert smooth == pytest.approx(theirs, rel=1e-2), name
    assert len(rows) == len(photo_names("all"))


@needs_basicsr
@pytest.mark.filterwarnings("ignore:Mean of empty slice", "ignore:invalid value encountered")
def test_block_features_match_basicsr_including_its_nan_rules(basicsr_niqe_module) -> None:
    g = torch.Generator().manual_seed(0)
    noisy = torch.randn(2, 48, 48, generator=g, dtype=torch.float64)
    one_sided = noisy.abs() + 0.1  # no negative value: the reference's shape falls to 0.2, its left scale is NaN
    block = torch.cat([noisy, one_sided])[None]
    ours, valid = block_features(block, exact=True)
    theirs = torch.tensor([basicsr_niqe_module["compute_feature"](b.numpy()) for b in block[0]], dtype=torch.float64)
    assert torch.equal(valid[0], ~theirs.isnan())
    torch.testing.assert_close(ours[0][valid[0]], theirs[~theirs.isnan()], rtol=1e-9, atol=0)
    assert (ours[0, 2:, 0] == 0.2).all()


@needs_basicsr
def test_halving_is_matlab_imresize(basicsr_niqe_module) -> None:
    grey = torch.rand(1, 1, 96, 192, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    theirs = basicsr_niqe_module["imresize"](grey[0, 0].numpy(), scale=0.5, antialiasing=True)
    torch.testing.assert_close(halve(grey)[0, 0], torch.from_numpy(theirs).double(), rtol=0, atol=1e-6)


def test_differentiable_path_agrees_with_the_reference_and_has_gradients(small_model: Path) -> None:
    metric = NIQE(pristine=str(small_model))
    crops = photo_crops("test")[::5]
    reference = metric.reference(crops)
    x = crops.clone().requires_grad_(True)
    score = metric(x)
    torch.testing.assert_close(score.detach().double(), reference, rtol=1e-2, atol=0)
    (grad,) = torch.autograd.grad(score.sum(), x)
    assert torch.isfinite(grad).all() and (grad.flatten(1).abs().sum(1) > 0).all()


def test_pristine_files_in_each_format_give_the_same_model(small_model: Path, tmp_path: Path) -> None:
    model = read_pristine_file(small_model)
    scipy.io.savemat(tmp_path / "modelparameters.mat", {"mu_prisparam": model["mu"].numpy()[None],
                                                         "cov_prisparam": model["cov"].numpy()})
    torch.save(model, tmp_path / "model.pt")
    for other in ("modelparameters.mat", "model.pt"):
        again = read_pristine_file(tmp_path / other)
        assert torch.equal(again["mu"], model["mu"]) and torch.equal(again["cov"], model["cov"])
    photo = sample_photo("coffee")[None]
    assert NIQE(pristine=str(tmp_path / "modelparameters.mat"))(photo) == NIQE(pristine=str(small_model))(photo)


def test_bad_pristine_files_are_one_line_errors(tmp_path: Path) -> None:
    np.savez(tmp_path / "wrong.npz", mu=np.zeros(5), cov=np.eye(5))
    (tmp_path / "model.txt").write_text("mu")
    cases = {"wrong.npz": "not a pristine model", "model.txt": ".npz, .mat or .pt", "nope.mat": "not found"}
    for name, message in cases.items():
        with pytest.raises(AdvbenchError, match=message) as info:
            NIQE(pristine=str(tmp_path / name))
        assert "\n" not in str(info.value)


def test_without_the_parameters_the_error_names_the_fetch_command(monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path: Path) -> None:
    monkeypatch.setattr(niqe_pristine.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setenv("ADVBENCH_WEIGHTS", str(tmp_path))
    with pytest.raises(AdvbenchError, match="fetch them \\(online\\) with advbench weights fetch niqe;") as info:
        NIQE()
    assert "metric.pristine=PATH" in str(info.value) and "\n" not in str(info.value)
    assert str(tmp_path / niqe_pristine.FETCHED_FILE) in str(info.value)


def test_the_fetched_parameters_serve_without_basicsr(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                      small_model: Path) -> None:
    """`advbench weights fetch niqe` installs the file in the weights folder: `metric=niqe` reads it there."""
    monkeypatch.setattr(niqe_pristine.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setenv("ADVBENCH_WEIGHTS", str(tmp_path))
    (tmp_path / niqe_pristine.FETCHED_FILE).write_bytes(small_model.read_bytes())
    metric, fitted = NIQE(), read_pristine_file(small_model)
    assert torch.equal(metric.mu, fitted["mu"]) and torch.equal(metric.cov, fitted["cov"])


@needs_basicsr
def test_default_is_the_authors_parameters_as_basicsr_ships_them() -> None:
    shipped = np.load(niqe_pristine.reference_file())
    metric = NIQE()
    assert torch.equal(metric.mu, torch.from_numpy(shipped["mu_pris_param"]).flatten())
    assert torch.equal(metric.cov, torch.from_numpy(shipped["cov_pris_param"]))
