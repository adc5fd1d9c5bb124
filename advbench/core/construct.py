"""An option's class or function and its arguments, bound where the options are read (`BoundFactory`).

The command line reads an option's class path (`advbench.cli.option_targets`); below it an option
is the class itself with the arguments it gives, so nothing here reads a config. A wrong argument
is the user's config, said in one line before anything is built. A class of one's own (an option
file under `ADVBENCH_CONF` naming the user's module) that raises or calls `sys.exit` while it is
built is one line too (`errors.user_code_failed`), not a traceback or a run that ends without a
word; advbench's own classes keep their tracebacks.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from advbench.core.errors import AdvbenchError, user_code_failed


def own_code(path: str) -> bool:
    """Whether a dotted path names advbench's code, whose failures are bugs to see with their traceback."""
    return str(path).split(".")[0] == "advbench"


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
        if isinstance(exc, AdvbenchError) or own_code(getattr(factory, "__module__", "")):
            raise
        raise user_code_failed(f"_target_ '{path}'", "building it", exc) from exc


@dataclass(frozen=True)
class BoundFactory:
    """An option's class or function and the arguments the option gives it, bound to its parameters where
    the options are read (`advbench.cli.option_targets.bound_factory`): below the command line an option is
    this, not a mapping naming its class. `source` is the dotted path the option names the factory by (what
    keys hash)."""

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
