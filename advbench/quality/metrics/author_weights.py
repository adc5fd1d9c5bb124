"""Reading the authors' checkpoint files into our replicas of their networks.

Files are read with `torch.load(weights_only=True)` so a checkpoint cannot run code. The
replicas keep the authors' module names, so a file loads as it was published: at most a
`module.` prefix (DataParallel) is dropped and the state dict is taken from the container
key the authors used (`model`, `state_dict`). Anything else is a layout mismatch, reported
with the first key that does not fit.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from advbench.core.errors import AdvbenchError
from advbench.core.torchfile import unsafe_pickle
from advbench.quality.metrics.published import PUBLISHED

_DATA_PARALLEL_PREFIX = "module."


@dataclass(frozen=True)
class WeightFile:
    """Where one weights option of a metric goes.

    `module` is the sub-network whose state dict the file holds, `source` names the published
    file (for error messages), `container` the key the authors nest that state dict under
    (None: the file is the state dict), `ignore` key prefixes present in the file but unused
    by the metric (e.g. a classifier's `fc.`).
    """

    module: nn.Module
    source: str
    container: str | None = None
    ignore: tuple[str, ...] = ()


def expand(path: str | os.PathLike[str]) -> Path:
    """`~` and environment variables expanded, as users write paths in YAML."""
    return Path(os.path.expandvars(os.path.expanduser(os.fspath(path))))


FETCHED = tuple(metric for metric, published in PUBLISHED.items() if published.option == "weights")
"""Metrics whose `weights` file `advbench weights fetch <metric>` installs, or says where to download
(`published.PUBLISHED`, the command line's catalogue)."""


def read_checkpoint(path: str | os.PathLike[str], metric: str, option: str, source: str) -> Any:
    """The unpickled file, or an AdvbenchError naming the file, the metric, what belongs there and the
    command that puts it there (a user sent to a listing still has to find the command in it)."""
    file = expand(path)
    if not file.is_file():
        get = f"run `advbench weights fetch {metric}`, or " if option == "weights" and metric in FETCHED else ""
        listing = "" if get else "; `advbench weights list` says where to get it"
        raise AdvbenchError(f"{metric}: weights file '{file}' not found; expected {source} there "
                            f"({get}set metric.{option}=PATH or ADVBENCH_WEIGHTS=DIR{listing})")
    try:
        return torch.load(file, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError, ValueError, AttributeError) as exc:
        first = unsafe_pickle(exc) or (str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)
        raise AdvbenchError(f"{metric}: cannot read '{file}' as a weights-only torch checkpoint: {first}") from None


def state_dict_in(obj: Any, container: str | None, metric: str, file: Path) -> dict[str, torch.Tensor]:
    """The tensor mapping inside a checkpoint, with a DataParallel `module.` prefix removed."""
    if container is not None and isinstance(obj, Mapping) and container in obj:
        obj = obj[container]
    if not isinstance(obj, Mapping) or not obj or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        where = f" under '{container}'" if container else ""
        raise AdvbenchError(f"{metric}: '{file}' holds no state dict{where} (got {type(obj).__name__})")
    if all(k.startswith(_DATA_PARALLEL_PREFIX) for k in obj):
        return {k[len(_DATA_PARALLEL_PREFIX):]: v for k, v in obj.items()}
    return dict(obj)


def load_layout(
    module: nn.Module, state: Mapping[str, torch.Tensor], spec: WeightFile, metric: str, file: Path
) -> None:
    """Copy `state` into `module` after checking every key and shape; first mismatch -> error.

    BatchNorm's `num_batches_tracked` may be absent (files saved before PyTorch 0.4.1): it
    does not influence evaluation.
    """
    expected = module.state_dict()
    used = {k: v for k, v in state.items() if not k.startswith(spec.ignore)}
    prefix = f"{metric}: '{file}' does not match the expected layout: first bad key"
    for key, ref in expected.items():
        got = used.get(key)
        if got is None:
            if key.endswith("num_batches_tracked"):
                continue
            raise AdvbenchError(f"{prefix} '{key}' is missing")
        if tuple(got.shape) != tuple(ref.shape):
            raise AdvbenchError(f"{prefix} '{key}' has shape {tuple(got.shape)}, expected {tuple(ref.shape)}")
    unexpected = [k for k in used if k not in expected]
    if unexpected:
        raise AdvbenchError(f"{prefix} '{unexpected[0]}' is unexpected")
    module.load_state_dict(used, strict=False)


def load_weight_file(path: str | os.PathLike[str], spec: WeightFile, metric: str, option: str) -> Any:
    """Read `path`, load its state dict into `spec.module`, return the whole checkpoint object."""
    obj = read_checkpoint(path, metric, option, spec.source)
    file = expand(path)
    load_layout(spec.module, state_dict_in(obj, spec.container, metric, file), spec, metric, file)
    return obj
