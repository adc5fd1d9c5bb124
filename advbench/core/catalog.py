"""The option catalogue: `conf/` and its groups, one YAML file per option, then the user's own.

Every reader of option files goes through here, so the halves and the command line agree on
what an option is and how it describes itself (`advbench list`, the generated doc tables).
The user's option folders (`ADVBENCH_CONF`, laid out as conf/: `attack/mine.yaml`) are searched
after conf/, here and by Hydra (`advbench.cli.config.with_user_conf`), so an option of one's own
is one YAML file outside the package; a name conf/ already has stays the shipped option, and
the user's file it hides is said (`hidden_user_options`).
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from advbench.core.errors import AdvbenchError, first_line

_HYDRA_GROUPS = {"hydra"}
CONFIG_ROOTS = {"iqa": "iqa"}
"""Primary configs whose groups of their own sit in a folder of conf/ (`conf/iqa/attack`: attacks on
metrics, which share the name `attack` with the classifier attacks); their config searches conf/ after it."""


def conf_dir() -> Path:
    """The folder holding the shipped YAML groups (source checkout or installed package).

    Found by name, not imported: the catalogue is data, and an import of `advbench.conf`
    would make the lowest layer import the package root."""
    spec = importlib.util.find_spec("advbench.conf")
    if spec is None or spec.origin is None:
        raise AdvbenchError("the shipped option catalogue (package advbench.conf) is missing; reinstall advbench")
    return Path(spec.origin).resolve().parent


USER_CONF = "ADVBENCH_CONF"
"""Environment variable: the user's option folders (separated by os.pathsep), searched after conf/."""


def user_conf_dirs() -> list[Path]:
    """The folders `ADVBENCH_CONF` names, in order; an error for one that is not a folder."""
    dirs = [Path(entry).expanduser().resolve() for entry in os.environ.get(USER_CONF, "").split(os.pathsep) if entry]
    for folder in dirs:
        if not folder.is_dir():
            raise AdvbenchError(f"{USER_CONF} names '{folder}', which is not a folder of options (attack/NAME.yaml ...)")
    return list(dict.fromkeys(dirs))


def hidden_user_options() -> list[tuple[str, Path]]:
    """The user's option files (with their group) that a shipped option of the same name hides: conf/ is
    searched first, by the catalogue and by Hydra alike, so such a file is never chosen."""
    found = []
    for folder in user_conf_dirs():
        for path in sorted(folder.glob("*/*.yaml")) + sorted(folder.glob("iqa/*/*.yaml")):
            group = path.parent.relative_to(folder).as_posix()
            if (conf_dir() / group / path.name).is_file():
                found.append((group, path))
    return found


def search_dirs() -> list[Path]:
    """Where options are looked up, first match wins: conf/, then the user's folders."""
    return [conf_dir(), *user_conf_dirs()]


def config_root(config_name: str) -> Path:
    """The folder holding a primary config and the groups only it has (conf/ for most)."""
    sub = CONFIG_ROOTS.get(config_name)
    return conf_dir() / sub if sub else conf_dir()


def group_options(group: str, root: Path | None = None) -> list[str]:
    """Option names of a config group: one YAML file per option, in `root` or in every searched folder."""
    folders = [root] if root is not None else search_dirs()
    return sorted({p.stem for folder in folders for p in (folder / group).glob("*.yaml")})


def groups(root: Path | None = None) -> list[str]:
    """The config groups of a folder; for conf/ itself also those of its config roots, as `iqa/attack`."""
    base = root or conf_dir()
    found = [p.name for p in base.iterdir() if p.is_dir() and not p.name.startswith(("_", "."))
             and p.name not in _HYDRA_GROUPS]
    if root is None:
        found = [g for g in found if g not in CONFIG_ROOTS.values()]
        found += [f"{sub}/{g}" for sub in CONFIG_ROOTS.values() for g in groups(base / sub)]
    return sorted(found)


def option_file(group: str, option: str) -> Path | None:
    """The YAML file of one option, the first in the searched folders; None when the group has no such option."""
    paths = (folder / group / f"{option}.yaml" for folder in search_dirs())
    return next((path for path in paths if path.is_file()), None)


def option_data(group: str, option: str) -> dict[str, Any] | None:
    """One option's YAML as written (interpolations unresolved); None when the group has no such option.

    For what an option says of itself (a defense's category, an attack's parameters); a config
    that must be resolved is composed above, by the command line (`advbench.cli.options`).
    """
    path = option_file(group, option)
    return None if path is None else read_option(path)


def read_option(path: Path) -> dict[str, Any]:
    """An option file's keys, or one line naming the file and what is wrong with it."""
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise invalid_yaml(exc, path) from None
    if not isinstance(data, dict):
        raise AdvbenchError(f"option file '{path}' is invalid: not a mapping of keys")
    return data


def invalid_yaml(exc: yaml.YAMLError, path: Path | str | None = None) -> AdvbenchError:
    """One line for a file the YAML parser refused (the parser's own message runs over several): the file,
    the line and what the parser expected there. `path` defaults to the file the parser names."""
    mark, context = getattr(exc, "problem_mark", None), getattr(exc, "context_mark", None)
    path = path or (mark.name if mark is not None else "?")
    at = f", line {mark.line + 1}" if mark is not None else ""
    problem = getattr(exc, "problem", None) or first_line(exc)
    opened = f" ({exc.context} from line {context.line + 1})" \
        if context is not None and getattr(exc, "context", None) else ""
    return AdvbenchError(f"option file '{path}' is not valid YAML{at}: {problem}{opened}")


def describe(group: str, option: str) -> str:
    """The option's `description:` key, else the first comment line of its YAML file.

    A comment serves options whose keys all go to a `_target_` (datasets, models, metrics),
    where an extra `description` key would be passed to the constructor.
    """
    path = option_file(group, option)
    if path is None:
        raise AdvbenchError(f"unknown {group} '{option}'; valid: {', '.join(group_options(group))}")
    text, data = path.read_text(), read_option(path)
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


_OVERRIDE_KEY = re.compile(r"^(?:\+\+|\+|~)?([^=@]+)")


def override_key(override: str) -> str:
    """The dotted key an override string sets, adds or deletes (`+a.b=1`, `~a.b`, `a@pkg=x` -> `a.b`, `a`)."""
    match = _OVERRIDE_KEY.match(str(override).strip())
    return match.group(1).strip() if match else ""


def keywords_said(keys: dict[str, str], given: dict[str, Any], attack_params: Any = None) -> dict[str, str]:
    """For `refuse_twice_set`: the config key each keyword given (not None) sets (`keys`: keyword -> key)
    and how the caller said it; an `attack_params` dict sets one key per entry (`attack.params.<name>`)."""
    said = {keys[name]: f"{name}={value!r}" for name, value in given.items() if value is not None}
    if isinstance(attack_params, dict):
        said.update({f"attack.params.{k}": f"attack_params[{k!r}]={v!r}" for k, v in attack_params.items()})
    return said


def refuse_twice_set(said: dict[str, str], overrides: Sequence[str]) -> None:
    """An error where an override sets what a keyword argument already set: the caller asked for two things,
    and the override would win without a word.

    `said`: each config key a keyword set (`"attack"` for a group's option, `"threat.eps"`, ...) and how
    the caller said it (`"attack='fgsm'"`). A key clashes with itself and with the keys under it
    (`attack.params={...}` and `attack_params={'steps': 10}`), except that choosing a group's option
    (`attack=pgd`) leaves its values (`attack.params.steps=`), which apply to whichever option is chosen.
    """
    options = {group.rpartition("/")[2] for group in groups()}

    def under(key: str, parent: str) -> bool:
        return key.startswith(f"{parent}.") and parent not in options

    for override in [overrides] if isinstance(overrides, str) else overrides:
        key = override_key(override)
        for given, how in said.items():
            if key == given or under(key, given) or under(given, key):
                raise AdvbenchError(f"{how} and override '{override}' both set {given}: give it once")
