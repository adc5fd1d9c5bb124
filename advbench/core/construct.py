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
from dataclasses import dataclass
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


@dataclass(frozen=True)
class BoundFactory:
    """An option's class or function and the arguments the option gives it, bound to its parameters where
    the options are read (`bound_factory`): below the command line an option is this, not a mapping with
    a `_target_`. `source` is the dotted path the option names the factory by (what keys hash)."""

    source: str
    factory: Callable[..., Any]
    arguments: inspect.BoundArguments

    @property
    def given(self) -> dict[str, Any]:
        """The arguments the option gives, by parameter name (a `**` parameter's spread out)."""
        parameters = self.arguments.signature.parameters
        given: dict[str, Any] = {}
        for name, value in self.arguments.arguments.items():
            given.update(value if parameters[name].kind is inspect.Parameter.VAR_KEYWORD else {name: value})
        return given

    def call(self, **more: Any) -> Any:
        """The factory called with the option's arguments and `more` over them, checked as the option was."""
        arguments = {**self.given, **more}
        bind_arguments(self.source, self.factory, arguments)
        return call_factory(self.source, self.factory, arguments)


def bound_factory(what: str, option: Mapping[str, Any], *, leaves: tuple[str, ...] = ()) -> BoundFactory:
    """Option `option` (`{"_target_": path, **arguments}`, resolved) of `what` ("dataset", "model") as a
    `BoundFactory`; the arguments named in `leaves` are left for the caller to give when it calls (a model's
    classes and channels), so only the others must fit the factory now. A missing `_target_`, a key the
    factory does not take or one it needs and lacks is one line."""
    arguments = {k: v for k, v in option.items() if k != "_target_"}
    source = option.get("_target_")
    if source is None:
        raise AdvbenchError(f"{what} option '{arguments.get('name')}' has no _target_: nothing says what to build")
    factory = target_of(str(source))
    try:
        bound = inspect.signature(factory).bind_partial(**arguments)
        missing = [p.name for p in inspect.signature(factory).parameters.values()
                   if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
                   and p.name not in bound.arguments and p.name not in leaves]
    except TypeError as exc:
        raise AdvbenchError(f"{source}: {exc}") from None
    except ValueError:
        raise AdvbenchError(f"{what} _target_ '{source}' has no signature to take the option's arguments: "
                            "name a class or function") from None
    if missing:
        raise AdvbenchError(f"{source}: missing a required argument: '{missing[0]}'")
    return BoundFactory(str(source), factory, bound)
