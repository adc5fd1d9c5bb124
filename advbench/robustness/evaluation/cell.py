"""Runs one benchmark cell: batches, the fixed-budget run, the minimum-ε search, records.

A cell is dataset × defense × attack × threat model × seed (× shard). Its records are written
in chunks under a hidden `.partial/` folder while it runs, then merged into one part file:
a killed run loses at most the chunk in flight, and a rerun picks up where it stopped.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from torch.utils.data import DataLoader, Subset

from advbench.core.cells import claim_cell, fill_cell
from advbench.core.digests import module_digest
from advbench.core.errors import AdvbenchError
from advbench.core.keys import content_key
from advbench.core.norms import norm as norm_of
from advbench.core.resume import CellFiles, sample_ids
from advbench.core.runtime import (
    as_input,
    batch_size,
    deploy,
    execution_identity,
    resolve_device,
    set_threads,
)
from advbench.core.version import __version__
from advbench.robustness.attacks.attack_contract import Attack
from advbench.robustness.data.target_classes import target_classes
from advbench.robustness.defenses.masking import cell_flags
from advbench.robustness.evaluation.measure import evaluate_batch
from advbench.robustness.evaluation.substitute import built_substitute, load_substitute, substitute_identity
from advbench.robustness.models.user_models import built_code, default_label
from advbench.robustness.naming import attack_label, category_label, row_name
from advbench.robustness.specs import CellSpec
from advbench.robustness.targets import check_checkpoint, load_target, weights_identity
from advbench.robustness.threat import ThreatModel

console = Console(stderr=True)




def cell_identity(spec: CellSpec, threat: ThreatModel, attack: Attack) -> dict[str, Any]:
    """Everything that changes a cell's numbers; its hash names the part file.

    Names are labels for the file name; the numbers are fixed by the configs behind them
    (data root, split, subset, model, recipe) and by the weights (see `weights_identity`).
    """
    target, settings = spec.target, spec.settings
    return {
        "dataset": spec.dataset.name,
        "dataset_config": spec.dataset.identity(evaluation=True),
        "model": target.model.name,
        "model_config": target.model.identity(),
        "defense": target.defense.name,
        "defense_config": target.defense.identity(),
        "weights": weights_identity(target),
        "attack": spec.attack.name,
        "attack_params": attack.params(),
        **({"attack_revision": attack.revision} if attack.revision else {}),
        "norm": threat.norm,
        "goal": threat.goal,
        "knowledge": threat.knowledge,
        "eps": threat.eps,
        "normalized_l2": threat.normalized_l2,
        "seed": settings.seed,
        "shard": list(settings.shard),
        "search": settings.search.identity(),
        **judge_identity(spec),
        # How a randomized model's noise is drawn (by sample id and call index since counter-v1);
        # only randomized cells (those judged by a vote) carry it, so deterministic cells keep their keys.
        **({"noise": "counter-v1"} if judge_identity(spec) else {}),
        **execution_identity(settings.precision, settings.channels_last),
        **substitute_identity(spec, threat),
    }


def built_identity(spec: CellSpec, dataset: Any) -> tuple[torch.nn.Module | None, dict[str, Any]]:
    """A command line's Python model, built before its cell is claimed, and what of it keys the cell: the
    code of its classes and of the user's modules they import (`code_digest`), its weights and its
    behaviour (`core.fingerprint`); (None, {}) for every other model, whose code is a package's.

    The file `model.target` names (`source_identity`) sees neither a helper module edited nor a
    flag set at run time, nor a weights file the factory reads; the built network shows them all.
    """
    if spec.target.model.kind != "python":
        return None, {}
    model = load_target(spec.target, dataset)
    what = f"model.target '{spec.target.model.argument('target')}'"
    return model, {"model_code": built_code(model, dataset.input_shape, what)}


def judge_identity(spec: CellSpec) -> dict[str, int]:
    """The vote's size where it changes numbers: only behind a randomized wrapper or for a model
    marked `model.randomized`, so the cells of deterministic models keep their keys."""
    wrapper = spec.target.defense.wrapper
    randomized = (wrapper is not None and wrapper.randomized) or bool(spec.target.model.argument("randomized"))
    return {"judge_draws": spec.settings.judge_draws} if randomized else {}


def cell_key(identity: dict[str, Any]) -> str:
    return content_key(identity)


def part_path(records_dir: Path, identity: dict[str, Any]) -> Path:
    i = identity
    return part_file(records_dir, f"{i['dataset']}_{i['defense']}_{i['attack']}_{i['norm']}_{i['goal']}_s{i['seed']}", i)


def part_file(records_dir: Path, stem: str, identity: dict[str, Any]) -> Path:
    """A cell's part file: its readable stem, the shard where the cell is one of several, and its key."""
    shard, shards = identity["shard"]
    if shards > 1:
        stem += f"_shard{shard}of{shards}"
    return records_dir / f"{stem}_{cell_key(identity)}.parquet"


def build_threat(spec: CellSpec, budgets: dict[str, Any]) -> ThreatModel:
    """The cell's threat; ε defaults to the data set's budget for the norm."""
    t = spec.threat
    eps = t.eps
    if eps is None:
        if t.norm not in budgets:
            raise AdvbenchError(f"dataset '{spec.dataset.name}' has no default {t.norm} budget; set threat.eps")
        eps = budgets[t.norm]
    normalized = bool(budgets.get(f"{t.norm}_normalized", False)) and norm_of(t.norm).normalizable
    return ThreatModel(norm=t.norm, goal=t.goal, knowledge=t.knowledge, eps=float(eps), normalized_l2=normalized)


@dataclass(frozen=True)
class Given:
    """Objects the Python API hands in where a config would name them (`advbench.api.evaluate`).

    `identity` replaces the entries of the cell identity the config cannot know (the model's
    weights, the data's content). `kept`: whether the
    records stay where they are written (not a scratch folder the caller deletes), so that the
    summary line names their path only when it will still hold them.
    """

    model: torch.nn.Module
    identity: dict[str, Any]
    dataset: Any = None
    kept: bool = True


@dataclass(frozen=True)
class CellRun:
    """A cell's run as the engine leaves it for the reporting that follows (`report.cell_report`).

    `part`: its records; `label`: how lines name it; `frame`: the records computed now (None where
    they were found on disk, which nothing is said about but the gate); `shown`: the path the summary
    line names (None for a scratch folder the caller deletes); `searched`: whether the minimum-ε
    search ran; `warnings`: what the records suggest is wrong, said after the summary line.
    """

    part: Path
    label: str
    frame: pd.DataFrame | None = None
    shown: Path | None = None
    searched: bool = False
    warnings: tuple[str, ...] = ()


def run_cell(spec: CellSpec, given: Given | None = None) -> CellRun | None:
    """One cell, records to parquet (skipped if present); where they are, for the reporting.

    None: a sweep's cell that the attack does not support (norm, knowledge or goal), skipped
    with one line so that presets can sweep attacks × threats. `given`: the Python API's model
    (and data, attack) instead of those the spec names.
    """
    settings = spec.settings
    set_threads(settings.threads)
    device = resolve_device(settings.device)
    check_checkpoint(spec.target)  # before the data set loads, which may be missing too: the cheap check first
    dataset = given.dataset if given is not None and given.dataset is not None else spec.dataset.build()
    threat = build_threat(spec, dataset.budgets)
    attack = spec.attack.attack.for_norm(threat.norm)  # AutoAttack runs other members under ℓ1
    named = model_label(spec)  # a user's model or a `label=` shows in the lines, before its defense
    row = row_name(named, spec.target.defense.name)
    label = f"{dataset.name}/{row}/{attack_label(spec.attack.name, attack.params())} {threat.norm} {threat.goal} ε={threat.eps:g}"
    if threat.knowledge != "white":
        label += f" ({threat.knowledge})"
    why = attack.unsupported(threat.norm, threat.knowledge, threat.goal)
    if why is not None:
        if not settings.in_sweep:
            raise AdvbenchError(why)
        console.print(f"[dim]skip {label}: {why}[/dim]", soft_wrap=True)
        return None
    built, code = (None, {}) if given is not None else built_identity(spec, dataset)
    substitute, substitute_code = built_substitute(spec, dataset, threat)
    identity = {**cell_identity(spec, threat, attack), **code, **substitute_code,
                **(given.identity if given is not None else {})}
    out = part_path(Path(settings.records_dir), identity)
    # Under the cell's lock a concurrent run of the same cell waits here, then skips.
    with claim_cell(out, cell_key(identity), expected_ids(spec, dataset), force=settings.force) as files:
        if files is None:
            console.print(f"[dim]skip {label}: records exist at {out} (force=true to redo)[/dim]", soft_wrap=True)
            return CellRun(out, label)
        execution = {"precision": settings.precision, "channels_last": settings.channels_last}
        model = given.model if given is not None else built if built is not None else load_target(spec.target, dataset)
        model = deploy(model.to(device), **execution)
        substitute = load_substitute(spec, dataset, threat) if substitute is None else substitute
        frame = evaluate_cell(spec, dataset, model, attack, threat, identity, files, label, device,
                              substitute=None if substitute is None else deploy(substitute.to(device), **execution))
    warnings = (near_chance(frame, label, dataset.num_classes), scores_beat_gradients(frame, label, attack))
    return CellRun(out, label, frame, out if given is None or given.kept else None,
                   searched=settings.search.enabled, warnings=tuple(w for w in warnings if w is not None))


def expected_ids(spec: CellSpec, dataset: Any) -> list[int]:
    """The sample ids this cell (and shard) must hold; a shard that would hold none is the user's error."""
    eval_set = dataset.eval_set()
    ids = sample_ids(eval_set)
    index, count = spec.settings.shard
    if index >= len(eval_set):
        raise AdvbenchError(f"shard {index} of {count} holds no samples: the data set has {len(eval_set)} "
                            f"(shard i takes samples i, i+{count}, ...); use shard.count <= {len(eval_set)}")
    return [ids[p] for p in range(index, len(eval_set), count)]


def evaluate_cell(spec: CellSpec, dataset: Any, model: torch.nn.Module, attack: Attack, threat: ThreatModel,
                  identity: dict[str, Any], files: CellFiles, label: str, device: torch.device,
                  substitute: torch.nn.Module | None = None) -> pd.DataFrame:
    """Evaluate the cell chunk by chunk, reusing the verified chunks a killed run wrote, and write its part.

    `substitute` is the model transfer attacks craft on (None for other knowledge levels).
    Samples go to `evaluate_batch` in pools of `probe_pool` batches, each call of `batch_size`.
    """
    settings = spec.settings
    eval_set = dataset.eval_set()
    positions = list(range(settings.shard[0], len(eval_set), settings.shard[1]))
    chunk = settings.chunk_size
    if chunk < 1:
        raise AdvbenchError(f"chunk_size must be >= 1, got {chunk}")
    ids = sample_ids(eval_set)
    static = {**_static_columns(spec, identity, threat, attack, device, model), "cell_samples": len(positions),
              "shard_group": content_key({k: v for k, v in identity.items() if k != "shard"})}
    batch = batch_size(settings.batch_size, model, eval_set[positions[0]][0] if positions else torch.zeros(0),
                       min(len(positions), chunk), device)
    pool = settings.probe_pool  # batches whose search probes share calls (see `batch.Batch`)
    if settings.batch_size == "auto":
        console.print(f"[dim]{label}: batch_size=auto -> {batch} on {device}[/dim]", soft_wrap=True)
    static.update(cell_flags(model, eval_set, positions[:batch], device, label=label,
                             warn_user=threat.knowledge == "white"))
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TimeRemainingColumn(), console=console, transient=True) as progress:
        task = progress.add_task(label, total=len(positions))

        def compute(todo: list[int]) -> pd.DataFrame:
            progress.update(task, completed=len(positions) - len(todo))
            rows = []
            loader = DataLoader(Subset(eval_set, [positions[i] for i in todo]), batch_size=batch * pool, shuffle=False)
            for x, y, sample_id in loader:
                tic = time.perf_counter()
                x, y = as_input(model, x.to(device)), y.to(device)
                target = target_classes(sample_id, y.cpu(), dataset.num_classes, settings.seed).to(device) \
                    if threat.targeted else None
                measured = evaluate_batch(attack, model, x, y, target, threat, settings.search, sample_id=sample_id,
                                          substitute=substitute, draws=settings.judge_draws, call_rows=batch)
                seconds = (time.perf_counter() - tic) / len(y)
                rows.append(_batch_frame(measured, y.cpu(), sample_id, target, seconds))
                progress.advance(task, len(y))
            return pd.concat(rows, ignore_index=True).assign(**static)

        return fill_cell(files, cell_key(identity), __version__, [ids[p] for p in positions], chunk, compute)


def _static_columns(spec: CellSpec, identity: dict[str, Any], threat: ThreatModel, attack: Attack,
                    device: torch.device, model: torch.nn.Module) -> dict[str, Any]:
    """The columns every record of the cell shares: provenance, the cell's names, its threat and settings."""
    settings = spec.settings
    run_id = str(settings.run_id or datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S"))
    return {
        "run_id": run_id,
        "cell_key": cell_key(identity),
        "advbench_version": __version__,
        "torch_version": torch.__version__,
        "dataset": identity["dataset"],
        "model": identity["model"],
        "model_label": model_label(spec),
        "weights": json.dumps(identity.get("weights"), sort_keys=True, default=str),
        "model_sha256": module_digest(model),
        "defense": identity["defense"],
        "defense_category": category_label(spec.target.defense.category),
        "attack": identity["attack"],
        "attack_params": json.dumps(identity["attack_params"], sort_keys=True),
        "norm": threat.norm,
        "goal": threat.goal,
        "knowledge": threat.knowledge,
        "eps_budget": threat.eps,
        "strength_budget": int(attack.strength_budget),
        "seed": settings.seed,
        "shard": settings.shard[0],
        "shard_count": settings.shard[1],
        "device": str(device),
        "precision": str(getattr(model, "precision", "fp32")),
        "channels_last": bool(getattr(model, "channels_last", False)),
    }


def model_label(spec: CellSpec) -> str:
    """The records' `model_label`: `label=`, else the defense for advbench's models and
    `model.arch` / `model.target` for users' (a label: in no key)."""
    given = spec.settings.label
    return str(given) if given is not None else default_label(spec.target.model, spec.target.defense.name)


def _batch_frame(measured: dict[str, torch.Tensor | str], y: torch.Tensor, sample_id: torch.Tensor,
                 target: torch.Tensor | None, seconds: float) -> pd.DataFrame:
    """One batch's records; per-batch values (a str, `seconds`) are repeated on every row."""
    cols: dict[str, Any] = {
        "sample_id": sample_id.numpy(),
        "label": y.numpy(),
        "target": (target.cpu() if target is not None else torch.full_like(y, -1)).numpy(),
    }
    cols.update({k: v.numpy() if isinstance(v, torch.Tensor) else v for k, v in measured.items()})
    frame = pd.DataFrame(cols)
    frame["clean_correct"] = frame["clean_pred"] == frame["label"]
    frame["seconds"] = seconds
    return frame


def near_chance(frame: pd.DataFrame, label: str, num_classes: int) -> str | None:
    """A warning when clean accuracy is under twice chance: an untrained model, or input it does
    not expect (normalisation), whose robustness numbers would mean nothing, read as if they did."""
    clean = float(frame["clean_correct"].mean())
    if num_classes > 1 and clean < 2 / num_classes:
        return (f"{label}: clean accuracy {clean:.1%} is near chance ({1 / num_classes:.0%} for {num_classes} classes): "
                "is the model trained, and does it get the input it expects (mean=/std=, model.mean/std)?")
    return None


SCORE_SHARE = 0.002
"""The share of a cell's samples score-based members may break after the white-box ones before
the run warns (AutoAttack's `check_square_sr`, alpha = 0.2 points)."""


def scores_beat_gradients(frame: pd.DataFrame, label: str, attack: Attack) -> str | None:
    """A warning when an ensemble's score-based members (AutoAttack's Square) broke more than
    `SCORE_SHARE` of the samples its white-box members left robust: gradients that a search
    without them beats are likely masked, and the white-box numbers overstate robustness."""
    late = getattr(attack, "late_score_members", ())
    if not late or "broken_by" not in frame:
        return None
    share = float(frame["broken_by"].isin(late).mean())
    if share <= SCORE_SHARE:
        return None
    names = ", ".join(attack.members[i] for i in late)
    return (f"{label}: {names} broke {share:.1%} of the samples after the gradient-based members failed on them: "
            "their gradients may be masked; run the score-based attack longer or an adaptive attack")
