"""Every attack option refuses a bad hyperparameter at construction, with one AdvbenchError line naming it.

Parametrised over the catalogue (conf/attack/*.yaml): each option's `_target_` is built from its
default params, then from those defaults with one param replaced by a bad value chosen from the
default's type (0 and -1 for counts, 0, -1, NaN and infinities for positive numbers, text and
None for either, 1.5 for fractions, ...). Values that some params legitimately take (0 for a
margin, a seed of -1) are listed in ALLOWED with the reason.
"""

from __future__ import annotations

import copy
import functools
import importlib
import math
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from advbench.cli.option_targets import MEMBER_BUILDER, member_attack
from advbench.core.errors import AdvbenchError
from advbench.robustness.attacks.gradient import PGD
from advbench.robustness.attacks.score import Square

CONF = Path(__file__).resolve().parents[1] / "conf" / "attack"
OPTIONS = sorted(p.stem for p in CONF.glob("*.yaml"))

ALLOWED: dict[str, tuple[set[Any], str]] = {
    "seed": ({0, -1}, "any whole number is a seed"),
    "n_target_classes": ({0}, "0 target classes is plain APGD-CE/DLR"),
    "confidence": ({0.0}, "a margin of 0 is C&W's default; only negative margins are bad"),
    "init_std": ({0.0}, "NATTACK may start from mu = 0 exactly"),
    "prob": ({0.0}, "prob 0 turns diverse inputs off (TI's default)"),
    "decay": ({0.0, None}, "decay 0 or null is momentum off"),
    "overshoot": ({0.0}, "DeepFool without overshoot"),
    "adam_beta1": ({0.0}, "Adam betas live in [0, 1)"),
    "adam_beta2": ({0.0}, "Adam betas live in [0, 1)"),
    "alpha": ({0.0}, "ALMA's averages live in [0, 1): 0 takes each new multiplier and squared gradient as is"),
    "logit_tolerance": ({0.0}, "ALMA's constraint may ask for no margin beyond a tie"),
    "alpha_max": ({0.0}, "FAB with alpha_max 0 steps from the iterate's projection alone"),
    "final_search": ({0}, "FAB without a final search is AutoAttack's FAB"),
}
"""Param name -> values among the generic bad ones that the param legitimately takes, and why."""

EXTRA_BAD: dict[str, list[Any]] = {
    "p_init": [1.5], "rho": [1.5], "momentum": [1.5], "search_scale": [1.5], "c_c": [1.5], "c_cov": [1.5],
    "resize_rate": [1.5], "prob": [1.5], "adam_beta1": [1.0], "adam_beta2": [1.0],
    "step_adaptation": [1.0, 0.5],
}
"""Param name -> bad values beyond the generic ones (upper ends of ranges, lower ends above 0)."""

EXTRA_BAD_BY_OPTION: dict[tuple[str, str], list[Any]] = {
    ("evolutionary", "coordinates"): [1.5],  # a fraction of the search space there, a count in ZOO
    ("nattack", "samples"): [1],             # standardised rewards need two draws
    ("deepfool", "candidates"): [1],         # the label and one other class
    ("alma", "alpha"): [1.0],                # an average that never moves
    ("alma", "lr_reduction"): [1.5],         # the step size decays, never grows
    ("alma", "tau"): [1.5],                  # an improvement is a fall of the constraint
    ("alma", "gamma"): [0.5],                # the penalty parameter grows, never shrinks
}


NAMED = {"members": "member"}
"""Param name -> the words its messages name it by, where not the name itself."""


def defaults(option: str) -> tuple[type, dict[str, Any]]:
    """The option's attack class and its default params, interpolations resolved (seed 0, no threat)."""
    cls, params = _defaults(option)
    return cls, copy.deepcopy(params)


@functools.cache
def _defaults(option: str) -> tuple[type, dict[str, Any]]:
    root = OmegaConf.create({"seed": 0, "attack": OmegaConf.load(CONF / f"{option}.yaml")})
    params = OmegaConf.to_container(root.attack.params, resolve=True)
    assert isinstance(params, dict)
    module, _, name = str(params.pop("_target_")).rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    if MEMBER_BUILDER in cls.hyperparameters:  # an ensemble builds its members as a run does
        params[MEMBER_BUILDER] = member_attack
    return cls, params


def bad_values(option: str, name: str, default: Any) -> list[Any]:
    """Bad values for a param, by the type of its default, less those ALLOWED."""
    if isinstance(default, bool):
        generic: list[Any] = ["yes", 1, None]
    elif isinstance(default, int):
        generic = [0, -1, 2.5, "3", None, True]
    elif isinstance(default, float):
        generic = [0.0, -1.0, math.nan, math.inf, -math.inf, "0.1", None, True]
    elif isinstance(default, str):
        generic = ["nope", 3, None]
    elif isinstance(default, list) and all(isinstance(v, int) for v in default) and default:
        generic = [[0], [1000, -1], [2.5], "1000", 5]
    elif isinstance(default, list):
        generic = [[], ["nope"]]
    else:
        return []
    allowed = ALLOWED.get(name, (set(), ""))[0]
    keep = [v for v in generic if not ((v is None or isinstance(v, (int, float))) and not isinstance(v, bool) and v in allowed)]
    return keep + EXTRA_BAD.get(name, []) + EXTRA_BAD_BY_OPTION.get((option, name), [])


CASES = [(option, name, value) for option in OPTIONS for name, default in defaults(option)[1].items()
         for value in bad_values(option, name, default)]


def refused(make: Any, name: str) -> str:
    with pytest.raises(AdvbenchError) as err:
        make()
    message = str(err.value)
    assert "\n" not in message and NAMED.get(name, name) in message, message
    return message


def test_the_catalogue_is_covered() -> None:
    assert {"pgd", "square", "apgd_ce", "cw", "zoo", "ensemble"} <= set(OPTIONS)
    assert {option for option, _, _ in CASES} == set(OPTIONS) - {"fgsm"}  # fgsm's option sets no params


@pytest.mark.parametrize("option", OPTIONS)
def test_defaults_construct(option: str) -> None:
    cls, params = defaults(option)
    attack = cls(**params)
    for name, value in attack.params().items():
        if params.get(name) is not None:  # member_params: null is kept as {}
            assert value == params[name], name


@pytest.mark.parametrize(("option", "name", "value"), CASES,
                         ids=[f"{o}-{n}-{v!r}" for o, n, v in CASES])
def test_bad_hyperparameter_is_one_advbench_error_line(option: str, name: str, value: Any) -> None:
    cls, params = defaults(option)
    refused(lambda: cls(**{**params, name: value}), name)


@pytest.mark.parametrize("value", [0, -1, 4, 2.5, "3"])
def test_ti_kernel_size_must_be_odd_and_whole(value: Any) -> None:
    cls, params = defaults("ti")
    refused(lambda: cls(**{**params, "kernel_size": value}), "kernel_size")


def test_pgd_steps_0_and_square_n_queries_0() -> None:
    assert refused(lambda: PGD(steps=0), "steps") == "PGD: steps must be a whole number >= 1, got 0"
    assert refused(lambda: Square(n_queries=0), "n_queries") == "Square: n_queries must be a whole number >= 1, got 0"
    assert "got nan" in refused(lambda: PGD(rel_stepsize=math.nan), "rel_stepsize")


def test_valid_values_stay_as_given() -> None:
    """The checks hand back nothing new: params() holds the very values passed."""
    pgd = PGD(steps=3, rel_stepsize=0.25, seed=-1)
    assert pgd.params() == {"steps": 3, "rel_stepsize": 0.25, "random_init": True, "decay": None, "seed": -1}
