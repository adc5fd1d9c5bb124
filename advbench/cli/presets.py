"""Presets (`conf/experiment`) as lists of cells, and their declared cost before anything runs.

A preset sweeps `hydra.sweeper.params`; `preset_configs` composes each of its cells as
`advbench run -m experiment=NAME` would, so the Python API runs the same cells and states the
same cost. `sweep_cost` is the cost table of composed configs (`advbench.robustness.cost`), with
each transfer cell's substitute checked for weights first; `state_cost` prints it, which
`advbench run` does before a sweep whose config says `state_cost: true` (`experiment=full_eval`).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import product
from typing import Any

import pandas as pd
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.table import Table

from advbench.cli.config import compose_config
from advbench.cli.spec_builder import cell_spec
from advbench.core.catalog import group_options, option_data
from advbench.core.errors import AdvbenchError
from advbench.core.terminal import print_table
from advbench.robustness.cost import cell_cost, cost_frame
from advbench.robustness.evaluation.substitute import check_substitute_weights
from advbench.robustness.specs import CellSpec

PRESET_CHOICES = ("experiment", "attack", "threat", "threat.norm", "threat.goal", "threat.knowledge")
"""What a preset chooses per cell: overrides of these (and of its rows, `experiment/...`) are refused."""


def preset_params(name: str) -> dict[str, list[str]]:
    """Preset `name`'s sweep (`hydra.sweeper.params`): each swept key with its values."""
    data = option_data("experiment", name)
    if data is None:
        raise AdvbenchError(f"unknown preset '{name}'; valid: {', '.join(group_options('experiment'))}")
    params = ((data.get("hydra") or {}).get("sweeper") or {}).get("params") or {}
    if not params:
        raise AdvbenchError(f"experiment '{name}' sweeps nothing (no hydra.sweeper.params): it is one run, not a preset "
                            "of cells")
    return {str(key): [v.strip() for v in str(listed).split(",")] for key, listed in params.items()}


def sweep_jobs(overrides: Sequence[str]) -> list[list[str]]:
    """The overrides of every job of `advbench run -m OVERRIDES`: the chosen experiment's sweep, with
    the command line's keys (swept or not) in place of its own, as Hydra's sweeper combines them."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides([str(o) for o in overrides])
    name = next((str(o.value()) for o in parsed if o.key_or_group == "experiment" and not o.is_sweep_override()), None)
    jobs = {key: [f"{key}={v}" for v in values] for key, values in (preset_params(name) if name else {}).items()}
    for override in parsed:
        key = override.input_line.partition("=")[0]
        jobs[key] = [f"{key}={v}" for v in override.sweep_string_iterator()] if override.is_sweep_override() \
            else [override.input_line]
    return [list(combo) for combo in product(*jobs.values())]


def preset_configs(name: str, overrides: Sequence[str] = ()) -> list[DictConfig]:
    """Each cell of preset `name` composed with `overrides` on top, as `advbench run -m` composes it."""
    refuse_preset_choices(overrides)
    return [compose_config("config", job) for job in sweep_jobs([f"experiment={name}", *overrides])]


def preset_trees(name: str, overrides: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Each cell of preset `name` with `overrides` as Hydra composes it, as written (unresolved, unchecked): the
    Python API sets its values on each (`cli.choices.with_values`) before it is resolved and checked."""
    refuse_preset_choices(overrides)
    return [OmegaConf.to_container(compose_config("config", job, check=False))
            for job in sweep_jobs([f"experiment={name}", *overrides])]


def refuse_preset_choices(overrides: Sequence[str]) -> None:
    """A preset's cells are its rows: an override choosing their attack or threat would make every cell one."""
    for override in overrides:
        key = str(override).partition("=")[0].lstrip("+~")
        if key in PRESET_CHOICES or key.startswith("experiment/"):
            raise AdvbenchError(f"'{override}': the preset chooses the attack and threat of each cell; change their "
                                f"settings with the preset's keys (full_eval.*, threat.eps=..., search.*) instead")


def sweep_cost(cfgs: Sequence[DictConfig]) -> pd.DataFrame:
    """The declared cost of each composed cell (`specs_cost`)."""
    return specs_cost([cell_spec(cfg) for cfg in cfgs])


def specs_cost(specs: Sequence[CellSpec]) -> pd.DataFrame:
    """The declared cost of each cell (`COST_COLUMNS`), after checking that every transfer cell's
    substitute has weights: that cell would otherwise fail after the others ran."""
    for spec in specs:
        check_substitute_weights(spec)
    return cost_frame([cell_cost(spec) for spec in specs])


def state_cost(overrides: Sequence[str], console: Console | None = None) -> None:
    """Print the cost table and totals of the jobs of `advbench run -m OVERRIDES` (its experiment's sweep too);
    a preset's own choices of attack and threat are refused first."""
    named = [str(o).partition("=")[0] == "experiment" for o in overrides]
    if any(named):  # a preset's sweep; a sweep of the user's own chooses attacks and threats freely
        refuse_preset_choices([o for o, is_experiment in zip(overrides, named) if not is_experiment])
    print_cost(sweep_cost([compose_config("config", job) for job in sweep_jobs(overrides)]), console or Console())


def print_cost(frame: pd.DataFrame, console: Console) -> None:
    """The cost table, then the totals: what every cell may spend, per sample and over its samples."""
    table = Table(title="Declared cost: the most each cell spends (runs: the budget run and the minimum-ε search's "
                        "probes; gradient attacks' success checks are not counted here, the records count them)")
    for column in ("attack", "knowledge", "norm", "goal", "runs", "grad evals / sample", "queries / sample",
                   "samples", "grad evals", "queries"):
        table.add_column(column, justify="left" if column in ("attack", "knowledge", "norm", "goal") else "right")
    for row in frame.itertuples(index=False):
        table.add_row(row.attack, row.knowledge, row.norm, row.goal, str(row.runs), _count(row.grad_evals_per_sample),
                      _count(row.queries_per_sample), _count(row.samples), _count(row.grad_evals), _count(row.queries))
    print_table(table, console)
    per_sample = f"{int(frame['grad_evals_per_sample'].sum()):,} gradient evaluations and " \
        f"{int(frame['queries_per_sample'].sum()):,} queries per sample"
    if frame["samples"].isna().any():
        console.print(f"{len(frame)} cells: at most {per_sample} (each cell on the data set's whole evaluation set)",
                      soft_wrap=True)
    else:
        console.print(f"{len(frame)} cells: at most {per_sample}; {int(frame['grad_evals'].sum()):,} gradient "
                      f"evaluations and {int(frame['queries'].sum()):,} queries in total", soft_wrap=True)


def _count(value: object) -> str:
    """A count as the table shows it: "all" for the whole evaluation set, "-" for none."""
    if pd.isna(value):  # type: ignore[call-overload]
        return "all"
    return f"{int(value):,}" if value else "-"  # type: ignore[call-overload]
