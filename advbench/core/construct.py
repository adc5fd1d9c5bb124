"""Objects from plain data that names their class: `{"_target_": "package.module.Class", **arguments}`.

Below the command line options arrive as plain dicts (the command line alone reads Hydra's
configs), so this is how a data set, a model or an attack YAML becomes its object. A wrong
class path or argument is the user's config, said in one line before anything is built.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping
from typing import Any

from advbench.core.errors import AdvbenchError


def target_of(path: str) -> Callable[..., Any]:
    """The class or function a dotted `_target_` names."""
    module_name, _, attribute = str(path).rpartition(".")
    try:
        found = getattr(importlib.import_module(module_name), attribute) if module_name else None
    except ImportError as exc:
        raise AdvbenchError(f"_target_ '{path}': cannot import {module_name}: {exc}") from None
    except AttributeError:
        found = None
    if not callable(found):
        raise AdvbenchError(f"_target_ '{path}' names nothing that can be built")
    return found


def construct(spec: Mapping[str, Any], **overrides: Any) -> Any:
    """`spec["_target_"]` called with the other keys of `spec` (and `overrides` over them)."""
    arguments = {k: v for k, v in spec.items() if k != "_target_"}
    if "_target_" not in spec:
        raise AdvbenchError(f"no _target_ among {', '.join(sorted(arguments)) or 'no keys'}: nothing says what to build")
    target = target_of(spec["_target_"])
    arguments.update(overrides)
    try:
        inspect.signature(target).bind(**arguments)
    except TypeError as exc:
        raise AdvbenchError(f"{spec['_target_']}: {exc}") from None
    except ValueError:  # no signature to check (a builtin): the call says what is wrong
        pass
    return target(**arguments)
