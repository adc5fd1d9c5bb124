"""Option YAML as resolved configs: the `${advbench:cache|data|weights}` folders, single options,
and the user's option folders on Hydra's search path.

The command line is the one reader of Hydra's configs; this module registers the resolver the
shipped YAML uses for advbench's folders (`advbench.core.paths.location`), loads one option
outside a composition (a recipe's `init:` defense, an Ens-AT static model, a metric by name)
and hands Hydra the folders of `ADVBENCH_CONF` (`with_user_conf`), saying which of their files a
shipped option of the same name hides (`warn_hidden`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from advbench.core.catalog import USER_CONF, conf_dir, hidden_user_options, option_file, user_conf_dirs
from advbench.core.errors import AdvbenchError
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
