"""Every catalogue attack declares its hyperparameters and its strength budget, and keeps to them.

Parametrised over `advbench.core.catalog.group_options("attack")` (the shipped options and any
in the user's `ADVBENCH_CONF` folders): each option's class declares the valid values of every
constructor argument (`Attack.hyperparameters`, `advbench.core.hyperparameters`), and each
argument the option's YAML sets is tried at every value its declaration refuses (`Range.bad`:
past each end of its range, NaN and infinities, wrong types, None unless optional), each one
an AdvbenchError of one line naming the argument. The bad values come from the declarations,
so a new attack or a changed range is tested without a list here to keep in step.
tests/test_attack_hyperparameters.py pins the ranges themselves against a list of its own.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from contract import first_numeric_case
from omegaconf import OmegaConf

import advbench
from advbench.cli.config import compose_config
from advbench.cli.option_targets import MEMBER_BUILDER, member_attack, target_of
from advbench.core.catalog import group_options, option_file
from advbench.core.errors import AdvbenchError
from advbench.robustness.attacks.attack_contract import Attack
from advbench.robustness.attacks.gradient import PGD

OPTIONS = group_options("attack")


def yaml_params(option: str) -> tuple[type[Attack], dict[str, Any]]:
    """The option's class and its YAML params, resolved with seed 0 and no threat."""
    path = option_file("attack", option)
    assert path is not None, option
    root = OmegaConf.create({"seed": 0, "attack": OmegaConf.load(path)})
    params = OmegaConf.to_container(root.attack.params, resolve=True)
    assert isinstance(params, dict)
    cls = target_of(str(params.pop("_target_")))
    return cls, {**params, **({MEMBER_BUILDER: member_attack} if MEMBER_BUILDER in cls.hyperparameters else {})}


def bad_cases() -> list[tuple[str, str, Any]]:
    cases = []
    for option in OPTIONS:
        cls, params = yaml_params(option)
        for name in params:
            spec = cls.hyperparameters.get(name)
            cases += [(option, name, value) for value in ([] if spec is None else spec.bad())]
    return cases


CASES = bad_cases()


def one_line_naming(make: Any, name: str) -> str:
    with pytest.raises(AdvbenchError) as err:
        make()
    message = str(err.value)
    assert "\n" not in message and name in message, message
    return message


@pytest.mark.parametrize("option", OPTIONS)
def test_every_argument_is_declared(option: str) -> None:
    cls, params = yaml_params(option)
    arguments = set(inspect.signature(cls).parameters)
    assert arguments <= set(cls.hyperparameters), f"{cls.__name__} declares no range for {arguments - set(cls.hyperparameters)}"
    assert set(params) <= arguments


@pytest.mark.parametrize("option", OPTIONS)
def test_defaults_build_and_the_budget_is_declared(option: str) -> None:
    cls, params = yaml_params(option)
    attack = cls(**params)
    assert type(attack).strength_budget is not Attack.strength_budget
    budget = attack.strength_budget
    assert isinstance(budget, int) and not isinstance(budget, bool) and budget >= 1, budget


@pytest.mark.parametrize(("option", "name", "value"), CASES, ids=[f"{o}-{n}-{v!r}" for o, n, v in CASES])
def test_a_refused_value_is_one_advbench_error_naming_it(option: str, name: str, value: Any) -> None:
    cls, params = yaml_params(option)
    one_line_naming(lambda: cls(**{**params, name: value}), name)


def test_every_option_with_params_has_bad_cases() -> None:
    with_params = {o for o in OPTIONS if yaml_params(o)[1]}
    assert with_params and {o for o, _, _ in CASES} == with_params


def _first_numeric_case(option: str) -> tuple[str, Any] | None:
    cls, params = yaml_params(option)
    return first_numeric_case(cls.hyperparameters.get, params)


CLI_CASES = [(o, *case) for o in OPTIONS if (case := _first_numeric_case(o)) is not None]


@pytest.mark.parametrize(("option", "name", "value"), CLI_CASES, ids=[o for o, _, _ in CLI_CASES])
def test_the_command_line_refuses_it_before_any_work(option: str, name: str, value: Any) -> None:
    message = one_line_naming(lambda: compose_config("config", [f"attack={option}",
                                                                 f"attack.params.{name}={value!r}"]), name)
    assert "attack.params" in message


def test_run_answers_one_line_and_a_non_zero_exit(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]),
                                                         os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "advbench", "run", "attack=square", "attack.params.n_queries=0",
                           f"out_dir={tmp_path}"], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    assert proc.returncode != 0 and len(lines) == 1, lines
    assert "n_queries must be a whole number >= 1, got 0" in lines[0] and "Traceback" not in lines[0]


def test_evaluate_refuses_it_before_any_work(tmp_path: Path) -> None:
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))
    x, y = torch.rand(4, 1, 8, 8), torch.arange(4)
    one_line_naming(lambda: advbench.evaluate(net, (x, y), eps=0.1, attack="square",
                                              attack_params={"n_queries": 0}, out_dir=tmp_path), "n_queries")
    one_line_naming(lambda: advbench.evaluate(net, (x, y), eps=0.1, attack="pgd",
                                              attack_params={"rel_stepsize": -1}, out_dir=tmp_path), "rel_stepsize")
    one_line_naming(lambda: advbench.evaluate(net, (x, y), eps=0.1, attack=PGD(steps=0), out_dir=tmp_path), "steps")
    assert not any(tmp_path.iterdir()), "nothing written"
