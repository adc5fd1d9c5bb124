"""A CI gate over benchmark records: `advbench check` and `advbench run ... gate.min_accuracy=X`.

Each cell is judged at its budget by the number its goal makes meaningful (from
:func:`advbench.robustness.report.table3.summary_table`):

* untargeted cells by robust accuracy, checked against ``min_accuracy`` (the attack tried to
  make the model wrong, so the share still right is the robustness);
* targeted cells by targeted attack success rate, checked against ``max_asr`` (a failed
  targeted attack may still leave the model wrong, so its accuracy would flatter the model);
* cells with an interval bound (records' ``certified``: ℓ∞ cells of models IBP can bound) also
  by certified accuracy, checked against ``min_certified``: a floor no attack can push below,
  for certified-training defenses whose claim is the bound itself.

A cell whose goal has no threshold is not judged; a gate that judges no cell is an error.
In a `-m` sweep every job judges its own cell and every cell runs; at the end the command
prints one line per failing cell and exits 1 (see :func:`sweep_verdicts`).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from advbench.core.errors import AdvbenchError
from advbench.core.records import read_records
from advbench.robustness.report.shards import ROW, missing_shards, mixed_shards, same_name_cells
from advbench.robustness.report.table3 import summary_table
from advbench.robustness.specs import Thresholds

VERDICT_DIR_ENV = "ADVBENCH_GATE_DIR"
"""Folder where the jobs of one `advbench run` leave a file per failing cell for the parent."""


@dataclass(frozen=True)
class Verdict:
    """What the gate found: one line per failing cell, and how many cells it judged/skipped."""

    failures: list[str]
    judged: int
    unjudged: dict[str, int]

    @property
    def passed(self) -> bool:
        return not self.failures

    def summary(self, limits: Thresholds) -> str:
        """One line for a passing gate: what was checked, and what was left out and why."""
        checked = [f"{self.judged} cell{'s' if self.judged != 1 else ''} passed"]
        if limits.min_accuracy is not None:
            checked.append(f"untargeted accuracy ≥ {limits.min_accuracy:.1%}")
        if limits.max_asr is not None:
            checked.append(f"targeted ASR ≤ {limits.max_asr:.1%}")
        if limits.min_certified is not None:
            checked.append(f"certified accuracy ≥ {limits.min_certified:.1%}")
        line = "gate: " + ", ".join(checked)
        bound = " and no certified bound" if limits.min_certified is not None else ""
        skipped = [f"{n} {goal} not checked (no {CHECK_OPTIONS[goal]}{bound})" for goal, n in self.unjudged.items()]
        return line + ("; " + "; ".join(skipped) if skipped else "")


def cell_label(row: pd.Series) -> str:
    """The label `advbench run` prints for a cell: 'digits/natural/bim linf untargeted ε=0.2' (the
    model row: 'resnet18' or 'resnet18+pgd_at' for a labelled model, 'natural (seed=1)' beside a cell of that name)."""
    label = f"{row['dataset']}/{row[ROW]}/{row['attack']} {row['norm']} {row['goal']} ε={row['eps_budget']:g}"
    return label if row["knowledge"] == "white" else f"{label} ({row['knowledge']})"


CHECK_OPTIONS = {"untargeted": "--min-accuracy", "targeted": "--max-asr"}
RUN_KEYS = {"untargeted": "gate.min_accuracy", "targeted": "gate.max_asr"}
"""How the thresholds are spelt on `advbench check` and on `advbench run`, for messages."""


class NothingJudged(AdvbenchError):
    """No cell of the records has a threshold for its goal: the gate would pass vacuously."""


def judge(records: pd.DataFrame, limits: Thresholds, names: dict[str, str] = CHECK_OPTIONS) -> Verdict:
    """Judge every cell of `records` at its budget; error if no cell has a threshold it can be judged by."""
    table = summary_table(records)
    failures: list[str] = []
    judged = 0
    unjudged: dict[str, int] = {}
    for _, row in table.iterrows():
        checked = False
        if row["goal"] == "untargeted" and limits.min_accuracy is not None:
            checked = True
            if not row["accuracy"] >= limits.min_accuracy:
                failures.append(f"{cell_label(row)}: accuracy {row['accuracy']:.1%} < {limits.min_accuracy:.1%}")
        elif row["goal"] == "targeted" and limits.max_asr is not None:
            checked = True
            if not row["asr"] <= limits.max_asr:
                failures.append(f"{cell_label(row)}: ASR {row['asr']:.1%} > {limits.max_asr:.1%}")
        certified = float(row.get("certified_accuracy", math.nan))
        if limits.min_certified is not None and math.isfinite(certified):
            checked = True
            if not certified >= limits.min_certified:
                failures.append(f"{cell_label(row)}: certified accuracy {certified:.1%} < {limits.min_certified:.1%}")
        if checked:
            judged += 1
        else:
            unjudged[row["goal"]] = unjudged.get(row["goal"], 0) + 1
    if not judged:
        goals = " and ".join(sorted(unjudged))
        need = " and/or ".join(names[g] for g in sorted(unjudged, reverse=True))
        bound = (" (no cell has a certified bound: IBP bounds ℓ∞ cells only)"
                 if limits.min_certified is not None else "")
        raise NothingJudged(f"no cell to check: the records hold only {goals} cells; give {need}{bound}")
    return Verdict(failures, judged, unjudged)


def check_records(paths: Iterable[Path], limits: Thresholds, names: dict[str, str] = CHECK_OPTIONS) -> Verdict:
    """`advbench check`: judge the benchmark records under `paths` (files or folders).

    A cell with a shard missing, or with shards made with other settings, is not judged: the
    verdict would be about other samples or another experiment than the cell's name says. Cells
    of several runs that share a name are judged apart, with one warning line per name on stderr.
    """
    records = read_records(paths, kinds=("benchmark",))
    problems = mixed_shards(records) + missing_shards(records)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise AdvbenchError(f"cannot judge {problems[0]}{more}")
    for line in same_name_cells(records):
        print(f"warning: {line}", file=sys.stderr)
    return judge(records, limits, names)


def gate_cell(gate: Thresholds | None, part: Path, label: str, *, in_sweep: bool = False) -> None:
    """`advbench run` with `gate.*` set: judge the cell `label` just run (or found on disk) at `part`.

    The verdict goes into the folder the `advbench run` process named in ADVBENCH_GATE_DIR,
    which reports every cell once the sweep is over (see :func:`sweep_verdicts`); without that
    folder (the engine called as a library) a failure is an AdvbenchError. A cell whose goal
    has no threshold is an error on its own, and a note in a sweep that mixes goals.
    """
    if gate is None:
        return
    try:
        verdict = check_records([part], gate, RUN_KEYS)
    except NothingJudged as exc:
        if not in_sweep:
            raise
        print(f"gate: {label} not judged ({str(exc).partition('; ')[2]})")
        return
    folder = os.environ.get(VERDICT_DIR_ENV)
    if folder is None:
        if not verdict.passed:
            raise AdvbenchError("gate failed: " + "; ".join(verdict.failures))
        print(verdict.summary(gate))
        return
    record = {"failures": verdict.failures, "judged": verdict.judged, "limits": gate.values()}
    (Path(folder) / f"{uuid.uuid4().hex}.json").write_text(json.dumps(record))


@contextmanager
def sweep_verdicts() -> Iterator[None]:
    """Around a whole `advbench run` (one cell or a sweep): report the gate, exit 1 if a cell failed.

    Hydra's basic launcher lets a job's SystemExit end the sweep, and a job's exception becomes
    a traceback once the sweep is over, so jobs do neither: each leaves its verdict in a folder
    named in the environment (inherited by joblib's and submitit's local workers, whose output
    goes to log files), and this process prints one line per failing cell, or one passing line,
    once every job is done.
    """
    folder = tempfile.mkdtemp(prefix="advbench-gate-")
    saved = os.environ.get(VERDICT_DIR_ENV)
    os.environ[VERDICT_DIR_ENV] = folder
    try:
        yield
        records = [json.loads(f.read_text()) for f in sorted(Path(folder).glob("*.json"))]
        if records:
            failures = [line for r in records for line in r["failures"]]
            verdict = Verdict(failures, sum(r["judged"] for r in records), {})
            for line in sorted(failures):
                print(line, file=sys.stderr)
            if failures:
                print(f"gate failed: {len(failures)} of {verdict.judged} cell{'s' if verdict.judged != 1 else ''} "
                      f"below the threshold", file=sys.stderr)
                raise SystemExit(1)
            print(verdict.summary(Thresholds(*records[0]["limits"])))
    finally:
        if saved is None:
            os.environ.pop(VERDICT_DIR_ENV, None)
        else:
            os.environ[VERDICT_DIR_ENV] = saved
        shutil.rmtree(folder, ignore_errors=True)
