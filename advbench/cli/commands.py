"""Pieces every click command shares: Hydra forwarding and one-line error reporting."""

from __future__ import annotations

import functools
from typing import Any, Callable

import click

from advbench.core.errors import user_error

HYDRA_ARGS = {"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": ["--help"]}


def one_line_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn library errors (and disks refusing a write) into click's one-line error and exit 1."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            cause = user_error(exc)
            if cause is None:
                raise
            raise click.ClickException(str(cause)) from None

    return wrapper


def hydra_command(config_name: str, task_path: str, prog: str) -> Callable[[tuple[str, ...]], None]:
    """A click callback that forwards its raw arguments to a Hydra app running `task_path`."""

    @one_line_errors
    def callback(args: tuple[str, ...]) -> None:
        from importlib import import_module

        from advbench.cli.config import run_hydra

        module, _, name = task_path.rpartition(".")
        run_hydra(config_name, getattr(import_module(module), name), list(args), prog=prog)

    return callback
