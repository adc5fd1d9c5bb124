"""Where advbench keeps what it trains, reads and is given: one rule for every config.

`ADVBENCH_CACHE` (default `~/.cache/advbench`) is the root: trained checkpoints and fitted
metric models go there, and so do data sets (`<cache>/data`) and metric weights
(`<cache>/weights`) unless `ADVBENCH_DATA` or `ADVBENCH_WEIGHTS` point elsewhere. YAML files
ask for these folders as `${advbench:cache}`, `${advbench:data}` and `${advbench:weights}`,
so moving the cache moves everything that is not set on its own.
"""

from __future__ import annotations

import os
from pathlib import Path

from advbench.core.errors import AdvbenchError

LOCATIONS: dict[str, tuple[str, str | None]] = {
    "cache": ("ADVBENCH_CACHE", None),
    "data": ("ADVBENCH_DATA", "data"),
    "weights": ("ADVBENCH_WEIGHTS", "weights"),
}
"""Folder kind -> (environment variable that sets it, sub-folder of the cache otherwise)."""


def _from_env(variable: str) -> Path | None:
    """The variable's path, `~` expanded; unset and empty both mean 'not set'."""
    value = os.environ.get(variable, "").strip()
    return Path(value).expanduser() if value else None


def location(kind: str) -> str:
    """The folder for `kind` (cache, data or weights) under the current environment."""
    if kind not in LOCATIONS:
        raise AdvbenchError(f"unknown advbench folder '{kind}'; valid: {', '.join(LOCATIONS)}")
    variable, below_cache = LOCATIONS[kind]
    folder = _from_env(variable)
    if folder is None:
        cache = _from_env("ADVBENCH_CACHE") or Path.home() / ".cache" / "advbench"
        folder = cache / below_cache if below_cache else cache
    return str(folder)


def writable_folder(path: Path | str, what: str) -> Path:
    """`path` as an existing folder advbench may write into (created if absent), or a one-line error.

    A file in its place, a place no folder can be made (under /proc) or one the user may not
    write are said in one line naming `what` (the option that gave the path).
    """
    if not isinstance(path, (str, os.PathLike)):
        raise AdvbenchError(f"{what} must be a folder path, got {path!r}")
    folder = Path(path).expanduser()
    if folder.exists() and not folder.is_dir():
        raise AdvbenchError(f"{what} '{folder}' is a file, not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".advbench-write-test-{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError as exc:
        raise AdvbenchError(f"{what} '{folder}' is not a folder advbench can write: {exc.strerror or exc}") from None
    return folder


def refuse_link(path: Path) -> Path:
    """`path` unless it is a symbolic link, which is a one-line error naming it.

    advbench creates, replaces and deletes only files and folders that really are where it
    expects them: writing through a link planted there would change a file elsewhere.
    """
    if os.path.islink(path):
        raise AdvbenchError(f"'{path}' is a symbolic link; advbench does not write through links: remove it")
    return path


def no_links(path: Path, root: Path) -> Path:
    """`path` after checking it and every folder between `root` and it: none a link, none `..`.

    `root` is the folder the user chose (it may itself be a link) and `path` is spelled below
    it; what advbench puts there must stay there, so a `..` in the path is refused like a link.
    """
    current = root
    for part in path.relative_to(root).parts:
        current = current / part
        if part == "..":
            raise AdvbenchError(f"'{path}' leaves the folder '{root}'; advbench writes only inside it")
        refuse_link(current)
    return path
