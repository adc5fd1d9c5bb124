"""Pieces every click command shares: Hydra forwarding and one-line error reporting."""

from __future__ import annotations

import functools
from typing import Any, Callable, ContextManager

import click

from advbench.core.errors import user_error

HYDRA_ARGS = {"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": ["-h", "--help"]}
"""Context settings of the commands that hand their arguments to Hydra. `-h` is click's help, as
everywhere in advbench: passed on, it would print Hydra's whole app help (seconds of composing)."""


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


def run_task(task_path: str, cfg: Any) -> Any:
    """Import the task `task_path` (module.function) and run it on `cfg`.

    The task's module is imported only here, inside the Hydra job, once the config is composed
    and checked: it imports torch (33 s on a loaded machine), and a wrong option name such as
    `attack=nope` is answered before that, in a fraction of a second.
    """
    from importlib import import_module

    module, _, name = task_path.rpartition(".")
    return getattr(import_module(module), name)(cfg)


def hydra_command(config_name: str, task_path: str, prog: str,
                  around: Callable[[], ContextManager[Any]] | None = None,
                  before: Callable[[list[Any], list[str]], None] | None = None) -> Callable[[tuple[str, ...]], None]:
    """A click callback that forwards its raw arguments to a Hydra app running `task_path`.

    `around()` (see `run_hydra`) is entered once the arguments are checked, around the jobs;
    `before(cfgs, overrides)` sees a sweep's composed jobs before they launch.
    """

    @one_line_errors
    def callback(args: tuple[str, ...]) -> None:
        from advbench.cli.config import run_hydra

        # a module-level function bound by partial: launchers pickle the job and find it by name
        run_hydra(config_name, functools.partial(run_task, task_path), list(args), prog=prog, around=around,
                  before=before)

    return callback
