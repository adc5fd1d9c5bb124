"""Torch files read safely: tensors and plain containers only, failures as one line.

Both halves load files someone else wrote (classifier checkpoints, metric weights); none of
them may run code on load, and all of them fail with the same readable message.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

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
