"""Option YAML as resolved configs: the `${advbench:cache|data|weights}` folders, single options,
and the user's option folders on Hydra's search path.

The command line is the one reader of Hydra's configs; this module registers the resolver the
shipped YAML uses for advbench's folders (`advbench.core.paths.location`), loads one option
outside a composition (a recipe's `init:` defense, an Ens-AT static model, a metric by name)
and hands Hydra the folders of `ADVBENCH_CONF` (`with_user_conf`), saying which of their files a
shipped option of the same name hides (`warn_hidden`).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from advbench.core.catalog import USER_CONF, conf_dir, hidden_user_options, option_file, user_conf_dirs
from advbench.core.errors import AdvbenchError
from advbench.core.keys import plain
from advbench.core.paths import location

OmegaConf.register_new_resolver("advbench", location, replace=True, use_cache=False)


def load_option(group: str, option: str) -> DictConfig | None:
    """One option's YAML as an unresolved config; None when the group has no such option.

    The one reader of option files as configs outside Hydra's composition, so every caller
    sees the same node and a broken file is the same one-line error everywhere.
    """
    path = option_file(group, option)
    if path is None:
        return None
    try:
        return OmegaConf.load(path)
    except (OmegaConfBaseException, yaml.YAMLError) as exc:
        raise AdvbenchError(f"option file '{path}' is invalid: {str(exc).splitlines()[0]}") from None


def resolved(tree: Mapping[str, Any]) -> dict[str, Any]:
    """A config as written (options' YAML, values set on it) as plain data, every interpolation resolved
    once; a value still `???` or an interpolation that resolves to nothing is one line."""
    try:
        node = OmegaConf.create(plain(tree))
        missing = sorted(OmegaConf.missing_keys(node))
        if missing:
            raise AdvbenchError(f"missing required value(s): {', '.join(missing)}; set them on the command line, "
                                f"e.g. {missing[0]}=...")
        return OmegaConf.to_container(node, resolve=True)
    except (OmegaConfBaseException, ValueError) as exc:
        raise AdvbenchError(str(exc).splitlines()[0]) from None


def resolved_in(config: Mapping[str, Any], **layers: Sequence[Any]) -> dict[str, Any]:
    """Run config `config` (plain, resolved) with each key of `layers` replaced by its layers merged in order
    (an option's YAML as written, then keys over it) and resolved there, where the run's own options are
    (`${dataset.name}`, `${..recipe.x}`): a recipe's `init:` defense, an Ens-AT static model."""
    return resolved({**plain(config), **{key: OmegaConf.merge(*given) for key, given in layers.items()}})


def unknown_key(config: Mapping[str, Any], key: str) -> AdvbenchError | None:
    """Dotted `key` that `config` lacks as "unknown key 'x'; did you mean y?" (difflib, among the keys at the
    level of its first segment `config` lacks); None where `config` holds it."""
    parts = key.split(".")
    node: Any = config
    depth = 0
    while depth < len(parts) - 1 and isinstance(node, Mapping) and parts[depth] in node:
        node, depth = node[parts[depth]], depth + 1
    parent, leaf = ".".join(parts[:depth]), parts[depth]
    if not isinstance(node, Mapping):
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


def with_user_conf(overrides: Sequence[str]) -> list[str]:
    """`overrides` with conf/ and the user's option folders (`ADVBENCH_CONF`) on Hydra's search path,
    after any `hydra.searchpath=[...]` given, so Hydra finds the options `advbench list` lists.

    conf/ comes first because a `hydra.searchpath` override replaces a primary config's own
    (`conf/iqa/iqa.yaml` searches conf/ after conf/iqa/); unchanged when `ADVBENCH_CONF` is unset.
    """
    extra = [f"file://{folder}" for folder in user_conf_dirs()]
    if not extra:
        return list(overrides)
    warn_hidden()
    out, given = [], []
    for ov in overrides:
        key, sep, value = ov.partition("=")
        if sep and key.lstrip("+") == "hydra.searchpath":
            given += [item.strip().strip("'\"") for item in value.strip().strip("[]").split(",") if item.strip()]
        else:
            out.append(ov)
    entries = dict.fromkeys([f"file://{conf_dir()}", *given, *extra])
    return [*out, f"hydra.searchpath=[{','.join(repr(entry) for entry in entries)}]"]


_SAID_HIDDEN: set[Path] = set()
"""The user's option files already said to be hidden by a shipped option, in this process."""


def warn_hidden() -> None:
    """One warning line, once per process, for each option file of the user's that a shipped option of
    its name hides (`catalog.hidden_user_options`): Hydra would ignore it without a word."""
    for group, path in hidden_user_options():
        if path in _SAID_HIDDEN:
            continue
        _SAID_HIDDEN.add(path)
        from advbench.core.resume import warn  # torch: only when there is something to say

        warn(f"{USER_CONF} option '{path}' is ignored: {group}={path.stem} is the shipped option of that name "
             "(shipped options win); rename your file to choose it")
