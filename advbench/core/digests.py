"""Content digests of tensors and modules: what an RD point or a model object handed to the
Python API depends on, hashed into its key.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch
from torch import nn


def tensor_digest(tensor: torch.Tensor) -> str:
    """sha256 of a tensor's dtype, shape and bytes: a perturbation's identity, whatever its file."""
    digest = hashlib.sha256()
    _update(digest, "", tensor)
    return digest.hexdigest()


def module_digest(module: nn.Module) -> str:
    """sha256 of a model's class, the scalar options of every submodule and every state-dict tensor.

    Two metric builds get one digest exactly when they compute the same function: other
    weights, another backbone or another input size all change it; file paths do not.
    """
    digest = hashlib.sha256()
    for name, sub in module.named_modules():
        options = sorted(
            (k, v) for k, v in vars(sub).items()
            if not k.startswith("_") and k != "training" and isinstance(v, (bool, int, float, str, tuple, type(None)))
        )
        digest.update(repr((name, type(sub).__qualname__, options)).encode())
    for key, tensor in module.state_dict().items():
        _update(digest, key, tensor)
    return digest.hexdigest()


def _update(digest: Any, key: str, tensor: torch.Tensor) -> None:
    flat = tensor.detach().cpu().contiguous().reshape(-1)
    digest.update(f"{key}:{flat.dtype}:{tuple(tensor.shape)}".encode())
    digest.update(flat.view(torch.uint8).numpy())
