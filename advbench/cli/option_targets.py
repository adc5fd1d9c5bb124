"""Objects from option data that names their class: `{"_target_": "package.module.Class", **arguments}`.

The one reader of `_target_`: an option's class path is the command line's to read, so below it
a data set or a model is a `BoundFactory`, an attack or a metric the object built here, and an
attack built of other attack options (an ensemble's members) is handed `member_attack`, which
builds those options the way this module builds its own. A wrong class path or argument is the
user's config, said in one line before anything is built; a class of one's own that raises or
calls `sys.exit` while its module is imported is one line too (`errors.user_code_failed`).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from advbench.cli.options import load_option
from advbench.core.catalog import group_options
from advbench.core.construct import BoundFactory, bind_arguments, call_factory, own_code
from advbench.core.errors import AdvbenchError, user_code_failed

MEMBER_BUILDER = "build_member"
"""The constructor argument of an attack built of other attack options (`worst_case.Ensemble`): the builder
of those options, `member_attack`."""


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
        if own_code(module_name):
            raise
        raise user_code_failed(f"_target_ '{path}'", f"importing {module_name}", exc) from exc
    if not callable(found):
        raise AdvbenchError(f"_target_ '{path}' names nothing that can be built")
    return found


def construct(spec: Mapping[str, Any], **overrides: Any) -> Any:
    """`spec["_target_"]` called with the other keys of `spec` (and `overrides` over them); an attack built
    of attack options gets `member_attack` to build them."""
    arguments = {k: v for k, v in spec.items() if k != "_target_"}
    if "_target_" not in spec:
        raise AdvbenchError(f"no _target_ among {', '.join(sorted(arguments)) or 'no keys'}: nothing says what to build")
    target = target_of(spec["_target_"])
    arguments.update(overrides)
    if MEMBER_BUILDER in getattr(target, "hyperparameters", {}):
        arguments[MEMBER_BUILDER] = member_attack
    bind_arguments(spec["_target_"], target, arguments)
    return call_factory(spec["_target_"], target, arguments)


def member_attack(name: str, seed: int, overrides: Mapping[str, Any] | None = None) -> Any:
    """The attack of option `name` in conf/attack as an ensemble's member: its params resolved as a run
    resolves them, with the ensemble's seed, and `overrides` (the ensemble's `member_params`) on top."""
    option = load_option("attack", name)
    if option is None or not isinstance(option.get("params"), DictConfig):
        raise AdvbenchError(f"unknown ensemble member '{name}' (attack.members); valid: {', '.join(group_options('attack'))}")
    try:
        params = OmegaConf.to_container(OmegaConf.create({"seed": seed, "attack": option}).attack.params, resolve=True)
        if "seed" in params:
            params["seed"] = seed
        return construct({**params, **(overrides or {})})
    except (AdvbenchError, OmegaConfBaseException) as exc:
        raise AdvbenchError(f"cannot build ensemble member '{name}': {str(exc).splitlines()[0]}") from None


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
