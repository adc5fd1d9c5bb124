"""Torch files read safely: tensors and plain containers only, failures as one line.

Both halves load files someone else wrote (classifier checkpoints, metric weights); none of
them may run code on load, and all of them fail with the same readable message. A state
dict is checked key by key against the network before it is loaded (`first_mismatch`), so a
file for another network says which key does not fit instead of torch's page of them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from advbench.core.errors import AdvbenchError

_UNSAFE_GLOBAL = re.compile(r"Unsupported global: GLOBAL ([\w.]+)")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def read_torch_file(path: Path, what: str) -> Any:
    """`torch.load` restricted to tensors and plain containers; failures become one line.

    A file that holds pickled objects (a whole model saved with `torch.save(model)`) is
    refused with what to save instead; the message never suggests loading it unrestricted.
    """
    with open(path, "rb") as fh:
        head = fh.read(4)
    if not (head.startswith(b"PK\x03\x04") or head[:1] == b"\x80"):  # torch.save's zip, or its legacy pickle
        raise AdvbenchError(f"'{path}' is not a readable {what}: it is not a file torch.save writes (its first bytes are "
                            f"{head!r})")
    try:
        return torch.load(path, weights_only=True, map_location="cpu")
    except Exception as exc:  # torch raises many types for bad files (pickle, zip, runtime)
        unsafe = unsafe_pickle(exc)
        if unsafe:
            raise AdvbenchError(f"'{path}' is not a {what} advbench can load: {unsafe}") from None
        reason = (_ANSI.sub("", str(exc)).strip().splitlines() or [""])[0]
        detail = f": {reason}" if " " in reason else ""
        raise AdvbenchError(f"'{path}' is not a readable {what} (corrupt, or not written by torch.save){detail}") from None


def unsafe_pickle(exc: BaseException) -> str | None:
    """Why a weights-only load refused pickled objects, in one line; None for other failures.

    Torch's own message advises lifting the restriction, which would let the file run code;
    this one says what to save instead.
    """
    text = _ANSI.sub("", str(exc))
    found = _UNSAFE_GLOBAL.search(text)
    if not found and "Weights only load failed" not in text:
        return None
    held = f" ({found.group(1)})" if found else ""
    return (f"it holds pickled Python objects{held}, which advbench never unpickles because loading them could "
            "run code; save tensors and plain values instead (e.g. model.state_dict(), not the model object)")


_DATA_PARALLEL = "module."


def network_state(payload: Any) -> dict[str, torch.Tensor] | None:
    """The parameter dict of a state-dict file (RobustBench, torchvision, `torch.save(net.state_dict())`).

    Accepts the dict itself or one under `state_dict`; DataParallel's `module.` prefix is
    removed. None when the file holds something else.
    """
    state = payload.get("state_dict", payload) if isinstance(payload, dict) else None
    if not isinstance(state, dict) or not state or not all(isinstance(v, torch.Tensor) for v in state.values()):
        return None
    return {k.removeprefix(_DATA_PARALLEL): v for k, v in state.items()}


def first_mismatch(found: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor]) -> str | None:
    """Describe the first key (in the model's order) that is missing, extra or misshapen."""
    for key, tensor in expected.items():
        if key not in found:
            return f"key '{key}' is missing from the file"
        if tuple(found[key].shape) != tuple(tensor.shape):
            return f"key '{key}' has shape {tuple(found[key].shape)} in the file, {tuple(tensor.shape)} in the model"
    extra = [k for k in found if k not in expected]
    return f"key '{extra[0]}' in the file is not in the model" if extra else None


def load_state_file(path: Path, net: nn.Module, what: str) -> None:
    """Load a state-dict file into `net` (in place), every key and shape checked first; one line if it does not fit."""
    if not path.is_file():
        raise AdvbenchError(f"{what} '{path}' not found")
    state = network_state(read_torch_file(path, what))
    if state is None:
        raise AdvbenchError(f"'{path}' is not a state dict (parameter names to tensors, as torch.save(net.state_dict()) "
                            "writes)")
    mismatch = first_mismatch(state, net.state_dict())
    if mismatch:
        raise AdvbenchError(f"{what} '{path}' does not fit {type(net).__name__}: {mismatch}")
    net.load_state_dict(state)
