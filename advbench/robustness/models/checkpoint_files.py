"""Checkpoint files: `{"state_dict": ..., "meta": {...}}`, read with `weights_only=True`.

A checkpoint someone sends you must not be able to run code, so loading never unpickles
arbitrary objects, and meta holds plain values only. Writes are atomic (temp + rename) so an
interrupted training run never leaves a file that looks complete.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from advbench.core.errors import AdvbenchError
from advbench.core.torchfile import first_mismatch, network_state, read_torch_file
from advbench.robustness.models.classifier import Classifier

META_KEYS = ("dataset", "architecture", "recipe", "clean_accuracy", "config", "created_at", "advbench_version")


def save_checkpoint(path: Path, model: nn.Module, meta: Mapping[str, Any]) -> Path:
    """Write `model`'s state dict and `meta` atomically; returns the path."""
    missing = [k for k in META_KEYS if k not in meta]
    if missing:
        raise ValueError(f"checkpoint meta lacks {', '.join(missing)}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    try:
        torch.save({"state_dict": state, "meta": dict(meta)}, tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def load_checkpoint(path: Path, model: nn.Module, make_command: str | None = None) -> dict[str, Any]:
    """Load weights into `model` (in place) and return the checkpoint's meta.

    `make_command` is the `advbench train ...` line that creates this checkpoint; a missing
    file's error names it so the user can fix it in one step.
    """
    path = Path(path)
    if not path.is_file():
        hint = f"; create it with: {make_command}" if make_command else ""
        raise AdvbenchError(f"checkpoint '{path}' not found{hint}")
    payload = read_torch_file(path, "checkpoint")
    if not isinstance(payload, dict) or not isinstance(payload.get("meta"), dict):
        state = network_state(payload)
        if state is None:
            raise AdvbenchError(f"'{path}' is not an advbench checkpoint: expected a dict with 'state_dict' and 'meta' "
                                "(or a state dict of the model's network: parameter names to tensors)")
        _load_foreign(path, model, state)
        return {"architecture": getattr(model, "arch", type(model).__name__), "format": "state dict"}
    meta, state = payload["meta"], payload.get("state_dict")
    if not isinstance(state, dict):
        raise AdvbenchError(f"'{path}' is not an advbench checkpoint: expected a dict with 'state_dict' and 'meta'")
    recorded, requested = meta.get("architecture"), getattr(model, "arch", type(model).__name__)
    mismatch = first_mismatch(state, model.state_dict())
    if recorded != requested:
        raise AdvbenchError(
            f"checkpoint '{path}' was trained for architecture '{recorded}', requested '{requested}'"
            + (f": {mismatch}" if mismatch else "")
        )
    if mismatch:
        raise AdvbenchError(f"checkpoint '{path}' does not fit the {requested} the config builds "
                            f"(options other than in training, e.g. model.denoise?): {mismatch}")
    model.load_state_dict(state)
    return meta


# Where RobustBench's models keep their input normalisation when it is in the state dict:
# buffers of the network class itself, or `normalize_model`'s wrapper around the network.
_INSIDE_LAYOUTS = ((("mu", "sigma"), ""), (("normalize.mean", "normalize.std"), "model."))
def _load_foreign(path: Path, model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load a network state dict into a `Classifier`'s `net` (or into a bare module that is not
    one, as a user's own `_target_` may build), normalisation as the config says.

    `model.normalization == "inside"`: the file carries mean/std (`mu`/`sigma`, or
    `normalize.mean`/`normalize.std` with the network under `model.`), which replace the
    configured ones; `outside`: the file is the bare network and the config's mean/std apply.
    Only `num_batches_tracked` (absent from pre-2018 files, unused in eval) may be missing.
    """
    arch = getattr(model, "arch", type(model).__name__)
    where = getattr(model, "normalization", "outside")
    net = model.net if isinstance(model, Classifier) else model
    norm: tuple[torch.Tensor, torch.Tensor] | None = None
    if where == "inside":
        for names, prefix in _INSIDE_LAYOUTS:
            if all(n in state for n in names):
                norm = (state.pop(names[0]), state.pop(names[1]))
                state = {k.removeprefix(prefix): v for k, v in state.items()}
                break
        else:
            raise AdvbenchError(f"state dict '{path}' does not fit {arch}: key 'mu' is missing from the file "
                                "(model.normalization=inside expects mu/sigma or normalize.mean/normalize.std)")
    expected = net.state_dict()
    for key, tensor in expected.items():
        if key.endswith("num_batches_tracked") and key not in state:
            state[key] = tensor
    mismatch = first_mismatch(state, expected)
    if mismatch:
        hint = ""
        if where == "outside" and any(k in state for names, _ in _INSIDE_LAYOUTS for k in names):
            hint = " (the file carries its normalisation: set model.normalization=inside)"
        raise AdvbenchError(f"state dict '{path}' does not fit {arch}: {mismatch}{hint}")
    if norm is not None:
        for buffer, value, name in ((model.mean, norm[0], "mean"), (model.std, norm[1], "std")):
            if value.numel() != buffer.numel():
                raise AdvbenchError(f"state dict '{path}': its normalisation {name} has {value.numel()} entries, "
                                    f"the model takes {buffer.numel()} channels")
            buffer.copy_(value.reshape(buffer.shape))
    net.load_state_dict(state)
