"""The Python API's run config as plain data: its arguments' option files and values, Hydra only for overrides.

`advbench.evaluate` names options (data set, model, defense, attack, threat) and values (seed,
ε, the attack's parameters, ...); `advbench.evaluate_metric` does the same for `advbench iqa run`'s
primary `iqa` (metric, attack, defense). Hydra's composition of them took about 0.1 s a call, most of
an evaluation's fixed cost, and its import a further share of the API's; the same config is
the primary config's own keys with each chosen option's YAML under its group (a
defense's `defaults:` list of its own group's options merged first, as Hydra does), the
values set on it as an override sets them, then resolved once and checked as the command line
checks its composition (`checked`). A group in the primary's own folder (`conf/iqa/attack`) shadows
conf/'s of that name, as it does on the command line. `tests/test_api_config.py` and
`tests/test_api_metric_config.py` check that both give the same config. Hydra composes the
options only where the caller's `overrides` or an option need its composition (a `defaults:` entry
naming another group, a package header), from the choices and those overrides alone: the values are
set on what it composes, never written into override strings; an override wins over a value.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf

from advbench.cli.options import unknown_key, warn_hidden
from advbench.cli.validate import check_composed
from advbench.core.catalog import conf_dir, config_root, option_file, override_key

PRIMARY = "config"


def api_config(choices: Mapping[str, str], values: Mapping[str, Any], overrides: Sequence[str] = (), *,
               primary: str = PRIMARY) -> dict[str, Any]:
    """The run config of primary config `primary` (`"config"`: `advbench run`'s, `"iqa"`: `advbench
    iqa run`'s) and group `choices` (`{"attack": "pgd", ...}`) with `values` (`{"seed": 0,
    "attack.params.steps": 10, ...}`) set, as plain data, checked as the command line checks its own."""
    warn_hidden()  # the user's options the shipped ones hide, as a command line run says them
    parsed = _plain_overrides(overrides, choices, primary)
    tree = None if parsed is None else _assembled(primary, {**choices, **parsed[0]})
    if tree is not None and all(unknown_key(tree, key) is None for key in parsed[1]):  # else a key Hydra adds
        return checked(with_values(tree, {**values, **parsed[1]}))
    from advbench.cli.config import compose_config  # Hydra: only for what the assembly does not handle

    composed = compose_config(primary, [*(f"{group}={option}" for group, option in choices.items()), *overrides],
                              check=False)
    return checked(with_values(OmegaConf.to_container(composed), values, overrides))


def with_values(tree: Mapping[str, Any], values: Mapping[str, Any], overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Config `tree` (as written) with `values` set at their dotted keys as an override sets one (a mapping
    merged into a mapping, any other value in place), but for the keys `overrides` set: the caller's last
    word. A key `tree` lacks is one line (`options.unknown_key`)."""
    said = {override_key(str(o)) for o in overrides}
    out = copy.deepcopy(dict(tree))
    for key, value in ((k, v) for k, v in values.items() if k not in said):
        error = unknown_key(out, key)
        if error is not None:
            raise error
        *path, leaf = key.split(".")
        node = functools.reduce(lambda n, p: n[p], path, out)
        node[leaf] = _merged(node[leaf], _plain(value))
    return out


def checked(tree: Mapping[str, Any]) -> dict[str, Any]:
    """Config `tree` (as written, values set) resolved once and checked as the command line checks its
    composition (`validate.check_composed`), as plain data."""
    cfg = OmegaConf.create(dict(tree))
    check_composed(cfg)
    return OmegaConf.to_container(cfg)


def _merged(old: Any, new: Any) -> Any:
    """`new` over `old` as OmegaConf merges: mappings key by key, any other value replaced."""
    if not (isinstance(old, Mapping) and isinstance(new, Mapping)):
        return copy.deepcopy(new)
    return {**old, **{k: _merged(old[k], v) if k in old else copy.deepcopy(v) for k, v in new.items()}}


def _assembled(primary: str, choices: Mapping[str, str]) -> dict[str, Any] | None:
    """The composed config (as written) without Hydra, or None where only Hydra's composition would do."""
    groups = _primary_groups(primary)
    picked = {**groups, **choices}
    options = {group: _option(primary, group, str(option)) for group, option in picked.items()}
    if any(v is None for v in options.values()) or set(picked) - set(groups):
        return None
    own = {k: v for k, v in _yaml(_primary_file(primary)).items() if k not in ("defaults", "hydra")}
    return {**options, **own}


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


def _option(primary: str, group: str, option: str) -> dict[str, Any] | None:
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
    return functools.reduce(_merged, [*parents, data])


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
