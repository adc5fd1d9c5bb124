"""A config's plain values as a spec's typed fields, checked once where the options are read.

Below the command line a job's spec holds no mapping read by key: a group of settings in the
YAML (`uap:`, `madc:`, `synthetic:`, a defense's `params:`) is a small frozen dataclass there,
and `settings` builds it from the resolved mapping, each value checked against its field's
annotation (`int`, `float`, `str`, `bool`, `X | None`, `tuple[...]`, another such dataclass).
A key the dataclass lacks, a missing one or a value of the wrong type is one line naming it.
A value is kept as it came (an int where the YAML has a float stays an int; lists become
tuples), so what keys and records hash is what the YAML's mapping gave.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any

from advbench.core.errors import AdvbenchError

_NEEDS = {bool: "true or false", int: "a whole number", float: "a number", str: "text", type(None): "null"}


def needs(annotation: Any) -> str:
    """What a value of `annotation` must be, as a message says it."""
    if dataclasses.is_dataclass(annotation):
        return f"a group of settings ({', '.join(f.name for f in dataclasses.fields(annotation))})"
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return " or ".join(needs(a) for a in typing.get_args(annotation))
    if typing.get_origin(annotation) is tuple:
        args = typing.get_args(annotation)
        if len(args) == 2 and args[1] is Ellipsis:
            return f"a list of {needs(args[0]).removeprefix('a ')}s"
        return f"a list [{', '.join(needs(a) for a in args)}]"
    return _NEEDS[annotation]


def _fits(annotation: type, value: Any) -> bool:
    """Whether a scalar `value` is of `annotation` (a bool is no number; an int is a float's value)."""
    if annotation in (int, float) and isinstance(value, bool):
        return False
    return isinstance(value, (int, float) if annotation is float else annotation)


def typed(annotation: Any, value: Any, where: str) -> Any:
    """`value` (plain data) as `annotation` says, checked; `where` names it in a message (`uap.lr`)."""
    if dataclasses.is_dataclass(annotation):
        return settings(annotation, value, where)
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        for option in args:
            try:
                return typed(option, value, where)
            except AdvbenchError:
                continue
    elif origin is tuple:
        if isinstance(value, (list, tuple)):
            each = [args[0]] * len(value) if len(args) == 2 and args[1] is Ellipsis else list(args)
            if len(each) == len(value):
                return tuple(typed(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(each, value)))
    elif _fits(annotation, value):
        return value
    raise AdvbenchError(f"{where} must be {needs(annotation)}, got {value!r}")


def settings(cls: type, values: Any, where: str, owner: str | None = None) -> Any:
    """The frozen dataclass `cls` of the mapping `values` (the YAML's group at `where`), every key one of
    its fields and every field given; `owner` names the group in a message (default: `where`)."""
    owner = owner or where
    names = [f.name for f in dataclasses.fields(cls)]
    if not isinstance(values, Mapping):
        raise AdvbenchError(f"{where} must be {needs(cls)}, got {values!r}")
    unknown = [str(key) for key in values if key not in names]
    if unknown:
        raise AdvbenchError(f"{where}.{unknown[0]} is not a parameter of {owner}; valid: {', '.join(names) or 'none'}")
    missing = [name for name in names if name not in values]
    if missing:
        raise AdvbenchError(f"{owner} needs {where}.{missing[0]}")
    hints = typing.get_type_hints(cls)
    return cls(**{name: typed(hints[name], values[name], f"{where}.{name}") for name in names})


def spec_fields(spec_type: type, values: Mapping[str, Any]) -> dict[str, Any]:
    """`values` by field name of `spec_type`, those whose annotation names a dataclass (or one or None)
    built as `settings`; the others as they came (the spec and its readers check them)."""
    hints = typing.get_type_hints(spec_type)
    return {name: typed(hints[name], value, name) if _holds_settings(hints[name]) else value
            for name, value in values.items()}


def _holds_settings(annotation: Any) -> bool:
    """Whether a field's annotation is a dataclass of settings, alone or `| None`."""
    options = typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, types.UnionType) else (annotation,)
    return any(dataclasses.is_dataclass(option) for option in options)
