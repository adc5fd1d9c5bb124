"""One exception type for every user-facing failure, and the disk errors that are the user's too.

The CLI turns it into a single line on stderr and exit status 1, so library code raises it
with a message that says what was expected and what came instead. A disk that refuses a
write (read-only, no permission, full) is not a bug either: `user_error` turns it into one.
"""

from __future__ import annotations

import errno
import os
import warnings
from typing import Any


class AdvbenchError(Exception):
    """A problem the user can fix: bad config, missing file, corrupt checkpoint, NaN output."""


class AdvbenchWarning(UserWarning):
    """A sign a Python caller should read (masked gradients, a model near chance): a category of
    its own, so that scripts and tests can catch it, filter it or turn it into an error."""


_previous_format: list[Any] = []
"""`warnings.formatwarning` as `plain_warnings` found it: the format of every other category."""


def _plain_format(message: Any, category: type[Warning], filename: str, lineno: int, line: str | None = None) -> str:
    """`warnings.formatwarning`'s signature: advbench's warnings as their message alone, the rest as before."""
    if issubclass(category, AdvbenchWarning):
        return f"Warning: {message}\n"
    return _previous_format[0](message, category, filename, lineno, line)


def plain_warnings() -> None:
    """Show every `AdvbenchWarning` as one line, `Warning: <message>`, from now on in this process.

    Python's default adds the file, the line number and the source of the call that warned: for
    advbench's warnings that is its own `warn(...)` line, which tells the user nothing. Other
    categories keep the format in place before. Installed where the command line starts and
    where the Python API warns, once per process (a format installed after it stays in place).
    """
    if not _previous_format:
        _previous_format.append(warnings.formatwarning)
        warnings.formatwarning = _plain_format


def first_line(exc: BaseException) -> str:
    """The first non-blank line of an exception's message ("" when it has none): what a one-line
    error quotes of a library's or a user's multi-line message."""
    return next((line.strip() for line in str(exc).splitlines() if line.strip()), "")


def user_code_failed(named: str, doing: str, exc: BaseException) -> AdvbenchError:
    """One line for an exception (or `sys.exit`) raised by the user's own code while advbench ran it."""
    return AdvbenchError(f"{named}: {doing} failed: {failure_said(exc)}")


def failure_said(exc: BaseException) -> str:
    """What an exception of the user's code says in one line: `exited with status N` for `sys.exit`, which
    would otherwise end the run without a word, else its type and first line."""
    return f"exited with status {exc.code}" if isinstance(exc, SystemExit) else f"{type(exc).__name__}: {first_line(exc)}"


DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM})
"""OSError numbers that say "this place cannot be written", not "advbench has a bug"."""


def disk_error(exc: OSError) -> AdvbenchError:
    """One line for a refused write: the reason, and the file when the OS names it."""
    reason = os.strerror(exc.errno) if exc.errno else str(exc)
    where = f" '{exc.filename}'" if exc.filename else ""
    hint = "free some space or choose another folder" if exc.errno in (errno.ENOSPC, errno.EDQUOT) \
        else "choose a writable folder (out_dir=..., or ADVBENCH_CACHE for the cache)"
    return AdvbenchError(f"cannot write{where}: {reason}; {hint}")


def user_error(exc: BaseException) -> AdvbenchError | None:
    """The user-facing problem behind `exc`, looking through wrappers (Hydra's, torch's).

    An AdvbenchError anywhere in the cause chain wins; else a disk error becomes one; else
    None (a bug, whose traceback the user should see and report).
    """
    seen: set[int] = set()
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        chain.append(current)
        current = current.__cause__ or current.__context__
    for item in chain:
        if isinstance(item, AdvbenchError):
            return item
    for item in chain:
        if isinstance(item, OSError) and item.errno in DISK_ERRNOS:
            return disk_error(item)
    return None
