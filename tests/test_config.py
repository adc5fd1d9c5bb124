"""Every YAML in every config group composes, and its `_target_` accepts its keys.

Parametrised over the files on disk, so a new option is checked without touching this file.
"""

from __future__ import annotations

import inspect

import pytest
from hydra.utils import get_method, get_object
from omegaconf import OmegaConf

from advbench.cli.config import compose_config
from advbench.core.catalog import group_options, groups

PRIMARY = {"metric": "uap_train", "uap": "uap_train"}
OPTIONS = [(g, o) for g in groups() for o in group_options(g)]


def _targets(node) -> list[tuple[str, dict]]:
    """All `_target_` nodes in a (plain) config tree with their keyword arguments."""
    found = []
    if isinstance(node, dict):
        if "_target_" in node:
            found.append((node["_target_"], {k: v for k, v in node.items() if not str(k).startswith("_")}))
        for value in node.values():
            found.extend(_targets(value))
    return found


@pytest.mark.parametrize(("group", "option"), OPTIONS, ids=[f"{g}/{o}" for g, o in OPTIONS])
def test_option_composes_and_targets_accept_their_keys(group: str, option: str) -> None:
    root, _, key = group.rpartition("/")  # iqa/attack: the `attack` group of the `iqa` config
    primary = root or PRIMARY.get(group, "train" if group in ("defense",) else "config")
    extra = ["dataset.root=/data"] if group == "dataset" and option in ("cifar10", "imagenet", "folder") else []
    extra += ["data=/data"] if (group, option) == ("iqa/experiment", "iqa_msu") else []
    cfg = compose_config(primary, [f"{key}={option}", *extra])
    assert cfg.get(key) is not None or key == "experiment"
    node = OmegaConf.to_container(cfg if key == "experiment" else cfg[key], resolve=True)
    for target, kwargs in _targets(node):
        obj = get_object(target) if "." in target else get_method(target)
        sig = inspect.signature(obj)
        accepts_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values())
        if not accepts_any:
            unknown = set(kwargs) - set(sig.parameters)
            assert not unknown, f"{group}/{option}: {target} does not take {sorted(unknown)}"


@pytest.mark.parametrize("option", group_options("attack"))
def test_attack_options_instantiate(option: str) -> None:
    from advbench.cli.option_targets import construct
    from advbench.robustness.attacks.attack_contract import Attack

    cfg = compose_config("config", [f"attack={option}"])
    assert isinstance(construct(OmegaConf.to_container(cfg.attack.params, resolve=True)), Attack)
    assert cfg.attack.name == option and cfg.attack.description


def test_every_option_has_a_description() -> None:
    from advbench.core.catalog import describe

    missing = [f"{g}/{o}" for g, o in OPTIONS if g not in ("hydra",) and not describe(g, o)]
    assert not missing, f"options without a one-line description: {missing}"


def test_default_budgets_follow_the_seed() -> None:
    cifar = compose_config("config", ["dataset=cifar10", "dataset.root=/x"]).dataset.budgets
    imagenet = compose_config("config", ["dataset=imagenet", "dataset.root=/x", "model=inception_v3"]).dataset.budgets
    assert cifar.linf == pytest.approx(8 / 255) and cifar.l2 == pytest.approx(1.0)
    assert imagenet.linf == pytest.approx(16 / 255) and imagenet.l2 == pytest.approx(0.001 ** 0.5)
    assert imagenet.l2_normalized is True
