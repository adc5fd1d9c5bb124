"""Per-photo NIQE on the authors' parameters: advbench's (reference and differentiable) against basicsr's.

The last column is advbench's fitted pristine model (`metric=niqe_fitted`), for its scale.

    python scripts/niqe_vs_basicsr.py                 # every sample photo (skimage.data)
    python scripts/niqe_vs_basicsr.py camera coffee   # some of them

basicsr's `calculate_niqe` is a MATLAB-faithful port of the authors' release (its docstring:
5.7296 on baboon.png, as MATLAB R2021a). Importing basicsr needs OpenCV, which NIQE on a
colour image never calls, so its NIQE module is loaded from its files with `cv2` stubbed and
the rest of the package left out (`basicsr_niqe`). Photos are the sample photos advbench uses
(shorter side at most 512), given to basicsr as 0-255 BGR arrays, its input convention.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import types
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import torch

from advbench.quality.images import photo_names, sample_photo
from advbench.quality.metrics.niqe import NIQE

_FILES = {  # the modules calculate_niqe reaches, by file, in import order
    "basicsr.utils.color_util": "utils/color_util.py",
    "basicsr.utils.matlab_functions": "utils/matlab_functions.py",
    "basicsr.utils.registry": "utils/registry.py",
    "basicsr.metrics.metric_util": "metrics/metric_util.py",
    "basicsr.metrics.niqe": "metrics/niqe.py",
}


@contextmanager
def _scratch_modules(names: list[str]) -> Iterator[None]:
    """Put back whatever `names` were in sys.modules, so the stubs never outlive the load."""
    saved = {n: sys.modules.get(n) for n in names}
    try:
        yield
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def basicsr_niqe() -> Callable[..., float]:
    """basicsr's `calculate_niqe`, loaded from the installed package's files without `import basicsr`."""
    spec = importlib.util.find_spec("basicsr")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("basicsr is not installed (pip install basicsr)")
    root = Path(list(spec.submodule_search_locations)[0])
    packages = ["basicsr", "basicsr.utils", "basicsr.metrics"]
    with _scratch_modules(["cv2", *packages, *_FILES]):
        sys.modules["cv2"] = types.ModuleType("cv2")
        for name in packages:
            sys.modules[name] = types.ModuleType(name)
            sys.modules[name].__path__ = []
        loaded = {}
        for name, rel in _FILES.items():
            module_spec = importlib.util.spec_from_file_location(name, root / rel)
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[name] = loaded[name] = module
            module_spec.loader.exec_module(module)
            if name == "basicsr.utils.color_util":
                sys.modules["basicsr.utils"].bgr2ycbcr = module.bgr2ycbcr
    return loaded["basicsr.metrics.niqe"].calculate_niqe


def basicsr_score(calculate_niqe: Callable[..., float], photo: torch.Tensor) -> float:
    """basicsr's NIQE of a (3, H, W) RGB photo in [0, 1]: HWC, BGR, 0-255, as it expects."""
    bgr = (photo.double().numpy()[::-1].transpose(1, 2, 0) * 255).astype(np.float32)
    return float(calculate_niqe(bgr, crop_border=0, input_order="HWC", convert_to="y"))


def compare(names: list[str], fitted: NIQE | None = None) -> list[tuple[float | str, ...]]:
    """(photo, basicsr, advbench reference, advbench differentiable[, fitted]) per photo, on the authors' parameters."""
    calculate_niqe, metric = basicsr_niqe(), NIQE()
    rows = []
    for name in names:
        photo = sample_photo(name)[None]
        with torch.no_grad():
            ours, smooth = metric.reference(photo).item(), metric(photo).item()
            extra = (fitted.reference(photo).item(),) if fitted is not None else ()
        rows.append((name, basicsr_score(calculate_niqe, photo[0]), ours, smooth, *extra))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("photos", nargs="*", default=list(photo_names("all")))
    rows = compare(parser.parse_args().photos, NIQE(name="niqe_fitted", pristine="fitted"))
    print(f"{'photo':<22} {'basicsr':>9} {'reference':>9} {'rel.diff':>9} {'differentiable':>14} {'rel.diff':>9} "
          f"{'fitted':>8}")
    for name, theirs, ours, smooth, fitted in rows:
        print(f"{name:<22} {theirs:9.4f} {ours:9.4f} {abs(ours / theirs - 1):9.2e} {smooth:14.4f} "
              f"{abs(smooth / theirs - 1):9.2e} {fitted:8.3f}")
    worst = max(abs(ours / theirs - 1) for _, theirs, ours, *_ in rows)
    print(f"max relative difference, reference vs basicsr: {worst:.2e}")


if __name__ == "__main__":
    main()
