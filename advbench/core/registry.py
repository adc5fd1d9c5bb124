"""One registration mechanism: a read-only name -> object mapping filled by a decorator.

    WRAPPERS: Registry[type[InputTransform]] = Registry("input-transform wrapper")

    @WRAPPERS.register("jpeg")
    class JPEG(InputTransform): ...

Each entry is registered beside the definition it names, once: a second registration of a
name is an error. Iteration follows registration order (the order the defining modules are
imported, and within one module the order of the definitions). `make(name, obj, *args,
**kwargs)`, when given, turns the decorated object and the decorator's extra arguments into the
stored entry (a spec holding the object and what the registry needs to know about it); the
decorator always hands back the object itself.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Callable, Generic, TypeVar

from advbench.core.errors import AdvbenchError

T = TypeVar("T")
D = TypeVar("D")


class Registry(Mapping[str, T], Generic[T]):
    """Entries by name, in registration order; read-only apart from `register`."""

    def __init__(self, kind: str, make: Callable[..., T] | None = None) -> None:
        self.kind = kind
        self._make = make
        self._entries: dict[str, T] = {}

    def register(self, name: str, *args: Any, **kwargs: Any) -> Callable[[D], D]:
        """A decorator that registers the decorated class or function under `name` and returns it unchanged."""
        if self._make is None and (args or kwargs):
            raise TypeError(f"the {self.kind} registry takes no arguments beyond the name")

        def decorate(obj: D) -> D:
            if name in self._entries:
                raise ValueError(f"{self.kind} '{name}' is registered twice")
            self._entries[name] = obj if self._make is None else self._make(name, obj, *args, **kwargs)
            return obj

        return decorate

    def lookup(self, name: str) -> T:
        """The entry `name`, or a one-line error naming the valid ones."""
        if name not in self._entries:
            raise AdvbenchError(f"unknown {self.kind} '{name}'; valid: {', '.join(sorted(self._entries))}")
        return self._entries[name]

    def __getitem__(self, name: str) -> T:
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self._entries)})"
