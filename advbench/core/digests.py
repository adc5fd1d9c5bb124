"""Content digests of tensors and modules: what an RD point or a model object handed to the
Python API depends on, hashed into its key.
"""

from __future__ import annotations

import hashlib
import inspect
from pathlib import Path
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


LIBRARY_MODULES = ("torch.", "torchvision.")
"""Where a module's class is library code, versioned by the library (and in the records' versions)."""


def code_digest(module: nn.Module) -> str:
    """sha256 of the code of every class in `module`'s tree that is not torch's own.

    Weights alone do not fix what a model computes: an edited `forward` with the same
    parameters is another model, and its records must not be taken for the old one's. Each
    class counts with the whole file it is defined in (what it calls there may change too),
    else its own source (a notebook cell), else its methods' bytecode (code typed at a prompt).
    """
    digest = hashlib.sha256()
    classes = {type(sub) for sub in module.modules()}
    for cls in sorted(classes, key=lambda c: (c.__module__, c.__qualname__)):
        if cls.__module__.startswith(LIBRARY_MODULES):
            continue
        digest.update(f"{cls.__module__}.{cls.__qualname__}\n".encode())
        digest.update(_class_code(cls))
    return digest.hexdigest()


def _class_code(cls: type) -> bytes:
    try:
        source_file = inspect.getsourcefile(cls)
    except TypeError:  # a built-in class
        source_file = None
    if source_file and Path(source_file).is_file():
        return Path(source_file).read_bytes()
    try:
        return inspect.getsource(cls).encode()
    except (OSError, TypeError):
        functions = sorted((k, v) for k, v in vars(cls).items() if inspect.isfunction(v))
        return repr([(name, _code_shape(f.__code__)) for name, f in functions]).encode()


def _code_shape(code: Any) -> tuple[Any, ...]:
    """A code object's instructions, names and constants (nested code included), without the
    addresses and reference counts that make `marshal`'s bytes differ between equal objects."""
    consts = tuple(_code_shape(c) if inspect.iscode(c) else repr(c) for c in code.co_consts)
    return code.co_code, code.co_names, code.co_varnames, consts


def _update(digest: Any, key: str, tensor: torch.Tensor) -> None:
    flat = tensor.detach().cpu().contiguous().reshape(-1)
    digest.update(f"{key}:{flat.dtype}:{tuple(tensor.shape)}".encode())
    digest.update(flat.view(torch.uint8).numpy())
