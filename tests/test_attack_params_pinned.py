"""`attack.params()` of every catalogue attack, pinned: it feeds the cell key (record file names end in
a hash of it), so a refactor of how attacks take their hyperparameters must not change one value,
key or number type.

tests/data/attack_params.json holds, per attack option, its `params()` built from the option's
YAML (seed 0, no threat: `threat.steps` falls back to the YAML's 20), and the same with some
hyperparameters set away from their defaults. Written from the code before the hyperparameters
became declarations; regenerate only for a change that is meant to key cells anew:
`PYTHONPATH=. python tests/test_attack_params_pinned.py --write`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from advbench.cli.option_targets import construct

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf" / "attack"
PINNED = Path(__file__).with_name("data") / "attack_params.json"
OPTIONS = sorted(p.stem for p in CONF.glob("*.yaml"))

VARIANTS: dict[str, dict[str, Any]] = {
    "pgd": {"steps": 3, "rel_stepsize": 1, "seed": -2},
    "mim": {"decay": 0.5},
    "ti": {"kernel_size": 5, "prob": 0.25, "early_stop": False},
    "dim": {"resize_rate": 0.5},
    "square": {"n_queries": 50, "p_init": 1},
    "cw": {"abort_early": False, "confidence": 1},
    "hsj": {"checkpoints": [10, 20], "gamma": 2},
    "boundary": {"schedule": "paper", "checkpoints": (5, 7)},
    "zoo": {"checkpoints": [3], "coordinates": 4},
    "apgd_t": {"n_target_classes": 3, "loss": "ce"},
    "ensemble": {"members": ["fgsm", "pgd"], "member_params": {"pgd": {"steps": 2}}},
    "fmn": {"steps": 30, "min_stepsize": 0.05, "gamma": 0.1},
    "alma": {"steps": 100, "logit_tolerance": 0, "gamma": 2},
    "fab_t": {"n_target_classes": 3, "final_search": 0, "beta": 1},
    "ead": {"decision_rule": "EN", "beta": 0.01, "binary_search_steps": 3},
    "sparse_rs": {"n_queries": 50, "alpha_init": 0.5},
}
"""Option -> hyperparameters set away from the YAML's (ints where floats are usual, tuples for lists)."""


def option_params(option: str) -> dict[str, Any]:
    """The option's params as its YAML resolves them with seed 0 and no threat."""
    root = OmegaConf.create({"seed": 0, "attack": OmegaConf.load(CONF / f"{option}.yaml")})
    params = OmegaConf.to_container(root.attack.params, resolve=True)
    assert isinstance(params, dict)
    return params


def cases() -> dict[str, dict[str, Any]]:
    found = {option: option_params(option) for option in OPTIONS}
    found.update({f"{option}+variant": {**option_params(option), **changed} for option, changed in VARIANTS.items()})
    return found


def built(spec: dict[str, Any]) -> str:
    """`params()` of the attack `spec` builds, as the cell key's JSON sees it (types included)."""
    return json.dumps(construct(spec).params(), sort_keys=True)


@pytest.mark.parametrize("case", sorted(cases()))
def test_params_are_as_pinned(case: str) -> None:
    pinned = json.loads(PINNED.read_text())
    assert case in pinned, f"{case} is not pinned; write {PINNED.name} (see this module's docstring)"
    assert built(cases()[case]) == pinned[case]


def test_every_option_is_pinned() -> None:
    assert set(OPTIONS) <= set(json.loads(PINNED.read_text()))


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    PINNED.write_text(json.dumps({case: built(spec) for case, spec in sorted(cases().items())}, indent=1) + "\n")
