"""Hydra glue: find the shipped `conf/`, check overrides early, run a task as a Hydra app.

`advbench run` and `advbench uap ...` forward their arguments here so that `-m` sweeps,
`--cfg job` and launcher plugins behave exactly as in any Hydra application, while a wrong
option name or value still ends in one readable line instead of a Hydra stack trace.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import shutil
import socket
import sys
import tempfile
from itertools import product
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException
from yaml import YAMLError

from advbench.cli.compositions import OWN_COMPOSITION_FLAGS, composed_once
from advbench.cli.options import unknown_key, with_user_conf  # and registers the ${advbench:...} resolver the YAML uses
from advbench.cli.validate import check_composed, check_sweep_presets, one_line
from advbench.cli.workers import watch_parent
from advbench.core.catalog import conf_dir, config_root, group_options
from advbench.core.errors import AdvbenchError, user_error

Task = Callable[[DictConfig], Any]


# Flags that take a value in Hydra's command line; any other argument not starting with "-" is an override.
_HYDRA_VALUE_FLAGS = {"--cfg", "-c", "--package", "-p", "--config-name", "-cn", "--config-dir", "-cd",
                      "--experimental-rerun", "--info", "-i"}


_HYDRA_MODES = (("-m", "--multirun"), ("--cfg", "-c"), ("--info", "-i"), ("--shell-completion", "-sc"))
"""Hydra's mutually exclusive modes, each with its spellings."""


def split_args(args: Sequence[str]) -> tuple[list[str], list[str]]:
    """Separate Hydra flags (kept in order, with their values) from overrides.

    The mistakes Hydra would answer with its usage text or grammar error are one line here: a
    flag that takes a value given none, and a sweep written with spaces after its commas.
    """
    flags: list[str] = []
    overrides: list[str] = []
    it = iter(args)
    for arg in it:
        if arg.startswith("-"):
            flags.append(arg)
            if arg in _HYDRA_VALUE_FLAGS and "=" not in arg:
                value = next(it, None)
                optional = arg in ("--info", "-i")  # Hydra's --info takes its value optionally
                if not optional and (value is None or value.startswith("-")):
                    raise AdvbenchError(f"{arg} needs a value (e.g. {arg} {_FLAG_EXAMPLES.get(arg, 'VALUE')}); "
                                        "flags go before or after the overrides, each with its value")
                if value is not None:
                    flags.append(value)
        else:
            overrides.append(arg)
    for given, following in zip(overrides, [*overrides[1:], None]):
        if given.endswith(",") and "=" in given:
            joined = given + (following if following is not None and "=" not in following else "...")
            raise AdvbenchError(f"a sweep's values are separated by commas without spaces: write {joined} "
                                f"(one argument), not '{given} {following or ''}'".rstrip())
    return flags, with_user_conf(overrides)


_FLAG_EXAMPLES = {"--cfg": "job", "-c": "job", "--config-name": "config", "-cn": "config", "--config-dir": "DIR",
                  "-cd": "DIR", "--package": "_global_", "-p": "_global_", "--info": "defaults", "-i": "defaults"}
"""A value to show when a Hydra flag is given without one."""


def _search_dirs(overrides: Sequence[str], config_name: str = "config") -> list[Path]:
    """The primary config's folder, conf/, and any user folders given with `hydra.searchpath=[file://...]`."""
    dirs = list(dict.fromkeys([config_root(config_name), conf_dir()]))
    for ov in overrides:
        key, _, value = ov.partition("=")
        if key.lstrip("+") == "hydra.searchpath":
            for item in value.strip("[]").split(","):
                item = item.strip().strip("'\"")
                if item.startswith("file://"):
                    dirs.append(Path(item[len("file://"):]))
                _check_search_entry(item)
    return dirs


def _check_search_entry(item: str) -> None:
    """A `hydra.searchpath` entry Hydra would skip without a word: a missing folder, a package not installed."""
    scheme, sep, where = item.partition("://")
    if not sep or scheme not in ("file", "pkg"):
        raise AdvbenchError(f"hydra.searchpath entry '{item}' must start with file:// (a folder) or pkg:// (a package)")
    if scheme == "file" and not Path(where).expanduser().is_dir():
        raise AdvbenchError(f"hydra.searchpath entry '{item}': no folder '{where}'")
    if scheme == "pkg" and importlib.util.find_spec(where.split("/")[0].replace("/", ".")) is None:
        raise AdvbenchError(f"hydra.searchpath entry '{item}': no installed package '{where}'")


def check_overrides(overrides: Sequence[str], config_name: str = "config") -> None:
    """Reject unknown group options before Hydra sees them, listing the valid ones.

    A group of the primary config's own folder shadows the shared group of that name
    (`advbench iqa run attack=` lists the attacks on metrics only).
    """
    dirs = _search_dirs(overrides, config_name)
    for ov in overrides:
        key, sep, value = ov.partition("=")
        key = key.lstrip("+~")
        holders = [d for d in dirs if (d / key).is_dir() and key != "hydra"]
        if not sep or not holders:
            continue
        own = holders[:1] if holders[0] != conf_dir() and holders[0] == config_root(config_name) else holders
        valid = sorted({o for d in own for o in group_options(key, d)})
        for choice in _sweep_values(value):
            if choice not in valid and choice != "null":
                raise AdvbenchError(f"unknown {key} '{choice}'; valid: {', '.join(valid)}")


def _sweep_values(value: str) -> list[str]:
    """The choices in a plain comma sweep (`a,b,c`); Hydra's sweep functions are left to Hydra."""
    if "(" in value:
        return []
    return [v.strip() for v in value.split(",") if v.strip()]


def _first_choices(overrides: Sequence[str]) -> list[list[str]]:
    """Every combination of the sweep, so each is composed once up front.

    Hydra's own parser expands the values, so `range(0,8)`, `choice(...)` and `glob(...)`
    sweeps are checked like comma lists; an override it cannot parse is left for `compose`
    to report.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    parser = OverridesParser.create()
    options = []
    for ov in overrides:
        try:
            (parsed,) = parser.parse_overrides([ov])
        except (OverrideParseException, ValueError):
            options.append([ov])
            continue
        if parsed.is_sweep_override():
            key = parsed.get_key_element()
            options.append([f"{key}={v}" for v in parsed.sweep_string_iterator()])
        else:
            options.append([ov])
    return [list(c) for c in product(*options)]


def compose_config(config_name: str, overrides: Sequence[str], *, check: bool = True) -> DictConfig:
    """Compose like Hydra does and check every value (`check`; else as composed, unresolved); errors become
    one-line AdvbenchErrors."""
    check_overrides(overrides := with_user_conf(overrides), config_name)  # ADVBENCH_CONF's folders too
    try:
        cfg = _compose(config_name, overrides)
    except (HydraException, OmegaConfBaseException, ValueError, YAMLError) as exc:  # YAML: an option file of the user's
        raise (_unknown_key(config_name, overrides, exc) or AdvbenchError(one_line(exc))) from None
    if check:
        check_composed(cfg)
    return cfg


def _compose(config_name: str, overrides: Sequence[str]) -> DictConfig:
    with initialize_config_dir(config_dir=str(config_root(config_name)), version_base="1.3"):
        cfg = compose(config_name=config_name, overrides=list(overrides), return_hydra_config=False)
    return cfg


_NO_OVERRIDE = re.compile(r"Could not override '([^']+)'")


def _unknown_key(config_name: str, overrides: Sequence[str], exc: BaseException) -> AdvbenchError | None:
    """Hydra's "Could not override 'x'" as "unknown key 'x'; did you mean y?" (difflib).

    The suggestion comes from the keys at the level of the first segment that does not
    exist, in the config composed without the offending override.
    """
    found = _NO_OVERRIDE.search(str(exc))
    if found is None:
        return None
    key = found.group(1)
    if "." not in key and any((d / key).is_dir() for d in _search_dirs(overrides, config_name)):
        given = next((o for o in overrides if o.partition("=")[0] == key), f"{key}=...")
        return AdvbenchError(f"config group '{key}' is not in the defaults list; add it with +{given}")
    base = None
    for kept in ([o for o in overrides if o.partition("=")[0].lstrip("+~") != key],
                 [o for o in overrides if o.startswith("hydra.")]):
        try:
            base = _compose(config_name, kept)
            break
        except (HydraException, OmegaConfBaseException, ValueError):
            continue
    if base is None:
        return None
    return unknown_key(base, key)


_NO_WRITE_FLAGS = {"--cfg", "-c", "--help", "--hydra-help", "--info", "-i", "--shell-completion", "-sc"}


def run_hydra(config_name: str, task: Task, args: Sequence[str], prog: str,
              around: Callable[[], contextlib.AbstractContextManager[Any]] | None = None,
              before: Callable[[list[DictConfig], list[str]], None] | None = None) -> None:
    """Run `task(cfg)` as a Hydra app over `args` (overrides, `-m`, `--cfg job`, ...).

    `around()`, when given, is entered after the up-front checks and holds the jobs (`advbench
    run` collects the gate's verdicts in it), so a wrong option name is answered before it loads.
    `before(cfgs, overrides)`, when given, sees a launching sweep's command-line combinations,
    composed and checked, and its overrides before any job runs (`advbench run` states their cost
    there, the experiment's own sweep included).

    A sweep's (and a printed config's) jobs are composed and checked first, and their output folders
    tried for writing, so a bad value fails in one line before any job starts. A single run is
    composed once, by Hydra (`composed_once`; a composition costs 0.1–0.3 s): each job checks its
    config and folder before its task, and when Hydra itself fails before the job (an unknown key,
    a folder it cannot create), the run is composed here to say why in one line.
    """
    import hydra

    flags, overrides = split_args(args)
    names = {f.partition("=")[0] for f in flags}
    _check_config_name(flags, overrides)
    modes = [group[0] for group in _HYDRA_MODES if names & set(group)]
    if len(modes) > 1:
        raise AdvbenchError(f"{' and '.join(modes)} cannot be combined (Hydra runs one mode at a time); "
                            f"to see a sweep's config, drop -m and give one value per swept key")
    if names & {"-m", "--multirun"} and not names & _NO_WRITE_FLAGS:  # a sweep that launches jobs
        _check_launcher(overrides)
    # every option name of a sweep first: validating a combination's values imports torch (33 s on a
    # loaded machine), and `attack=fgsm,nope` is answered without it
    check_overrides(overrides, config_name)
    check_sweep_presets(config_name, overrides, prog, launches_one=not names & ({"-m", "--multirun"} | _NO_WRITE_FLAGS))
    if not (names & OWN_COMPOSITION_FLAGS or not flags):
        _check_jobs(config_name, names, overrides, before)

    launcher = (socket.gethostname(), os.getpid())  # travels with `_app` to the launcher's workers (pickled by value)

    started: list[bool] = []

    @hydra.main(config_path=str(config_root(config_name)), config_name=config_name, version_base="1.3")
    def _app(cfg: DictConfig) -> Any:
        started.append(True)
        watch_parent(launcher)
        return guarded(task, cfg)

    with (around or contextlib.nullcontext)():
        try:
            with _hydra_command_line([prog, *flags, *overrides], raise_errors=not flags), composed_once(names, overrides):
                _app()
        except Exception as exc:
            if flags or started:
                raise
            check_writable(compose_config(config_name, overrides))  # says in one line what Hydra failed on
            if isinstance(exc, OSError):  # the folders Hydra makes for itself: hydra.run.dir, its log file
                raise AdvbenchError(f"Hydra cannot write its run folder (hydra.run.dir): {exc}") from None
            if isinstance(exc, (HydraException, OmegaConfBaseException)):  # its own settings (hydra.*), in one line
                raise AdvbenchError(one_line(exc)) from None
            raise


def _check_jobs(config_name: str, names: set[str], overrides: list[str],
                before: Callable[[list[DictConfig], list[str]], None] | None) -> None:
    """Compose and check the command line's jobs (each combination of a sweep) and their folders,
    then hand a launching sweep's to `before`."""
    combos = _first_choices(overrides) if names & {"-m", "--multirun"} else [list(overrides)]
    cfgs = [compose_config(config_name, combo) for combo in combos]
    if not names & _NO_WRITE_FLAGS:
        for cfg in cfgs:
            check_writable(cfg)
    if names & {"-m", "--multirun"}:
        _check_sweep_base(config_name, overrides)
        if before is not None and not names & _NO_WRITE_FLAGS:
            before(cfgs, overrides)


@contextlib.contextmanager
def _hydra_command_line(argv: list[str], *, raise_errors: bool) -> Iterator[None]:
    """`sys.argv` as Hydra reads it (flags only before the first override) and, with `raise_errors`,
    `HYDRA_FULL_ERROR=1`, under which Hydra raises what fails instead of printing it; both restored,
    and so is Hydra's job config, which Hydra leaves set (a later command or `advbench.evaluate` in
    the same process would read the finished job's mode and overrides as its own)."""
    from hydra.core.hydra_config import HydraConfig

    saved, saved_full_error, saved_job = sys.argv, os.environ.get("HYDRA_FULL_ERROR"), HydraConfig.instance().cfg
    sys.argv = argv
    if raise_errors:
        os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        yield
    finally:
        HydraConfig.instance().cfg = saved_job
        sys.argv = saved
        if saved_full_error is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        else:
            os.environ["HYDRA_FULL_ERROR"] = saved_full_error


def _check_sweep_base(config_name: str, overrides: Sequence[str]) -> None:
    """Hydra first composes a sweep without its swept overrides (the sweeper's own config): a key that
    only the swept options have (`+experiment/blackbox_row=square,hsj attack.params.seed=0`) fails
    there in six lines, though every job would compose. Say so in one line, with the fix."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except (OverrideParseException, ValueError):
        return
    swept = [o.input_line for o in parsed if o.is_sweep_override()]
    if not swept:  # the base is the sweep's one combination, composed and checked already
        return
    try:
        _compose(config_name, [o.input_line for o in parsed if not o.is_sweep_override()])
    except (HydraException, OmegaConfBaseException, ValueError) as exc:
        if (found := _NO_OVERRIDE.search(str(exc))) is None:
            return
        key = found.group(1)
        raise AdvbenchError(f"{key} is a key of some swept options only: Hydra applies it first to the config "
                            f"without the sweep ({', '.join(swept)}), which lacks it; write ++{key}=... "
                            "(set it where present, add it where not)") from None


def _check_config_name(flags: Sequence[str], overrides: Sequence[str]) -> None:
    """`-cn NAME` must name a primary config in conf/ or a search-path folder (else Hydra's six lines)."""
    for flag, value in zip(flags, [*flags[1:], None]):
        name = flag.partition("=")[2] if "=" in flag else value
        if flag.partition("=")[0] in ("--config-name", "-cn") and name:
            dirs = _search_dirs(overrides)
            if not any((d / f"{name.removesuffix('.yaml')}.yaml").is_file() for d in dirs):
                valid = sorted({p.stem for d in dirs if d.is_dir() for p in d.glob("*.yaml")})
                raise AdvbenchError(f"no primary config '{name}' in {', '.join(str(d) for d in dirs)}; "
                                    f"valid: {', '.join(valid)}")


def _check_launcher(overrides: Sequence[str]) -> None:
    """Slurm's launcher submits with `srun`/`sbatch`: off a cluster it would fail with a traceback."""
    launcher = next((o.partition("=")[2] for o in overrides if o.startswith("hydra/launcher=")), None)
    if launcher == "submitit_slurm" and shutil.which("srun") is None:
        raise AdvbenchError("hydra/launcher=submitit_slurm submits jobs to Slurm, but there is no srun here: run it on a "
                            "Slurm login node, or use hydra/launcher=submitit_local or joblib (docs/cluster.md)")


def guarded(task: Task, cfg: DictConfig) -> Any:
    """Inside a Hydra job: check the config and output folder, run; a user-facing error becomes one line and exit 1."""
    try:
        check_composed(cfg)
        check_writable(cfg)
        return task(cfg)
    except Exception as exc:
        cause = user_error(exc)
        if cause is None:
            raise
        print(f"Error: {cause}", file=sys.stderr)
        raise SystemExit(1) from None


def check_writable(cfg: DictConfig) -> None:
    """Create the job's output folder and write a scratch file there, or fail in one line.

    `out_dir` and `records_dir` for the jobs that have them; the cache for `advbench train`,
    which writes only there. A read-only folder is refused even when every cell in it is done:
    a rerun takes each cell's lock to skip it safely beside a concurrent run of the same cell.
    """
    keys = [k for k in ("out_dir", "records_dir") if cfg.get(k)] or [k for k in ("cache_dir",) if cfg.get(k)]
    for key in keys:
        folder = Path(str(cfg[key])).expanduser()
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=folder):
                pass
        except OSError as exc:
            done = " (even to skip finished cells: it takes each cell's lock there; to read finished records use " \
                "advbench plot or check)" if key in ("out_dir", "records_dir") and folder.is_dir() else ""
            raise AdvbenchError(f"{key} '{folder}' is not a writable folder: {exc.strerror or exc}{done}") from None
