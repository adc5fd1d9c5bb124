"""An attack of one's own is one module and one YAML, outside the package.

The module sits in a folder on the Python path, the YAML in a folder `ADVBENCH_CONF` names
(laid out as conf/: `attack/<name>.yaml`). Then the attack is an option like the shipped ones:
`advbench list attack` and the generated docs table list it, Hydra composes `attack=<name>`,
its bad hyperparameters are refused from its declarations, and the contract tests that run
every catalogue attack (tests/test_attacks.py, tests/test_attack_declarations.py,
tests/test_config.py) run it too.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from advbench.cli.config import compose_config
from advbench.core.catalog import describe, group_options, option_file
from advbench.core.errors import AdvbenchError

ROOT = Path(__file__).resolve().parents[1]

MODULE = '''"""A toy attack: one gradient step of `scale`·ε, signed (l-inf) or normalised (l2)."""

import torch

from advbench.core.steps import ascend, unit_direction
from advbench.core import hyperparameters as hyper
from advbench.robustness.attacks.attack_contract import Attack, AttackResult, success_of


class OneStep(Attack):
    hyperparameters = {"scale": hyper.Real(0, 1, open_low=True)}
    strength_budget = 1

    def __init__(self, *, scale: float = 1.0) -> None:
        self.set_hyperparameters(locals())

    def run(self, oracle, x, y, *, eps, norm, target, sample_id):
        rows = torch.arange(len(y), device=x.device)
        _, grad = oracle.loss_grad(x, y if target is None else target, target is not None, rows)
        x_adv = ascend(x, x, unit_direction(grad, norm), self.scale * eps, eps, norm, oracle.bounds)
        success = success_of(oracle.logits(x_adv, rows), y, target)
        return AttackResult(x_adv=x_adv, success=success, first_success=(success.long() * 2 - 1))
'''

OPTION = """name: toy_one_step
description: A toy attack of one's own, one gradient step of the whole budget
params:
  _target_: toy_attack.OneStep
  scale: 1.0
"""


@pytest.fixture
def toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The toy's module and YAML written, the environment that finds them set here; returned for subprocesses."""
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "toy_attack.py").write_text(MODULE)
    (tmp_path / "my_conf" / "attack").mkdir(parents=True)
    (tmp_path / "my_conf" / "attack" / "toy_one_step.yaml").write_text(OPTION)
    monkeypatch.setenv("ADVBENCH_CONF", str(tmp_path / "my_conf"))
    monkeypatch.syspath_prepend(str(tmp_path / "mods"))
    path = os.pathsep.join([str(tmp_path / "mods"), str(ROOT), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path}


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT, env=env, timeout=900)


def test_the_catalogue_and_hydra_find_it(toy: dict[str, str]) -> None:
    assert "toy_one_step" in group_options("attack") and "pgd" in group_options("attack")
    assert option_file("attack", "toy_one_step").parent.parent.name == "my_conf"
    assert describe("attack", "toy_one_step").startswith("A toy attack of one's own")
    cfg = compose_config("config", ["attack=toy_one_step", "threat=l2"])
    assert cfg.attack.params._target_ == "toy_attack.OneStep"
    with pytest.raises(AdvbenchError, match="scale must be a number in"):
        compose_config("config", ["attack=toy_one_step", "attack.params.scale=0"])
    with pytest.raises(AdvbenchError, match="unknown attack 'toy_two_steps'; valid: .*toy_one_step"):
        compose_config("config", ["attack=toy_two_steps"])


def test_list_and_the_docs_table_show_it(toy: dict[str, str]) -> None:
    listed = run(toy, "-m", "advbench", "list", "attack")
    assert listed.returncode == 0, listed.stderr
    assert re.search(r"toy_one_step\W+A toy attack of one's own", listed.stdout), listed.stdout
    tables = run(toy, "scripts/catalog_tables.py")
    assert tables.returncode == 0, tables.stderr
    assert "| `toy_one_step` | A toy attack of one's own, one gradient step of the whole budget |" in tables.stdout
    refused = run(toy, "scripts/catalog_tables.py", "--check")
    assert refused.returncode != 0 and "ADVBENCH_CONF" in refused.stderr, "the shipped docs list the shipped options"


@pytest.mark.slow
def test_the_contract_tests_run_it(toy: dict[str, str]) -> None:
    tests = ["tests/test_attacks.py", "tests/test_attack_declarations.py", "tests/test_config.py"]
    proc = run(toy, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", "-n", "0", *tests,
               "-k", "toy_one_step", "-rs")
    assert proc.returncode == 0, proc.stdout[-3000:]
    passed = int(re.search(r"(\d+) passed", proc.stdout).group(1))
    # test_attacks: contract for l-inf/l2 x untargeted/targeted, zero budget, samples apart, engine
    # records; test_attack_declarations: declared, built, bad scale values; test_config: composes
    assert passed >= 15 and "failed" not in proc.stdout, proc.stdout[-3000:]


def test_a_missing_folder_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ADVBENCH_CONF", str(tmp_path / "nowhere"))
    with pytest.raises(AdvbenchError, match="ADVBENCH_CONF names '.*nowhere', which is not a folder"):
        group_options("attack")


def test_hydra_searches_conf_then_the_given_folders_then_advbench_conf(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from advbench.cli.options import with_user_conf
    from advbench.core.catalog import conf_dir

    monkeypatch.delenv("ADVBENCH_CONF", raising=False)
    assert with_user_conf(["attack=pgd"]) == ["attack=pgd"], "unchanged without ADVBENCH_CONF"
    (tmp_path / "mine").mkdir()
    (tmp_path / "given").mkdir()
    monkeypatch.setenv("ADVBENCH_CONF", str(tmp_path / "mine"))
    given = ["attack=pgd", f"hydra.searchpath=[file://{tmp_path / 'given'}]"]
    once = with_user_conf(given)
    assert once == ["attack=pgd", f"hydra.searchpath=['file://{conf_dir()}','file://{tmp_path / 'given'}',"
                                  f"'file://{tmp_path / 'mine'}']"]
    assert with_user_conf(once) == once


def test_an_attack_class_says_its_budget() -> None:
    from advbench.robustness.attacks.attack_contract import Attack

    with pytest.raises(TypeError, match="Silent has a run but does not say its strength_budget"):
        class Silent(Attack):
            def run(self, oracle, x, y, *, eps, norm, target, sample_id):  # pragma: no cover - never built
                raise NotImplementedError
