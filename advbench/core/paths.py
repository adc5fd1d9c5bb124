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

from omegaconf import OmegaConf

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


OmegaConf.register_new_resolver("advbench", location, replace=True, use_cache=False)


def writable_folder(path: Path | str, what: str) -> Path:
    """`path` as an existing folder advbench may write into (created if absent), or a one-line error.

    A file in its place, a place no folder can be made (under /proc) or one the user may not
    write are said in one line naming `what` (the option that gave the path).
    """
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
