"""Content digests of tensors and modules: what an RD point or a model object handed to the
Python API depends on, hashed into its key.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import os
import site
import sys
import sysconfig
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import nn

from advbench.core.keys import file_digest


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


LIBRARY_MODULES = ("torch.", "torchvision.", "advbench.")
"""Where a module's class is library code, versioned by the library (and in the records' versions)."""


def code_digest(module: nn.Module) -> str:
    """sha256 of the code of every class in `module`'s tree that is not torch's or advbench's own,
    and of every module of the user's own code those classes reach.

    Weights alone do not fix what a model computes: an edited `forward` with the same
    parameters is another model, and its records must not be taken for the old one's. Each
    class counts with the whole file it is defined in (what it calls there may change too),
    else its own source (a notebook cell), else its methods' bytecode (code typed at a prompt);
    then the files of the user's modules it imports, transitively (`user_modules`), since a
    helper edited in another file changes the model as surely as its own file does.
    """
    digest = hashlib.sha256()
    classes = {type(sub) for sub in module.modules()}
    own = [cls for cls in sorted(classes, key=lambda c: (c.__module__, c.__qualname__))
           if not cls.__module__.startswith(LIBRARY_MODULES)]
    for cls in own:
        digest.update(f"{cls.__module__}.{cls.__qualname__}\n".encode())
        digest.update(_class_code(cls))
    attributes = [value for sub in module.modules() for value in vars(sub).values()]
    for source in sorted({file_digest(Path(m.__file__)) for m in user_modules([*own, *attributes])
                          if getattr(m, "__file__", None) and Path(m.__file__).is_file()}):
        digest.update(source.encode())
    return digest.hexdigest()


def user_modules(roots: Iterable[Any]) -> list[ModuleType]:
    """The user's own modules that `roots` (classes, functions, modules, objects) are defined in,
    and every one of the user's modules those import, transitively, by name.

    A module's globals are followed where they are modules, or functions, classes and objects
    whose module (their type's, for an object) is the user's: what `import helper` and `from
    helper import f` leave there. Library code is left out (`is_user_module`): it is versioned
    by its package, and following it would hash half of the environment on every call.
    """
    seen: dict[str, ModuleType] = {}
    todo = [_module_of(root) for root in roots]
    while todo:
        mod = todo.pop()
        if mod is None or mod.__name__ in seen or not is_user_module(mod):
            continue
        seen[mod.__name__] = mod
        todo.extend(_module_of(value) for value in list(vars(mod).values()))
    return [seen[name] for name in sorted(seen)]


def _module_of(value: Any) -> ModuleType | None:
    if isinstance(value, ModuleType):
        return value
    owner = value if inspect.isclass(value) or inspect.isfunction(value) else type(value)
    name = getattr(owner, "__module__", None)
    return sys.modules.get(name) if isinstance(name, str) else None


def is_user_module(module: ModuleType) -> bool:
    """Whether `module` is the user's own code, by where its file lies: not the standard library,
    not an installed package (site-packages), not advbench; a module without a file only when it
    is `__main__` (code typed at a prompt or in a notebook, whose globals name what it imports)."""
    where = getattr(module, "__file__", None)
    if not where:
        return module.__name__ == "__main__"
    path = os.path.realpath(where)
    parts = Path(path).parts
    return "site-packages" not in parts and "dist-packages" not in parts and \
        not any(path.startswith(root) for root in _library_roots())


@functools.lru_cache(maxsize=1)
def _library_roots() -> tuple[str, ...]:
    """The folders of the standard library, the installed packages (the environment's and the
    interpreter's it was made from) and advbench's own package."""
    bases = {"base": sys.base_prefix, "platbase": sys.base_exec_prefix,
             "installed_base": sys.base_prefix, "installed_platbase": sys.base_exec_prefix}
    folders = {paths[key] for paths in (sysconfig.get_paths(), sysconfig.get_paths(vars=bases))
               for key in ("stdlib", "platstdlib", "purelib", "platlib")}
    folders.update(site.getsitepackages() if hasattr(site, "getsitepackages") else [])
    folders.add(str(Path(__file__).resolve().parents[1]))
    return tuple(os.path.join(os.path.realpath(folder), "") for folder in folders)


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
