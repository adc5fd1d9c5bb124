"""The cells of the Python API, built from its Python values: where `advbench.evaluate` meets the options.

The API names options (data set, defense, attack, threat, preset) and gives values (seed, ε, the
attack's parameters, ...) as Python objects; this turns them into the same frozen `CellSpec`s
`advbench run` measures, from plain data: no config object, no override string of its values.
An option's defaults stay in its YAML (`cli.choices` assembles them, Hydra only where its
composition is needed); a preset's cells are its sweep, expanded as `advbench run -m` expands it,
the values set on each cell as `api_cell` sets them.

A model object evaluated with no defense named runs as given: its records' defense is `none`
(`models.given.AS_GIVEN_DEFENSE`), not the natural training the run config defaults to.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from advbench.cli.choices import api_config, checked, with_values
from advbench.cli.spec_builder import cell_spec, defense_spec
from advbench.robustness.models.given import AS_GIVEN_DEFENSE, applicable_wrapper
from advbench.robustness.specs import CellSpec, WrapperSpec


@dataclass(frozen=True)
class ApiCell:
    """One cell of an API call: its spec, and the input transformation the chosen defense puts in
    front of the model object (None: the model as given)."""

    spec: CellSpec
    wrapper: WrapperSpec | None


def api_cell(choices: Mapping[str, str], values: Mapping[str, Any], overrides: Sequence[str] = (), *,
             as_given: bool) -> ApiCell:
    """The cell `advbench.evaluate` runs: options `choices` (`{"attack": "pgd", ...}`) with `values`
    (`{"seed": 0, "attack.params.steps": 10, ...}`) and the caller's `overrides` on top."""
    return _cell(api_config(choices, values, overrides), as_given=as_given)


def preset_cells(preset: str, choices: Mapping[str, str], values: Mapping[str, Any], overrides: Sequence[str] = (),
                 *, as_given: bool) -> list[ApiCell]:
    """Every cell of `preset` (as `advbench run -m experiment=PRESET`) with the call's choices and values."""
    from advbench.cli.presets import preset_trees  # Hydra expands the preset's sweep: `evaluate` never loads it

    chosen = [*(f"{group}={option}" for group, option in choices.items()), *overrides]
    return [_cell(checked(with_values(tree, values, overrides)), as_given=as_given)
            for tree in preset_trees(preset, chosen)]


def _cell(cfg: Mapping[str, Any], *, as_given: bool) -> ApiCell:
    """A run config's cell (plain data), its defense the model object's own where the call named none."""
    wrapper = applicable_wrapper(defense_spec(cfg["defense"]))
    return ApiCell(spec=cell_spec({**cfg, "defense": dict(AS_GIVEN_DEFENSE)} if as_given else cfg), wrapper=wrapper)
