"""The Python API's run config: composed from its arguments' option files, Hydra only for overrides.

`advbench.evaluate` names options (data set, model, defense, attack, threat) and values (seed,
ε, the attack's parameters, ...); `advbench.evaluate_metric` does the same for `advbench iqa run`'s
primary `iqa` (metric, attack, defense). Hydra's composition of them took about 0.1 s a call, most of
an evaluation's fixed cost, and its import a further share of the API's; the same config is
the primary config's own keys with each chosen option's YAML under its group (a
defense's `defaults:` list of its own group's options merged first, as Hydra does) and the
values set on top. A group in the primary's own folder (`conf/iqa/attack`) shadows conf/'s of
that name, as it does on the command line. `tests/test_api_config.py` and
`tests/test_api_metric_config.py` check that both give the same config.
Anything else goes through Hydra (`advbench.cli.config.compose_config`) with the values as
override strings, so the command line's syntax, messages and checks stay the only ones:
`overrides` strings, an option this assembly does not handle (a `defaults:` entry naming
another group, a package header), or a value for a key the config lacks.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf

from advbench.cli.options import warn_hidden
from advbench.cli.validate import check_composed
from advbench.core.catalog import conf_dir, config_root, option_file

PRIMARY = "config"


def api_config(choices: Mapping[str, str], values: Mapping[str, Any], overrides: Sequence[str] = (), *,
               primary: str = PRIMARY) -> DictConfig:
    """The run config of primary config `primary` (`"config"`: `advbench run`'s, `"iqa"`: `advbench
    iqa run`'s) and group `choices` (`{"attack": "pgd", ...}`) with `values` (`{"seed": 0,
    "attack.params.steps": 10, ...}`) set, checked as the command line checks its own."""
    warn_hidden()  # the user's options the shipped ones hide, as a command line run says them
    parsed = _plain_overrides(overrides, choices, primary)
    cfg = None if parsed is None else _assembled(primary, {**choices, **parsed[0]}, {**values, **parsed[1]})
    if cfg is None:
        from advbench.cli.config import compose_config  # Hydra: only for what the assembly does not handle

        typed = [f"{group}={option}" for group, option in choices.items()]
        return compose_config(primary, [*typed, *(f"{k}={json.dumps(v)}" for k, v in values.items()), *overrides])
    check_composed(cfg)
    return cfg


def _assembled(primary: str, choices: Mapping[str, str], values: Mapping[str, Any]) -> DictConfig | None:
    """The composed config without Hydra, or None where only Hydra's composition would do."""
    groups = _primary_groups(primary)
    picked = {**groups, **choices}
    options = {group: _option(primary, group, str(option)) for group, option in picked.items()}
    if any(v is None for v in options.values()) or set(picked) - set(groups):
        return None
    own = {k: v for k, v in _yaml(_primary_file(primary)).items() if k not in ("defaults", "hydra")}
    cfg = OmegaConf.create({**options, **own})
    for key, value in values.items():
        if not _holds(cfg, key):
            return None
        OmegaConf.update(cfg, key, _plain(value), merge=True)  # as Hydra applies an override
    OmegaConf.set_struct(cfg, True)  # as Hydra's: a key set by mistake is an error, not a new key
    return cfg


def _plain(value: Any) -> Any:
    """`value` as an override string would give it: a tuple a list, at any depth (OmegaConf merges no
    tuple into a list, and Hydra's parser reads `json.dumps` of one as a list)."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _plain_overrides(overrides: Sequence[str], choices: Mapping[str, str], primary: str) -> tuple[dict, dict] | None:
    """Overrides that choose an option or change a value, parsed by Hydra's own parser (so
    `x=null`, `x=[1,2]`, `x='a b'` mean what they mean on the command line), as (choices,
    values); None when one does anything else (`+x=`, `~x`, a sweep, a package)."""
    if not overrides:
        return {}, {}
    from hydra.core.override_parser.overrides_parser import OverridesParser  # the parser alone, on first use
    from hydra.errors import OverrideParseException

    try:
        parsed = OverridesParser.create().parse_overrides([str(o) for o in overrides])
    except OverrideParseException:  # Hydra's composition says what is wrong, in its words
        return None
    picked: dict[str, str] = {}
    values: dict[str, Any] = {}
    groups = {*choices, *_primary_groups(primary)}
    for override in parsed:
        plain_change = not (override.is_add() or override.is_delete() or override.is_force_add()
                            or override.is_sweep_override() or override.package is not None)
        if not plain_change:
            return None
        key, value = override.key_or_group, override.value()
        if key in groups:
            if not isinstance(value, str):
                return None
            picked[key] = value
        else:
            values[key] = value
    return picked, values


def _holds(cfg: DictConfig, key: str) -> bool:
    """Whether `key` (dotted) is in `cfg`, set or still `???`."""
    parent, _, last = key.rpartition(".")
    node = OmegaConf.select(cfg, parent) if parent else cfg
    return isinstance(node, DictConfig) and last in node.keys()  # `in node` is False for a `???` value


def _primary_file(primary: str) -> Path:
    """The primary config's YAML (`conf/config.yaml`, `conf/iqa/iqa.yaml`)."""
    return config_root(primary) / f"{primary}.yaml"


def _primary_groups(primary: str) -> dict[str, str]:
    """The primary config's groups and their default options (those with one)."""
    entries = [d for d in _yaml(_primary_file(primary))["defaults"] if isinstance(d, dict)]
    return {group: option for d in entries for group, option in d.items() if option is not None}


def _option_path(primary: str, group: str, option: str) -> Path | None:
    """The file Hydra takes for `group=option`: the primary's own folder first (conf/iqa/attack for
    `iqa`), its options alone where it has the group (the command line lists and accepts no other,
    `cli.config.check_overrides`), else the catalogue's (conf/, then the user's folders); None for a
    name that is no file name (`../attack/pgd`), which the command line refuses."""
    if Path(option).name != option:
        return None
    own = config_root(primary) / group
    if own.parent != conf_dir() and own.is_dir():
        return own / f"{option}.yaml" if (own / f"{option}.yaml").is_file() else None
    return option_file(group, option)


def _option(primary: str, group: str, option: str) -> DictConfig | None:
    """One option under its group, after its own `defaults:` (options of the same group, then `_self_`)."""
    path = _option_path(primary, group, option)
    if path is None:
        return None
    data = dict(_yaml(path))
    defaults = data.pop("defaults", ["_self_"])
    if _packaged(path) or not defaults or defaults[-1] != "_self_" \
            or not all(isinstance(d, str) and d != "_self_" for d in defaults[:-1]):
        return None
    parents = [_option(primary, group, d) for d in defaults[:-1]]
    if any(p is None for p in parents):
        return None
    return OmegaConf.merge(*parents, data) if parents else OmegaConf.create(data)


def _yaml(path: Path) -> dict[str, Any]:
    """An option file's YAML, read once per version of the file."""
    return _read(str(path), path.stat().st_mtime_ns)[0]


def _packaged(path: Path) -> bool:
    """Whether an option file has a `# @package` header (Hydra places such an option elsewhere)."""
    return _read(str(path), path.stat().st_mtime_ns)[1]


@functools.lru_cache(maxsize=256)
def _read(path: str, _version: int) -> tuple[dict[str, Any], bool]:
    text = Path(path).read_text()
    return yaml.safe_load(text) or {}, "# @package" in text
