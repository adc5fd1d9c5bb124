"""Every attack on a metric declares its hyperparameters and keeps to them, as the classifier attacks do.

Parametrised over `advbench.core.catalog.group_options("iqa/attack")` (the shipped options and any
in the user's `ADVBENCH_CONF` folders): each option's class declares the valid values of every
constructor argument (`MetricAttack.hyperparameters`, `advbench.core.hyperparameters`), and each
argument is tried at every value its declaration refuses (`Range.bad`), each one an AdvbenchError
of one line naming the attack and the argument. The bad values come from the declarations, so a
new attack or a changed range is tested without a list here to keep in step
(tests/test_attack_declarations.py holds the classifier attacks to the same contract).
"""

from __future__ import annotations

import inspect
import math
from typing import Any

import pytest
import torch
from contract import first_numeric_case
from omegaconf import OmegaConf

import advbench
from advbench.cli.config import compose_config
from advbench.cli.option_targets import target_of
from advbench.core import hyperparameters as hyper
from advbench.core.catalog import group_options, option_file
from advbench.core.errors import AdvbenchError
from advbench.quality.attacks.iterative import IFGSM
from advbench.quality.attacks.metric_attack import MetricAttack

GROUP = "iqa/attack"
OPTIONS = group_options(GROUP)


def yaml_params(option: str) -> tuple[type[MetricAttack], dict[str, Any]]:
    """The option's class and its YAML params, resolved with seed 0."""
    path = option_file(GROUP, option)
    assert path is not None, option
    root = OmegaConf.create({"seed": 0, "attack": OmegaConf.load(path)})
    params = OmegaConf.to_container(root.attack.params, resolve=True)
    assert isinstance(params, dict)
    return target_of(str(params.pop("_target_"))), params


def arguments_of(cls: type[MetricAttack]) -> list[str]:
    return list(inspect.signature(cls).parameters)


def bad_cases() -> list[tuple[str, str, Any]]:
    """(option, argument, refused value) for every constructor argument the option's class takes."""
    cases = []
    for option in OPTIONS:
        cls, _ = yaml_params(option)
        for name in arguments_of(cls):
            cases += [(option, name, value) for value in cls.hyperparameters[name].bad()]
    return cases


CASES = bad_cases()


def refusal(make: Any) -> str:
    with pytest.raises(AdvbenchError) as err:
        make()
    message = str(err.value)
    assert "\n" not in message, message
    return message


@pytest.mark.parametrize("option", OPTIONS)
def test_every_argument_is_declared(option: str) -> None:
    cls, params = yaml_params(option)
    arguments = set(arguments_of(cls))
    assert arguments <= set(cls.hyperparameters), f"{cls.__name__} declares no range for {arguments - set(cls.hyperparameters)}"
    assert set(params) <= arguments


@pytest.mark.parametrize("option", OPTIONS)
def test_the_options_values_build_and_are_kept_as_given(option: str) -> None:
    cls, params = yaml_params(option)
    attack = cls(**params)
    assert {name: getattr(attack, name) for name in params} == params
    assert isinstance(attack.iterations, int) and attack.iterations >= 1


@pytest.mark.parametrize(("option", "name", "value"), CASES, ids=[f"{o}-{n}-{v!r}" for o, n, v in CASES])
def test_a_refused_value_is_one_advbench_error_naming_the_attack_and_it(option: str, name: str, value: Any) -> None:
    cls, params = yaml_params(option)
    message = refusal(lambda: cls(**{**params, name: value}))
    assert message.startswith(f"{cls.__name__}: {name} must be "), message


def test_every_option_with_arguments_has_bad_cases() -> None:
    with_arguments = {o for o in OPTIONS if arguments_of(yaml_params(o)[0])}
    assert with_arguments and {o for o, _, _ in CASES} == with_arguments


def test_the_message_says_what_is_needed_and_what_came() -> None:
    assert refusal(lambda: IFGSM(steps=0)) == "IFGSM: steps must be a whole number >= 1, got 0"
    assert refusal(lambda: IFGSM(alpha=math.inf)) == "IFGSM: alpha must be a finite number > 0, got inf"


@pytest.mark.parametrize("option", OPTIONS)
def test_the_ends_a_range_includes_are_accepted(option: str) -> None:
    """Where a range is closed (decay 0, p_init 1) or optional (None), that value builds and is kept."""
    cls, params = yaml_params(option)
    for name in arguments_of(cls):
        spec = cls.hyperparameters[name]
        good = [None] if spec.optional else []
        if isinstance(spec, hyper.Real):
            good += [end for end, is_open in ((spec.low, spec.open_low), (spec.high, spec.open_high))
                     if end is not None and not is_open]
        elif isinstance(spec, hyper.Whole) and spec.low is not None:
            good.append(spec.low)
        for value in good:
            assert getattr(cls(**{**params, name: value}), name) == value, (name, value)


def _first_numeric_case(option: str) -> tuple[str, Any] | None:
    cls, params = yaml_params(option)
    return first_numeric_case(cls.hyperparameters.get, params)


CLI_CASES = [(o, *case) for o in OPTIONS if (case := _first_numeric_case(o)) is not None]


@pytest.mark.parametrize(("option", "name", "value"), CLI_CASES, ids=[o for o, _, _ in CLI_CASES])
def test_the_command_line_refuses_it_before_any_work(option: str, name: str, value: Any) -> None:
    message = refusal(lambda: compose_config("iqa", ["metric=cnnqa", f"attack={option}",
                                                     f"attack.params.{name}={value!r}"]))
    assert "attack.params" in message and f"{name} must be" in message, message


def test_evaluate_metric_refuses_it_before_any_work(tmp_path) -> None:
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 16 * 16, 1), torch.nn.Flatten(0))
    images = torch.rand(2, 3, 16, 16)
    message = refusal(lambda: advbench.evaluate_metric(net, images, attack="square", attack_params={"n_queries": 0},
                                                       out_dir=tmp_path))
    assert "MetricSquare: n_queries must be a whole number >= 1, got 0" in message
    assert not any(tmp_path.iterdir()), "nothing written"
