"""Option YAML as resolved configs: the `${advbench:cache|data|weights}` folders and single options.

The command line is the one reader of Hydra's configs; this module registers the resolver the
shipped YAML uses for advbench's folders (`advbench.core.paths.location`) and loads one option
outside a composition (a recipe's `init:` defense, an Ens-AT static model, a metric by name).
"""

from __future__ import annotations

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from advbench.core.catalog import option_file
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
