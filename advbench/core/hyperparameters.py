"""The one check of every attack's hyperparameters, run in its constructor.

An attack on a classifier (`robustness.attacks.attack_contract.Attack`) or on a quality metric
(`quality.attacks.metric_attack.MetricAttack`) declares each constructor argument's valid values
once, next to its class, as `hyperparameters = {"steps": Whole(1), "rel_stepsize": Real(0,
open_low=True), ...}`; `set_hyperparameters(locals())` (`DeclaresHyperparameters`, the base both
halves' attacks share) checks them all and sets them as attributes, and the contract tests derive
each argument's bad values from the same declaration (`Range.bad`). A check returns the value it
was given, unchanged, when it is valid, and otherwise raises `AdvbenchError` with one line naming
the attack, the parameter, what it needs and what came: "PGD: steps must be a whole number >= 1,
got 0". So a bad setting fails the same way from Python, the CLI and `advbench.evaluate` (or
`evaluate_metric`), before any work. NaN and infinities are never valid numbers (NaN passes
every `<=` test and would only surface as NaN iterates after the attack ran).
"""
from __future__ import annotations

import math
import numbers
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from advbench.core.errors import AdvbenchError

_SHOWN = 60


def _owner(owner: object) -> str:
    return owner if isinstance(owner, str) else type(owner).__name__


def _shown(value: object) -> str:
    """`repr(value)` on one line, cut short when long."""
    text = " ".join(repr(value).split())
    return text if len(text) <= _SHOWN else text[:_SHOWN - 3] + "..."


def refuse(owner: object, name: str, needs: str, value: object) -> AdvbenchError:
    """One line naming the value's owner (an attack; none, "", where `name` is an option's key) and what it needs."""
    said = f"{_owner(owner)}: " if owner != "" else ""
    return AdvbenchError(f"{said}{name} must be {needs}, got {_shown(value)}")


def _is_whole(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def whole(owner: object, name: str, value: Any, low: int | None = 1, *, odd: bool = False,
          high: int | None = None) -> Any:
    """`value` if it is an integer (not a bool) >= `low` (any integer when `low` is None), <= `high`
    (when given), and odd if asked."""
    bounds = "" if low is None else f" in [{low}, {high}]" if high is not None else f" >= {low}"
    needs = ("an odd whole number" if odd else "a whole number") + bounds
    if not _is_whole(value) or (low is not None and value < low) or (high is not None and value > high) \
            or (odd and value % 2 == 0):
        raise refuse(owner, name, needs, value)
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
        raise refuse(owner, name, needs, value)
    return value


def flag(owner: object, name: str, value: Any) -> Any:
    """`value` if it is True or False."""
    if not isinstance(value, bool):
        raise refuse(owner, name, "true or false", value)
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
        raise refuse(owner, name, needs, values)
    if not all(_is_whole(v) and v >= low for v in values):
        raise refuse(owner, name, needs, list(values))
    return values


class Range:
    """The valid values of one hyperparameter: `check` refuses the others, `bad` names some of them."""

    optional: bool = False
    """Whether None is valid too (the attack's "off" or "derive it" setting)."""

    def check(self, owner: object, name: str, value: Any) -> Any:
        """`value` if valid (None when `optional`), else an AdvbenchError naming `name`."""
        if value is None and self.optional:
            return None
        return self._check(owner, name, value)

    def _check(self, owner: object, name: str, value: Any) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def bad(self) -> list[Any]:
        """Values this range refuses, from its ends and of wrong types: what the contract tests try."""
        return self._bad() + ([] if self.optional else [None])

    def _bad(self) -> list[Any]:  # pragma: no cover - abstract
        raise NotImplementedError


@dataclass(frozen=True)
class Whole(Range):
    """A whole number >= `low` (any when `low` is None), <= `high` where given, odd if asked (`whole`)."""

    low: int | None = 1
    odd: bool = False
    optional: bool = False
    high: int | None = None

    def _check(self, owner: object, name: str, value: Any) -> Any:
        return whole(owner, name, value, self.low, odd=self.odd, high=self.high)

    def _bad(self) -> list[Any]:
        below = ([] if self.low is None else [self.low - 1]) + ([] if self.high is None else [self.high + 1])
        even = [self.low + self.low % 2 if self.low is not None else 2] if self.odd else []
        return below + even + [2.5, "3", True]


@dataclass(frozen=True)
class Real(Range):
    """A finite number between `low` and `high`, either end open or absent (`real`)."""

    low: float | None = None
    high: float | None = None
    open_low: bool = False
    open_high: bool = False
    optional: bool = False

    def _check(self, owner: object, name: str, value: Any) -> Any:
        return real(owner, name, value, self.low, self.high, open_low=self.open_low, open_high=self.open_high)

    def _bad(self) -> list[Any]:
        ends = [] if self.low is None else [self.low - 1] + ([self.low] if self.open_low else [])
        ends += [] if self.high is None else [self.high + 1] + ([self.high] if self.open_high else [])
        return ends + [math.nan, math.inf, -math.inf, "0.1", True]


@dataclass(frozen=True)
class Flag(Range):
    """True or False (`flag`)."""

    def _check(self, owner: object, name: str, value: Any) -> Any:
        return flag(owner, name, value)

    def _bad(self) -> list[Any]:
        return ["yes", 1]


@dataclass(frozen=True)
class Choice(Range):
    """One of the names `valid` (`choice`)."""

    valid: tuple[str, ...]

    def _check(self, owner: object, name: str, value: Any) -> Any:
        return choice(owner, name, value, self.valid)

    def _bad(self) -> list[Any]:
        return ["nope", 3]


@dataclass(frozen=True)
class Wholes(Range):
    """A list of whole numbers, each >= `low` (`wholes`); kept as a list of ints."""

    low: int = 1

    def _check(self, owner: object, name: str, value: Any) -> Any:
        return [int(v) for v in wholes(owner, name, value, self.low)]

    def _bad(self) -> list[Any]:
        return [[self.low - 1], [1000, self.low - 1], [2.5], "1000", 5]


@dataclass(frozen=True)
class File(Range):
    """A file's path: non-empty text or an `os.PathLike`; whether it holds what it should is for its reader."""

    optional: bool = False

    def _check(self, owner: object, name: str, value: Any) -> Any:
        if not isinstance(value, (str, os.PathLike)) or not str(value):
            raise refuse(owner, name, "a file path", value)
        return value

    def _bad(self) -> list[Any]:
        return ["", 3, True]


def check_all(owner: object, ranges: dict[str, Range], arguments: dict[str, Any]) -> dict[str, Any]:
    """The arguments `ranges` declares, each checked, in declaration order (those not given left out)."""
    return {name: spec.check(owner, name, arguments[name]) for name, spec in ranges.items() if name in arguments}


class DeclaresHyperparameters:
    """Base of every attack: `hyperparameters` declares each constructor argument's valid values,
    and the constructor hands its arguments to `set_hyperparameters`, the one check."""

    hyperparameters: ClassVar[Mapping[str, Range]] = {}
    """Constructor argument -> its valid values (`Whole(1)`, `Real(0, 1)`, ...); a subclass
    declares its own and its parent's (`{**Parent.hyperparameters, ...}`)."""

    def set_hyperparameters(self, arguments: Mapping[str, Any]) -> None:
        """Check the declared hyperparameters among `arguments` (the constructor's `locals()`) and
        set each as an attribute, as given; a bad one is an AdvbenchError."""
        for name, value in check_all(self, self.hyperparameters, arguments).items():
            setattr(self, name, value)
