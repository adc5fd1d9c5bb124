"""The one check of every attack's hyperparameters, run in its constructor.

Each function returns the value it was given, unchanged, when it is valid, and otherwise raises
`AdvbenchError` with one line naming the attack, the parameter, what it needs and what came:
"PGD: steps must be a whole number >= 1, got 0". So a bad setting fails the same way from Python,
the CLI and `advbench.evaluate`, before any work. NaN and infinities are never valid numbers
(NaN passes every `<=` test and would only surface as NaN iterates after the attack ran).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Sequence
from typing import Any

from advbench.core.errors import AdvbenchError

_SHOWN = 60


def _owner(owner: object) -> str:
    return owner if isinstance(owner, str) else type(owner).__name__


def _shown(value: object) -> str:
    """`repr(value)` on one line, cut short when long."""
    text = " ".join(repr(value).split())
    return text if len(text) <= _SHOWN else text[:_SHOWN - 3] + "..."


def _refuse(owner: object, name: str, needs: str, value: object) -> AdvbenchError:
    return AdvbenchError(f"{_owner(owner)}: {name} must be {needs}, got {_shown(value)}")


def _is_whole(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def whole(owner: object, name: str, value: Any, low: int | None = 1, *, odd: bool = False) -> Any:
    """`value` if it is an integer (not a bool) >= `low` (any integer when `low` is None), and odd if asked."""
    needs = ("an odd whole number" if odd else "a whole number") + ("" if low is None else f" >= {low}")
    if not _is_whole(value) or (low is not None and value < low) or (odd and value % 2 == 0):
        raise _refuse(owner, name, needs, value)
    return value


def real(owner: object, name: str, value: Any, low: float | None = None, high: float | None = None, *,
         open_low: bool = False, open_high: bool = False) -> Any:
    """`value` if it is a finite number (not a bool) in the range from `low` to `high`.

    An end that is None is unbounded; `open_low` / `open_high` leave that end out.
    """
    if low is not None and high is not None:
        needs = f"a number in {'(' if open_low else '['}{low:g}, {high:g}{')' if open_high else ']'}"
    elif low is not None:
        needs = f"a finite number {'>' if open_low else '>='} {low:g}"
    elif high is not None:
        needs = f"a finite number {'<' if open_high else '<='} {high:g}"
    else:
        needs = "a finite number"
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    if ok and low is not None:
        ok = value > low if open_low else value >= low
    if ok and high is not None:
        ok = value < high if open_high else value <= high
    if not ok:
        raise _refuse(owner, name, needs, value)
    return value


def flag(owner: object, name: str, value: Any) -> Any:
    """`value` if it is True or False."""
    if not isinstance(value, bool):
        raise _refuse(owner, name, "true or false", value)
    return value


def choice(owner: object, name: str, value: Any, valid: Sequence[str]) -> Any:
    """`value` if it is one of `valid`."""
    if not isinstance(value, str) or value not in valid:
        raise AdvbenchError(f"{_owner(owner)}: unknown {name} {_shown(value)}; valid: {', '.join(valid)}")
    return value


def wholes(owner: object, name: str, values: Any, low: int = 1) -> Any:
    """`values` if it is a sequence of whole numbers, each >= `low` (query checkpoints)."""
    needs = f"a list of whole numbers >= {low}"
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise _refuse(owner, name, needs, values)
    if not all(_is_whole(v) and v >= low for v in values):
        raise _refuse(owner, name, needs, list(values))
    return values
