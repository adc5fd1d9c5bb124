"""`advbench.evaluate_metric`'s config, assembled from option files without Hydra, is the one Hydra composes.

`advbench.cli.choices.api_config(..., primary="iqa")` builds `advbench iqa run`'s config from the
options and values the API names; Hydra composes it from the equivalent command line. Both must
hold the same keys and values, for every option of the groups the iqa primary chooses, or the
API would measure something other than `advbench iqa run`.
"""

from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf

import advbench.cli.config
from advbench.cli.api_metric_cells import IQA_PRIMARY
from advbench.cli.choices import api_config
from advbench.cli.config import compose_config
from advbench.core.catalog import config_root, group_options
from advbench.core.errors import AdvbenchError

VALUES = {"eps": [1 / 255, 4 / 255], "seed": 3, "device": "cpu", "out_dir": "/tmp/advbench out", "progress": False,
          "n_images": None, "size": 32, "data": None, "judges": ["niqe"]}


def _hydra(choices: dict, values: dict, overrides: tuple = ()) -> dict:
    cfg = compose_config(IQA_PRIMARY, [*(f"{g}={o}" for g, o in choices.items()),
                                       *(f"{k}={json.dumps(v)}" for k, v in values.items()), *overrides])
    return OmegaConf.to_container(cfg)


def _assembled(choices: dict, values: dict, overrides: tuple = ()) -> dict:
    return api_config(choices, values, overrides, primary=IQA_PRIMARY)


CASES = [
    *({"metric": "python", "attack": a} for a in group_options("attack", config_root(IQA_PRIMARY))),
    *({"metric": "python", "defense": d} for d in group_options("defense", config_root(IQA_PRIMARY))),
    *({"metric": m} for m in group_options("metric")),
]


@pytest.mark.parametrize("choices", CASES, ids=lambda c: " ".join(f"{g}={o}" for g, o in c.items()))
def test_the_assembled_config_is_the_composed_one(choices: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    expected = _hydra(choices, VALUES)
    monkeypatch.setattr(advbench.cli.config, "compose_config", None)  # the assembly must not fall back
    assembled = _assembled(choices, VALUES)
    assert assembled == expected
    assert list(assembled) == list(expected)  # the keys in Hydra's order too


def test_values_reach_the_attack_as_python_values(monkeypatch: pytest.MonkeyPatch) -> None:
    values = {**VALUES, "judges": ("niqe", "cnnqa"), "attack.params.steps": 7, "attack.params.alpha": 2 / 255,
              "data": "/data/my 'photos'", "n_images": 5}
    choices = {"metric": "python", "attack": "mifgsm"}
    expected = _hydra(choices, values)
    monkeypatch.setattr(advbench.cli.config, "compose_config", None)
    assembled = _assembled(choices, values)
    assert assembled == expected
    assert (assembled["attack"]["params"]["steps"], assembled["judges"], assembled["data"]) == \
        (7, ["niqe", "cnnqa"], "/data/my 'photos'")


OVERRIDES = [
    ("batch_size=4", "chunk_size=16"),
    ("defense=jpeg", "defense.params.quality=50"),
    ("attack=korhonen", "attack.params.steps=3"),
    ("n_images=null", "judges=[niqe,cnnqa]", "threads=1"),
]


@pytest.mark.parametrize("overrides", OVERRIDES, ids=" ".join)
def test_overrides_that_set_values_or_choose_options_are_assembled_too(overrides: tuple,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    choices = {"metric": "python", "attack": "ifgsm"}
    expected = _hydra(choices, VALUES, overrides)
    monkeypatch.setattr(advbench.cli.config, "compose_config", None)
    assert _assembled(choices, VALUES, overrides) == expected


def test_what_the_assembly_does_not_handle_goes_through_hydra() -> None:
    choices = {"metric": "python", "attack": "ifgsm"}
    preset = _assembled(choices, VALUES, ("experiment=iqa_offline",))  # a package header: Hydra places it
    assert preset == _hydra(choices, VALUES, ("experiment=iqa_offline",))
    assert (preset["description"], preset["threads"]) == (OmegaConf.load(  # the preset's own keys, the call's values
        config_root(IQA_PRIMARY) / "experiment" / "iqa_offline.yaml").description, 1)
    assert preset["out_dir"] == VALUES["out_dir"]
    with pytest.raises(AdvbenchError, match="stepz"):  # a key the attack lacks: Hydra's message
        api_config(choices, {**VALUES, "attack.params.stepz": 3}, primary=IQA_PRIMARY)
    for classifier_attack in ("pgd", "../../attack/pgd"):  # conf/iqa/attack shadows conf/attack
        with pytest.raises(AdvbenchError, match=f"unknown attack '{classifier_attack}'; valid: amifgsm"):
            api_config({**choices, "attack": classifier_attack}, VALUES, primary=IQA_PRIMARY)


def test_a_bad_value_is_refused_as_on_the_command_line() -> None:
    with pytest.raises(AdvbenchError, match="batch_size"):
        api_config({"metric": "python"}, {**VALUES, "batch_size": 0}, primary=IQA_PRIMARY)
