"""Hydra glue: find the shipped `conf/`, check overrides early, run a task as a Hydra app.

`advbench run` and `advbench uap ...` forward their arguments here so that `-m` sweeps,
`--cfg job` and launcher plugins behave exactly as in any Hydra application, while a wrong
option name or value still ends in one readable line instead of a Hydra stack trace.
"""

from __future__ import annotations

import sys
from itertools import product
from pathlib import Path
from typing import Any, Callable, Sequence

import yaml
from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

import advbench.paths  # noqa: F401  (registers the ${advbench:cache|data|weights} resolver the YAML uses)
from advbench.errors import AdvbenchError

Task = Callable[[DictConfig], Any]

# Flags that take a value in Hydra's own command line; everything else that does not start
# with "-" is an override.
_HYDRA_VALUE_FLAGS = {"--cfg", "-c", "--package", "-p", "--config-name", "-cn", "--config-dir", "-cd",
                      "--experimental-rerun", "--info", "-i"}
_HYDRA_GROUPS = {"hydra"}


def conf_dir() -> Path:
    """The folder holding the shipped YAML groups (source checkout or installed package)."""
    import advbench.conf

    return Path(advbench.conf.__file__).resolve().parent


def group_options(group: str, root: Path | None = None) -> list[str]:
    """Option names of a config group: one YAML file per option."""
    folder = (root or conf_dir()) / group
    return sorted(p.stem for p in folder.glob("*.yaml"))


def groups(root: Path | None = None) -> list[str]:
    base = root or conf_dir()
    return sorted(p.name for p in base.iterdir() if p.is_dir() and not p.name.startswith(("_", ".")) and p.name not in _HYDRA_GROUPS)


def describe(group: str, option: str) -> str:
    """The option's `description:` key, else the first comment line of its YAML file.

    A comment serves options whose keys all go to a `_target_` (datasets, models, metrics),
    where an extra `description` key would be passed to the constructor.
    """
    text = (conf_dir() / group / f"{option}.yaml").read_text()
    data = yaml.safe_load(text) or {}
    if data.get("description"):
        return str(data["description"]).strip()
    for line in text.splitlines():
        if line.startswith("#") and not line.startswith("# @package"):
            return line.lstrip("# ").strip()
    return ""


def split_args(args: Sequence[str]) -> tuple[list[str], list[str]]:
    """Separate Hydra flags (kept in order, with their values) from overrides."""
    flags: list[str] = []
    overrides: list[str] = []
    it = iter(args)
    for arg in it:
        if arg.startswith("-"):
            flags.append(arg)
            if arg in _HYDRA_VALUE_FLAGS and "=" not in arg:
                value = next(it, None)
                if value is not None:
                    flags.append(value)
        else:
            overrides.append(arg)
    return flags, overrides


def _search_dirs(overrides: Sequence[str]) -> list[Path]:
    """conf/ plus any user folders given with `hydra.searchpath=[file://...]`."""
    dirs = [conf_dir()]
    for ov in overrides:
        key, _, value = ov.partition("=")
        if key.lstrip("+") == "hydra.searchpath":
            for item in value.strip("[]").split(","):
                item = item.strip().strip("'\"")
                if item.startswith("file://"):
                    dirs.append(Path(item[len("file://"):]))
    return dirs


def check_overrides(overrides: Sequence[str]) -> None:
    """Reject unknown group options before Hydra sees them, listing the valid ones."""
    dirs = _search_dirs(overrides)
    known = {g for d in dirs if d.is_dir() for g in groups(d)}
    for ov in overrides:
        key, sep, value = ov.partition("=")
        key = key.lstrip("+~")
        if not sep or key not in known:
            continue
        valid = sorted({o for d in dirs for o in group_options(key, d)})
        for choice in _sweep_values(value):
            if choice not in valid and choice != "null":
                raise AdvbenchError(f"unknown {key} '{choice}'; valid: {', '.join(valid)}")


def _sweep_values(value: str) -> list[str]:
    """The choices in a plain comma sweep (`a,b,c`); Hydra's sweep functions are left to Hydra."""
    if "(" in value:
        return []
    return [v.strip() for v in value.split(",") if v.strip()]


def _first_choices(overrides: Sequence[str]) -> list[list[str]]:
    """Every combination of a comma sweep, so each is composed once up front."""
    options = []
    for ov in overrides:
        key, sep, value = ov.partition("=")
        values = _sweep_values(value) if sep else []
        options.append([f"{key}={v}" for v in values] if len(values) > 1 else [ov])
    return [list(c) for c in product(*options)]


def compose_config(config_name: str, overrides: Sequence[str]) -> DictConfig:
    """Compose like Hydra does, turning its errors into one-line AdvbenchErrors."""
    check_overrides(overrides)
    try:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
            cfg = compose(config_name=config_name, overrides=list(overrides), return_hydra_config=False)
        OmegaConf.resolve(cfg)
    except (HydraException, OmegaConfBaseException, ValueError) as exc:
        raise AdvbenchError(_one_line(exc)) from None
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise AdvbenchError(f"missing required value(s): {', '.join(missing)}; set them on the command line, "
                            f"e.g. {missing[0]}=...")
    return cfg


def _one_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return "; ".join(lines) if lines else type(exc).__name__


def run_hydra(config_name: str, task: Task, args: Sequence[str], prog: str) -> None:
    """Run `task(cfg)` as a Hydra app over `args` (overrides, `-m`, `--cfg job`, ...)."""
    import hydra

    flags, overrides = split_args(args)
    user_dirs = _search_dirs(overrides)[1:]
    if not user_dirs and not any(f in ("--info", "-i", "--hydra-help") for f in flags):
        combos = _first_choices(overrides) if any(f in ("-m", "--multirun") for f in flags) else [list(overrides)]
        for combo in combos:
            cfg = compose_config(config_name, combo)
            _validate(cfg)
    else:
        check_overrides(overrides)

    @hydra.main(config_path=str(conf_dir()), config_name=config_name, version_base="1.3")
    def _app(cfg: DictConfig) -> Any:
        return guarded(task, cfg)

    saved = sys.argv
    sys.argv = [prog, *args]
    try:
        _app()
    finally:
        sys.argv = saved


def guarded(task: Task, cfg: DictConfig) -> Any:
    """Inside a Hydra job: a user-facing error becomes one line and exit status 1."""
    try:
        return task(cfg)
    except Exception as exc:
        cause = user_error(exc)
        if cause is None:
            raise
        print(f"Error: {cause}", file=sys.stderr)
        raise SystemExit(1) from None


def user_error(exc: BaseException) -> AdvbenchError | None:
    """The AdvbenchError behind `exc`, looking through wrappers like Hydra's InstantiationException."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, AdvbenchError):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def _validate(cfg: DictConfig) -> None:
    """Value checks that Hydra cannot do: budgets must be finite and positive."""
    threat = cfg.get("threat")
    if threat is not None and threat.get("eps") is not None:
        eps = float(threat.eps)
        if not eps > 0 or eps == float("inf"):
            raise AdvbenchError(f"threat.eps must be a positive finite number, got {threat.eps}")
