"""Objects from plain data that names their class: `{"_target_": "package.module.Class", **arguments}`.

Below the command line options arrive as plain dicts (the command line alone reads Hydra's
configs), so this is how a data set, a model or an attack YAML becomes its object. A wrong
class path or argument is the user's config, said in one line before anything is built. A class
of one's own (an option file under `ADVBENCH_CONF` naming the user's module) that raises or calls
`sys.exit` while its module is imported or it is built is one line too (`errors.user_code_failed`),
not a traceback or a run that ends without a word; advbench's own classes keep their tracebacks.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping
from typing import Any

from advbench.core.errors import AdvbenchError, user_code_failed


def _own(path: str) -> bool:
    """Whether a dotted path names advbench's code, whose failures are bugs to see with their traceback."""
    return str(path).split(".")[0] == "advbench"


def target_of(path: str) -> Callable[..., Any]:
    """The class or function a dotted `_target_` names."""
    module_name, _, attribute = str(path).rpartition(".")
    try:
        found = getattr(importlib.import_module(module_name), attribute) if module_name else None
    except ImportError as exc:
        raise AdvbenchError(f"_target_ '{path}': cannot import {module_name}: {exc}") from None
    except AttributeError:
        found = None
    except (Exception, SystemExit) as exc:
        if _own(module_name):
            raise
        raise user_code_failed(f"_target_ '{path}'", f"importing {module_name}", exc) from exc
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
    bind_arguments(spec["_target_"], target, arguments)
    return call_factory(spec["_target_"], target, arguments)


def bind_arguments(path: str, factory: Callable[..., Any], arguments: Mapping[str, Any]) -> inspect.BoundArguments | None:
    """`arguments` bound to the parameters of `factory` (named `path`): a key it does not take, or one it
    needs and lacks, is one line; None where it has no signature to check (a builtin: the call says)."""
    try:
        return inspect.signature(factory).bind(**arguments)
    except TypeError as exc:
        raise AdvbenchError(f"{path}: {exc}") from None
    except ValueError:
        return None


def call_factory(path: str, factory: Callable[..., Any], arguments: Mapping[str, Any]) -> Any:
    """`factory(**arguments)`; a user's code failing while it builds is one line (advbench's keeps its traceback)."""
    try:
        return factory(**arguments)
    except (Exception, SystemExit) as exc:
        if isinstance(exc, AdvbenchError) or _own(getattr(factory, "__module__", "")):
            raise
        raise user_code_failed(f"_target_ '{path}'", "building it", exc) from exc
