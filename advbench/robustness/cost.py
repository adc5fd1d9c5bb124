"""What a cell costs at most, stated before it runs: gradient evaluations and queries per sample.

The numbers come from the attack's declared budget (`Attack.declared_cost`: its
`strength_budget` in the unit its knowledge level spends), times the runs a sample can take:
one for a minimum-norm attack, one plus `search.max_probes` for a budgeted attack whose
minimum-ε search re-runs it at other ε (each probe a whole run; gradients at the clean input
served from memory are not evaluations). They are upper bounds for a deterministic model: a
sample broken early, or a search that closes in fewer probes, spends less, and the records'
`grad_evals` and `queries` say what each sample spent. A randomized model multiplies white-box
gradients by its EOT passes and adds its votes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from advbench.robustness.attacks.attack_contract import Cost
from advbench.robustness.specs import CellSpec

COST_COLUMNS = ("attack", "knowledge", "norm", "goal", "runs", "grad_evals_per_run", "queries_per_run",
                "grad_evals_per_sample", "queries_per_sample", "samples", "grad_evals", "queries")
"""The columns of a cost table (`cost_frame`): one row per cell; `samples`, `grad_evals` and
`queries` (the cell's totals) are missing where the cell takes the data set's whole evaluation set."""


@dataclass(frozen=True)
class CellCost:
    """One cell's declared cost: one run's per sample, the runs a sample can take, the samples."""

    attack: str
    knowledge: str
    norm: str
    goal: str
    per_run: Cost
    runs: int
    samples: int | None

    @property
    def per_sample(self) -> Cost:
        return self.per_run * self.runs

    @property
    def total(self) -> Cost | None:
        """The whole cell's, None where the sample count is the data set's (not known before it loads)."""
        return None if self.samples is None else self.per_sample * self.samples

    def row(self) -> dict[str, Any]:
        total = self.total
        return {"attack": self.attack, "knowledge": self.knowledge, "norm": self.norm, "goal": self.goal,
                "runs": self.runs, "grad_evals_per_run": self.per_run.grad_evals,
                "queries_per_run": self.per_run.queries, "grad_evals_per_sample": self.per_sample.grad_evals,
                "queries_per_sample": self.per_sample.queries, "samples": self.samples,
                "grad_evals": None if total is None else total.grad_evals,
                "queries": None if total is None else total.queries}


def cell_cost(spec: CellSpec) -> CellCost:
    """The declared cost of `spec`'s cell (all its shards), from its attack, threat, search and samples."""
    attack, threat, search = spec.attack.attack, spec.threat, spec.settings.search
    probes = search.max_probes if attack.kind == "budgeted" and search.enabled else 0
    samples = spec.dataset.builder.given.get("n_samples")
    per_run = attack.for_norm(threat.norm).declared_cost(threat.knowledge, threat.goal, _num_classes(spec))
    return CellCost(spec.attack.name, threat.knowledge, threat.norm, threat.goal, per_run, 1 + probes,
                    None if samples is None else int(samples))


def _num_classes(spec: CellSpec) -> int:
    """The data set's classes: its class's, its option's, else the built data set's."""
    declared = getattr(spec.dataset.builder.factory, "num_classes", None)
    if isinstance(declared, int):
        return declared
    given = spec.dataset.builder.given.get("num_classes")
    return given if isinstance(given, int) else int(spec.dataset.build().num_classes)


def cost_frame(costs: list[CellCost]) -> pd.DataFrame:
    """The cost table: one row per cell, `COST_COLUMNS`; counts as nullable integers."""
    frame = pd.DataFrame([c.row() for c in costs], columns=list(COST_COLUMNS))
    for column in ("samples", "grad_evals", "queries"):
        frame[column] = frame[column].astype("Int64")
    return frame
