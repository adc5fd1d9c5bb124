"""A user's own network, named on the command line: `<module>:<attr>` or `<path/to/file.py>:<attr>`.

Both halves take one: `model=python model.target=...` (a classifier) and `metric=python
metric.target=...` (a quality metric). Importing it, calling the class or factory with its
keyword arguments, and keying cells by the file its code is in are the same job for both, so
they live here, with every failure of the user's code a one-line `AdvbenchError` that names
the config key (`model.target`, `metric.target`) the user typed.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from torch import nn

from advbench.core.errors import AdvbenchError, user_code_failed
from advbench.core.keys import content_key, file_digest


def split_target(target: Any, key: str = "model") -> tuple[str, str]:
    """`(<module or file.py>, <attribute path>)` of a `<key>.target`, or an error saying the form."""
    where, sep, attr = str(target).rpartition(":") if isinstance(target, str) else ("", "", "")
    if not sep or not where or not attr:
        raise AdvbenchError(f"{key}.target must be <module>:<attr> or <path/to/file.py>:<attr> (a class or factory "
                            f"returning an nn.Module), got {target!r}")
    return where, attr


def _import_file(path: Path, named: str) -> ModuleType:
    """Execute `path` as a module (its folder importable, so it may import its neighbours)."""
    if not path.is_file():
        raise AdvbenchError(f"{named}: file '{path}' not found")
    name = f"advbench_user_{path.stem}_{content_key(str(path), 8)}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise AdvbenchError(f"{named}: '{path}' cannot be imported as Python")
    module = importlib.util.module_from_spec(spec)
    _importable(str(path.parent))
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as exc:  # the user's module failing at import: its own message is the diagnosis
        sys.modules.pop(name, None)
        raise user_code_failed(named, f"importing '{path}'", exc) from exc
    return module


def _importable(folder: str) -> None:
    if folder not in sys.path:
        sys.path.insert(0, folder)


def _import(where: str, named: str) -> ModuleType:
    """The module part of a target: a `.py` file, else a module importable from the working folder."""
    if where.endswith(".py"):
        return _import_file(Path(where).expanduser().resolve(), named)
    _importable(os.getcwd())
    try:
        return importlib.import_module(where)
    except ModuleNotFoundError as exc:
        hint = f" (from the working folder {os.getcwd()})" if exc.name == where.split(".")[0] else ""
        raise AdvbenchError(f"{named}: no module named '{exc.name}'{hint}") from None
    except (Exception, SystemExit) as exc:
        raise user_code_failed(named, f"importing '{where}'", exc) from exc


def resolve_target(target: Any, key: str = "model") -> Any:
    """The object a `<key>.target` names (dotted attributes allowed after the colon)."""
    where, attr = split_target(target, key)
    named = f"{key}.target '{target}'"
    obj: Any = _import(where, named)
    for part in attr.split("."):
        if not hasattr(obj, part):
            names = [n for n in dir(obj) if not n.startswith("_")]
            close = difflib.get_close_matches(part, names, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise AdvbenchError(f"{named}: '{where}' has no attribute '{attr}'{hint}")
        obj = getattr(obj, part)
    return obj


def build_user_module(target: str, kwargs: Mapping[str, Any], key: str = "model") -> nn.Module:
    """Call the `<key>.target` with `<key>.kwargs`; its result must be an `nn.Module`."""
    factory = resolve_target(target, key)
    named = f"{key}.target '{target}'"
    if isinstance(factory, nn.Module):
        if kwargs:
            raise AdvbenchError(f"{named} is a module instance; it takes no {key}.kwargs")
        return factory
    if not callable(factory):
        raise AdvbenchError(f"{named} is an object of type {type(factory).__name__}, not an nn.Module class or factory")
    try:
        inspect.signature(factory).bind(**kwargs)
    except TypeError as exc:
        raise AdvbenchError(f"{named} does not take {key}.kwargs {dict(kwargs)}: {exc}") from None
    except ValueError:  # no signature to check (a builtin): the call itself says
        pass
    try:
        net = factory(**kwargs)
    except (Exception, SystemExit) as exc:
        raise user_code_failed(named, f"building the {key}", exc) from exc
    if not isinstance(net, nn.Module):
        raise AdvbenchError(f"{named} returned an object of type {type(net).__name__}, not a torch.nn.Module")
    return net


def source_digest(target: Any) -> dict[str, str]:
    """sha256 of the file a target's code is in, where it can be found without running it, so
    that editing the factory keys its cells anew; {} when it cannot be found.

    The built network is keyed besides (`core.digests.code_digest`, `core.fingerprint`): the files
    of its classes and of the user's modules they import, and its outputs on a probe batch, which
    see what this file cannot (a helper edited, a flag set at run time, a weights file read)."""
    if not isinstance(target, str):
        return {}
    where, _, _ = target.rpartition(":")
    if where.endswith(".py"):
        path: Path | None = Path(where).expanduser().resolve()
    else:
        _importable(os.getcwd())
        try:
            spec = importlib.util.find_spec(where)
        except (ImportError, ValueError):
            spec = None
        path = Path(spec.origin) if spec is not None and spec.origin and spec.has_location else None
    return {"source_sha256": file_digest(path)} if path is not None and path.is_file() else {}
