"""Hydra glue: find the shipped `conf/`, check overrides early, run a task as a Hydra app.

`advbench run` and `advbench uap ...` forward their arguments here so that `-m` sweeps,
`--cfg job` and launcher plugins behave exactly as in any Hydra application, while a wrong
option name or value still ends in one readable line instead of a Hydra stack trace.
"""

from __future__ import annotations

import difflib
import math
import re
import sys
import tempfile
import types
import typing
from itertools import product
from pathlib import Path
from typing import Any, Callable, Sequence

import yaml
from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

import advbench.paths  # noqa: F401  (registers the ${advbench:cache|data|weights} resolver the YAML uses)
from advbench.errors import AdvbenchError, user_error
from advbench.gate import check_fraction
from advbench.names import safe_name
from advbench.runtime import PRECISIONS
from advbench.threat import GOALS, KNOWLEDGE, NORMS

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
        return str(data["description"]).strip() + _defense_metadata(data)
    for line in text.splitlines():
        if line.startswith("#") and not line.startswith("# @package"):
            return line.lstrip("# ").strip()
    return ""


def _defense_metadata(data: dict[str, Any]) -> str:
    """` (category; intended threat: ...)` of a defense YAML, empty for other options."""
    if "category" not in data:
        return ""
    category = data["category"]
    category = ", ".join(category) if isinstance(category, list) else str(category)
    return f" ({category}; intended threat: {data.get('threat_model', 'unstated')})"


_HYDRA_MODES = (("-m", "--multirun"), ("--cfg", "-c"), ("--info", "-i"), ("--shell-completion", "-sc"))
"""Hydra's mutually exclusive modes, each with its spellings."""


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


def compose_config(config_name: str, overrides: Sequence[str]) -> DictConfig:
    """Compose like Hydra does and check every value; errors become one-line AdvbenchErrors."""
    check_overrides(overrides)
    try:
        cfg = _compose(config_name, overrides)
    except (HydraException, OmegaConfBaseException, ValueError) as exc:
        raise (_unknown_key(config_name, overrides, exc) or AdvbenchError(_one_line(exc))) from None
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise AdvbenchError(f"missing required value(s): {', '.join(missing)}; set them on the command line, "
                            f"e.g. {missing[0]}=...")
    validate(cfg)
    return cfg


def _compose(config_name: str, overrides: Sequence[str]) -> DictConfig:
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cfg = compose(config_name=config_name, overrides=list(overrides), return_hydra_config=False)
    OmegaConf.resolve(cfg)
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
    if "." not in key and any((d / key).is_dir() for d in _search_dirs(overrides)):
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
    parts = key.split(".")
    node: Any = base
    depth = 0
    while depth < len(parts) - 1 and isinstance(node, DictConfig) and parts[depth] in node:
        node, depth = node[parts[depth]], depth + 1
    parent, leaf = ".".join(parts[:depth]), parts[depth]
    if not isinstance(node, DictConfig):
        return AdvbenchError(f"unknown key '{key}': '{parent}' holds a value, not keys")
    if leaf in node:
        return None
    names = sorted(str(k) for k in node.keys())
    unknown = ".".join(parts[:depth + 1])
    close = difflib.get_close_matches(leaf, names, n=1, cutoff=0.6)
    if close:
        return AdvbenchError(f"unknown key '{unknown}'; did you mean {parent + '.' if parent else ''}{close[0]}?")
    where = f" under {parent}" if parent else ""
    return AdvbenchError(f"unknown key '{unknown}'; valid keys{where}: {', '.join(names)}")


def _one_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return "; ".join(lines) if lines else type(exc).__name__


# Flags after which the config Hydra runs is not the one composed here (another primary
# config or folder), or nothing runs at all.
_OWN_COMPOSITION_FLAGS = {"--config-name", "-cn", "--config-dir", "-cd", "--package", "-p", "--info", "-i",
                          "--hydra-help", "--experimental-rerun"}
_NO_WRITE_FLAGS = {"--cfg", "-c", "--help", "--hydra-help", "--info", "-i", "--shell-completion", "-sc"}


def run_hydra(config_name: str, task: Task, args: Sequence[str], prog: str) -> None:
    """Run `task(cfg)` as a Hydra app over `args` (overrides, `-m`, `--cfg job`, ...).

    Every job's config is composed and checked first, and its output folder tried for
    writing, so a bad value fails in one line before any job starts (and before Hydra
    creates its own folders, whose failure would be a traceback).
    """
    import hydra

    flags, overrides = split_args(args)
    names = {f.partition("=")[0] for f in flags}
    modes = [group[0] for group in _HYDRA_MODES if names & set(group)]
    if len(modes) > 1:
        raise AdvbenchError(f"{' and '.join(modes)} cannot be combined (Hydra runs one mode at a time); "
                            f"to see a sweep's config, drop -m and give one value per swept key")
    if names & _OWN_COMPOSITION_FLAGS:
        check_overrides(overrides)
    else:
        combos = _first_choices(overrides) if names & {"-m", "--multirun"} else [list(overrides)]
        for combo in combos:
            cfg = compose_config(config_name, combo)
            if not names & _NO_WRITE_FLAGS:
                check_writable(cfg)

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
    """Inside a Hydra job: check the config, run; a user-facing error becomes one line and exit 1."""
    try:
        validate(cfg)
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
    which writes only there.
    """
    keys = [k for k in ("out_dir", "records_dir") if cfg.get(k)] or [k for k in ("cache_dir",) if cfg.get(k)]
    for key in keys:
        folder = Path(str(cfg[key])).expanduser()
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=folder):
                pass
        except OSError as exc:
            raise AdvbenchError(f"{key} '{folder}' is not a writable folder: {exc.strerror or exc}") from None


# ---- value checks -------------------------------------------------------------------------

Check = Callable[[str, Any], None]
_MAX_BUDGET = 1e6  # no two images in [0, 1] with fewer than 1e12 values are further apart


def _whole(low: int, nullable: bool = False) -> Check:
    def check(key: str, value: Any) -> None:
        if value is None and nullable:
            return
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise AdvbenchError(f"{key} must be a whole number >= {low}{' or null' if nullable else ''}, "
                                f"got {value!r}")
    return check


def _real(low: float, high: float, *, open_low: bool = True, nullable: bool = False, why: str = "") -> Check:
    def check(key: str, value: Any) -> None:
        if value is None and nullable:
            return
        number = value if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan
        inside = (low < number if open_low else low <= number) and number <= high
        if not (math.isfinite(number) and inside):
            span = f"{'(' if open_low else '['}{low:g}, {high:g}]"
            raise AdvbenchError(f"{key} must be a number in {span}{' or null' if nullable else ''}{why}, "
                                f"got {value!r}")
    return check


def _flag(key: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise AdvbenchError(f"{key} must be true or false, got {value!r}")


def _amplitudes(key: str, value: Any) -> None:
    """A non-empty list of pixel amplitudes in (0, 1] (0, the unperturbed level, is allowed too)."""
    levels = list(value) if isinstance(value, ListConfig) else []
    if not levels:
        raise AdvbenchError(f"{key} must be a non-empty list of amplitudes in (0, 1], e.g. {key}=[0.02,0.04]; "
                            f"got {_plain(value)!r}")
    for level in levels:
        if isinstance(level, bool) or not isinstance(level, (int, float)) or not 0 <= level <= 1:
            raise AdvbenchError(f"{key}: amplitude must be in (0, 1], got {level!r}")
    if max(levels) == 0:
        raise AdvbenchError(f"{key} needs an amplitude above 0 (0 is the unperturbed level), got {_plain(value)!r}")


def _batch_size(key: str, value: Any) -> None:
    """A whole number >= 1, or `auto` (`advbench.runtime.batch_size`)."""
    if value != "auto" and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise AdvbenchError(f"{key} must be a whole number >= 1 or auto, got {value!r}")


def _plain(value: Any) -> Any:
    return OmegaConf.to_container(value) if isinstance(value, ListConfig) else value


def _perturbation(key: str, value: Any) -> None:
    """A UAP file given on the command line must load (shape, range) before metrics are built."""
    if value is not None:
        from advbench.iqa.uap import load_uap

        load_uap(value)


def _positive_list(key: str, value: Any) -> None:
    items = list(value) if isinstance(value, ListConfig) else []
    if not items or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
                            for v in items):
        raise AdvbenchError(f"{key} must be a non-empty list of positive numbers, got {_plain(value)!r}")


def _gate_threshold(key: str, value: Any) -> None:
    """The same check as `advbench check` applies to its options, so both say the same."""
    check_fraction(key, value, nullable=True)


DEFENSE_CATEGORIES = ("natural training", "robust training", "input transformation", "randomization", "ensemble",
                      "certified")
"""The seed's defense categories (Table 1); a defense YAML's `category:` lists one or more."""


def _categories(key: str, value: Any) -> None:
    values = list(value) if isinstance(value, ListConfig) else [value]
    bad = [str(v) for v in values if v not in DEFENSE_CATEGORIES]
    if bad or not values:
        raise AdvbenchError(f"{key} must list categories of {', '.join(DEFENSE_CATEGORIES)}; got {_plain(value)!r}")


def _name(key: str, value: Any) -> None:
    safe_name(value, key)


def _one_of(*valid: str) -> Check:
    def check(key: str, value: Any) -> None:
        if value not in valid:
            raise AdvbenchError(f"unknown {key} '{value}'; valid: {', '.join(valid)}")
    return check


def _search_method(key: str, value: Any) -> None:
    from advbench.engine import SEARCH_METHODS  # imported here: the engine imports this module

    _one_of(*SEARCH_METHODS)(key, value)


_SIMPLE = {int: "a whole number", float: "a number", bool: "true or false", str: "text", type(None): "null"}


def _accepts(kind: type, value: Any) -> bool:
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def _check_arguments(key: str, node: Any) -> None:
    """Values handed to a `_target_` must have the simple types its signature annotates.

    A wrong type would otherwise surface as a TypeError deep inside the constructor
    ("'<' not supported between 'str' and 'int'"); annotations that are not plain
    int/float/bool/str (or Optional of them) are left to the constructor.
    """
    if not isinstance(node, DictConfig) or not isinstance(node.get("_target_"), str):
        return
    from hydra.utils import get_object

    try:
        target = get_object(node._target_)
        hints = typing.get_type_hints(target.__init__ if isinstance(target, type) else target)
    except Exception:  # an unknown target or unresolvable annotation: Hydra and the constructor report it
        return
    for name, value in node.items():
        hint = hints.get(str(name))
        kinds = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
        if hint is None or not all(k in _SIMPLE for k in kinds) or isinstance(value, (DictConfig, ListConfig)):
            continue
        if not any(_accepts(k, value) for k in kinds):
            expected = " or ".join(_SIMPLE[k] for k in kinds)
            raise AdvbenchError(f"{key}.{name} must be {expected}, got {value!r}")


CHECKS: dict[str, Check] = {
    # names that become file or folder names
    "dataset.name": _name, "model.name": _name, "defense.name": _name, "attack.name": _name, "metric.name": _name,
    "defense.category": _categories,
    "substitute.model.name": _name, "substitute.defense.name": _name,  # a substitute's cached checkpoint
    "substitute.fallback.model.name": _name, "substitute.fallback.defense.name": _name,
    "substitute.seed": _whole(0, nullable=True), "substitute.fallback.seed": _whole(0, nullable=True),
    # advbench run / train
    "seed": _whole(0),
    "batch_size": _batch_size,
    "precision": _one_of(*PRECISIONS),
    "channels_last": _flag,
    "chunk_size": _whole(1),
    "threads": _whole(1, nullable=True),
    "threat.norm": _one_of(*NORMS), "threat.goal": _one_of(*GOALS), "threat.knowledge": _one_of(*KNOWLEDGE),
    "threat.steps": _whole(1, nullable=True),  # iterations of BIM/MIM/DIM/TI under transfer threats
    "shard.index": _whole(0),
    "shard.count": _whole(1),
    "force": _flag,
    "dataset.n_samples": _whole(1, nullable=True),
    "threat.eps": _real(0, _MAX_BUDGET, nullable=True,
                        why=" (null: the data set's budget)"),
    "judge.draws": _whole(1),
    "search.enabled": _flag,
    "search.resolution": _real(0, 1, why=" (a fraction of the budget)"),
    "search.max_factor": _real(1, _MAX_BUDGET, open_low=False, why=" (a multiple of the budget)"),
    "search.max_probes": _whole(0),
    "search.method": _search_method,
    "gate.min_accuracy": _gate_threshold, "gate.max_asr": _gate_threshold, "gate.min_certified": _gate_threshold,
    # advbench uap train | eval | stability
    "subset": _whole(1, nullable=True),
    "n_images": _whole(1, nullable=True),
    "size": _whole(1),
    "max_frames": _whole(1, nullable=True),
    "progress": _flag,
    "csf": _flag,
    "amplitudes": _amplitudes,
    "perturbation": _perturbation,
    "bitrates_kbps": _positive_list,
    "validate.amplitudes": _amplitudes,
    "validate.n_images": _whole(1, nullable=True),
    "uap.size": _whole(1),
    "uap.epochs": _whole(1),
    "uap.batch_size": _whole(1),
    "uap.lr": _real(0, math.inf),
    "uap.clamp": _real(0, 1),
    "madc.steps": _whole(1),
    "madc.lr": _real(0, math.inf),
}
"""Checks of the keys a composed config may hold, applied to those it does hold."""

_ABSENT = object()


def validate(cfg: DictConfig) -> None:
    """Value checks Hydra cannot do (types, ranges, file-name safety), before any work starts."""
    for key, check in CHECKS.items():
        value = OmegaConf.select(cfg, key, default=_ABSENT)
        if value is not _ABSENT:
            check(key, value)
    if cfg.get("batch_size") == "auto" and "attack" not in cfg:
        raise AdvbenchError("batch_size=auto applies to advbench run only; give a whole number >= 1")
    shard = cfg.get("shard")
    if shard is not None and not shard.index < shard.count:
        raise AdvbenchError(f"shard.index must be below shard.count (0..{shard.count - 1}), got {shard.index}")
    for key in ("dataset", "attack.params", "metric"):
        _check_arguments(key, OmegaConf.select(cfg, key))
    params = OmegaConf.select(cfg, "attack.params")
    if params is not None:
        _check_attack(cfg.attack.get("name", "attack"), params)


def _check_attack(name: str, params: DictConfig) -> None:
    """Build the attack once (cheap, no model) so its own argument checks run up front."""
    from hydra.utils import instantiate

    try:
        instantiate(params)
    except Exception as exc:  # the constructor's ValueError/TypeError, wrapped by Hydra
        cause = user_error(exc)
        if cause is not None:
            raise cause from None
        root = exc
        while root.__cause__ is not None:
            root = root.__cause__
        raise AdvbenchError(f"bad attack.params for '{name}': {_one_line(root)}") from None
