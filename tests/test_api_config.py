"""The API's config, assembled from option files without Hydra, is the config Hydra composes.

`advbench.cli.choices.api_config` builds `advbench.evaluate`'s run config from the options and
values it names; Hydra composes the same from the equivalent command line. Both must give the
same cell spec (everything below the command line sees), for every option of each group the
API chooses, or the API would measure something other than `advbench run`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import advbench.cli.config
from advbench.cli.choices import api_config
from advbench.cli.config import compose_config
from advbench.cli.spec_builder import cell_spec
from advbench.core.catalog import group_options
from advbench.core.errors import AdvbenchError

VALUES = {"device": "cpu", "seed": 3, "label": "my net", "out_dir": "/tmp/advbench out", "model.randomized": False}


def _hydra(choices: dict, values: dict) -> object:
    return compose_config("config", [*(f"{g}={o}" for g, o in choices.items()),
                                     *(f"{k}={json.dumps(v)}" for k, v in values.items())])


CASES = [
    *({"model": "python", "attack": a} for a in group_options("attack")),
    *({"model": "python", "defense": d} for d in group_options("defense")),
    *({"model": "python", "threat": t} for t in group_options("threat")),
    *({"model": "python", "dataset": d} for d in group_options("dataset")),
]


DECLINED = [{"model": "python", "defense": "fd"}]
"""Options the assembly leaves to Hydra: fd's `defaults:` merges a model option into the model."""


@pytest.mark.parametrize("choices", CASES, ids=lambda c: " ".join(f"{g}={o}" for g, o in c.items()))
def test_the_assembled_config_is_the_composed_one(choices: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    values = {**VALUES, **({"dataset.root": "/data/images"} if choices.get("dataset") == "folder" else {})}
    expected = cell_spec(_hydra(choices, values))
    composed = []
    monkeypatch.setattr(advbench.cli.config, "compose_config", lambda *a, **k: composed.append(a) or compose_config(*a, **k))
    assert cell_spec(api_config(choices, values)) == expected
    assert bool(composed) == (choices in DECLINED)


def test_values_reach_the_attack_and_the_threat(monkeypatch: pytest.MonkeyPatch) -> None:
    values = {**VALUES, "attack.params.steps": 7, "attack.params.rel_stepsize": 0.5, "threat.eps": 0.05,
              "model.randomized": True}
    choices = {"model": "python", "attack": "pgd", "threat": "l2"}
    expected = cell_spec(_hydra(choices, values))
    monkeypatch.setattr(advbench.cli.config, "compose_config", None)  # the assembly must not fall back
    spec = cell_spec(api_config(choices, values))
    assert spec == expected
    assert (spec.attack.attack.steps, spec.attack.attack.seed, spec.threat.eps) == (7, 3, 0.05)


OVERRIDES = [
    ["search.enabled=false"],
    ["batch_size=64", "judge.draws=5", "search.max_probes=3"],
    ["defense=jpeg", "defense.wrapper.quality=50"],
    ["attack=apgd_ensemble", "attack.params.member_params={apgd_ce:{n_iter:20},apgd_t:{n_iter:20}}"],
    ["dataset.n_samples=4", "label='a b'", "threat.eps=null"],
]


@pytest.mark.parametrize("overrides", OVERRIDES, ids=" ".join)
def test_overrides_that_set_values_or_choose_options_are_assembled_too(overrides: list[str],
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    choices = {"model": "python", "attack": "bim"}
    expected = cell_spec(compose_config("config", [*(f"{g}={o}" for g, o in choices.items()),
                                                   *(f"{k}={json.dumps(v)}" for k, v in VALUES.items()), *overrides]))
    monkeypatch.setattr(advbench.cli.config, "compose_config", None)  # the assembly must not fall back
    assert cell_spec(api_config(choices, VALUES, overrides)) == expected


def test_what_the_assembly_does_not_handle_goes_through_hydra() -> None:
    choices = {"model": "python", "attack": "bim"}
    added = cell_spec(api_config(choices, VALUES, ["experiment=smoke"]))  # a preset: a group the API does not choose
    assert added.settings.search.max_probes == 8
    with pytest.raises(AdvbenchError, match="stepz"):  # a key the attack lacks: Hydra's message
        api_config(choices, {**VALUES, "attack.params.stepz": 3})
    with pytest.raises(AdvbenchError, match="nope"):
        api_config({**choices, "attack": "nope"}, VALUES)


def test_a_bad_value_is_refused_as_on_the_command_line() -> None:
    with pytest.raises(AdvbenchError, match="seed"):
        api_config({"model": "python"}, {**VALUES, "seed": -1})


API_PROBE = """
import json, sys, torch
import advbench
loaded = {"import": sorted({m.split(".")[0] for m in sys.modules} & {"hydra", "matplotlib"})}
net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))
x, y = torch.rand(4, 1, 8, 8), torch.arange(4)
advbench.evaluate(net, (x, y), attack="fgsm", eps=0.1, out_dir="out")
loaded["evaluate"] = sorted({m.split(".")[0] for m in sys.modules} & {"hydra", "matplotlib"})
print(json.dumps(loaded))
"""


def test_the_api_imports_and_evaluates_without_hydra_or_matplotlib(tmp_path: Path) -> None:
    """`import advbench; advbench.evaluate(...)` costs close to `import torch`: no figures library,
    and no Hydra unless an override string needs its parser."""
    out = subprocess.run([sys.executable, "-c", API_PROBE], capture_output=True, text=True, cwd=tmp_path, check=True)
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert loaded == {"import": [], "evaluate": []}
    assert len(list((tmp_path / "out" / "records").glob("*.parquet"))) == 1
