"""`threat=corruptions`: the model on corrupted copies of its clean inputs, one cell per corruption.

No attack runs and no budget applies: each sample is classified clean and at each severity 1-5 of
the corruption, generated in process (`robustness.corruptions`) or read from the released files
(`threat.released`: RobustBench's .npy files or ImageNet-C's folders, `corruptions.released`). A
cell is dataset × model × defense × corruption × seed (× shard), keyed, locked, chunked and resumed
as an ℓp cell is (`core.cells`); its records (kind `corruption`, marker `min_severity`) hold per
sample the prediction at every severity, `min_severity` (the smallest severity whose prediction is
wrong; 0 where the clean one is, inf where none is), and no attack, norm, budget or search columns,
since none applied.
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from torch.utils.data import DataLoader, Subset

from advbench.core.cells import claim_cell, fill_cell
from advbench.core.digests import module_digest
from advbench.core.errors import AdvbenchError
from advbench.core.keys import content_key
from advbench.core.runtime import as_input, deploy, execution_identity, resolve_device, set_threads
from advbench.core.version import __version__
from advbench.robustness.attacks.model_draws import RowCalls
from advbench.robustness.corruptions import CORRUPTIONS, NAMES, SEVERITIES, constants_name, corrupt, why_not
from advbench.robustness.corruptions.released import present, read_released, released_identity
from advbench.robustness.evaluation.batch import pooled_vote
from advbench.robustness.evaluation.cell import Given, built_identity, console, expected_ids, judge_identity, model_label, part_file
from advbench.robustness.naming import category_label, row_name
from advbench.robustness.specs import CellSpec
from advbench.robustness.targets import check_checkpoint, load_target, weights_identity

REVISION = "hd2019-v1"
"""The generated corruptions' algorithm, in the key of generated cells: a change that moves their
images bumps it, so cells made before are computed again rather than reused."""

def chosen(spec: CellSpec, side: int) -> list[str]:
    """The corruptions this run measures: those named, each refused in one line where it cannot
    apply; else all 15 the source can give for images of this side (a line names those left out)."""
    named, released = spec.threat.corruptions, spec.threat.released
    for name in named or ():
        CORRUPTIONS.lookup(name)
        why = None if released else why_not(name, side)
        if why is not None:
            raise AdvbenchError(why)
    if named:
        return list(dict.fromkeys(named))
    if released:
        return present(released) or list(NAMES)
    left = {n: why_not(n, side) for n in NAMES if why_not(n, side) is not None}
    if left:
        console.print(f"[dim]corruptions left out: {'; '.join(left.values())}[/dim]", soft_wrap=True)
    return [n for n in NAMES if n not in left]


def source_identity(spec: CellSpec, name: str, side: int, dataset: Any, ids: list[int]) -> dict[str, Any]:
    """How the corrupted images come: generated (the algorithm's revision, the constants used) or
    read (`released.released_identity`: what of the released files the numbers depend on)."""
    released = spec.threat.released
    if not released:
        return {"source": "generated", "revision": REVISION, "constants": constants_name(side)}
    return released_identity(released, name, dataset, ids)


def corruption_identity(spec: CellSpec, name: str, side: int, dataset: Any, ids: list[int]) -> dict[str, Any]:
    """Everything that changes a corruption cell's numbers (`ids`: the cell's samples); its hash names the part file."""
    target, settings, judge = spec.target, spec.settings, judge_identity(spec)
    return {
        "dataset": spec.dataset.name, "dataset_config": spec.dataset.identity(evaluation=True),
        "model": target.model.name, "model_config": target.model.identity(),
        "defense": target.defense.name, "defense_config": target.defense.identity(),
        "weights": weights_identity(target), "threat": "corruptions", "corruption": name,
        "corruption_source": source_identity(spec, name, side, dataset, ids), "severities": list(SEVERITIES),
        "seed": settings.seed, "shard": list(settings.shard),
        **judge, **({"noise": "counter-v1"} if judge else {}),
        **execution_identity(settings.precision, settings.channels_last),
    }


def part_path(records_dir: Path, identity: dict[str, Any]) -> Path:
    i = identity
    return part_file(records_dir, f"{i['dataset']}_{i['defense']}_corruption-{i['corruption']}_s{i['seed']}", i)


def run_corruptions(spec: CellSpec, given: Given | None = None) -> list[Path]:
    """One cell per chosen corruption, records to parquet (each skipped if present); the parts' paths."""
    settings = spec.settings
    set_threads(settings.threads)
    device = resolve_device(settings.device)
    check_checkpoint(spec.target)
    dataset = given.dataset if given is not None and given.dataset is not None else spec.dataset.build()
    side = min(dataset.input_shape[-2:])
    names, ids = chosen(spec, side), expected_ids(spec, dataset)
    built, code = (None, {}) if given is not None else built_identity(spec, dataset)
    model, parts = None, []
    row = row_name(model_label(spec), spec.target.defense.name)
    for name in names:
        identity = {**corruption_identity(spec, name, side, dataset, ids), **code, **(given.identity if given is not None else {})}
        out, label = part_path(Path(settings.records_dir), identity), f"{dataset.name}/{row}/{name}"
        with claim_cell(out, content_key(identity), ids, force=settings.force) as files:
            if files is None:
                console.print(f"[dim]skip {label}: records exist at {out} (force=true to redo)[/dim]", soft_wrap=True)
                parts.append(out)
                continue
            if model is None:
                model = given.model if given is not None else built if built is not None else load_target(spec.target,
                                                                                                           dataset)
                model = deploy(model.to(device), precision=settings.precision, channels_last=settings.channels_last)
            frame = fill_cell(files, content_key(identity), __version__, ids,
                              settings.chunk_size, _computer(spec, dataset, model, name, identity, device, len(ids)))
        _summarize(frame, label, out if given is None or given.kept else None)
        parts.append(out)
    if len(parts) > 1:
        _aggregate_line(parts, f"{dataset.name}/{row}")
    return parts


def _computer(spec: CellSpec, dataset: Any, model: torch.nn.Module, name: str, identity: dict[str, Any],
              device: torch.device, cell_samples: int) -> Any:
    """`compute(ids)` for `fill_cell`: the records of those samples under corruption `name`."""
    settings, released = spec.settings, spec.threat.released
    eval_set = dataset.eval_set()
    positions = list(range(settings.shard[0], len(eval_set), settings.shard[1]))  # `expected_ids`' order
    static = {**_static_columns(spec, identity, model, device, name, min(dataset.input_shape[-2:])),
              "cell_samples": cell_samples}
    draws = settings.judge_draws if getattr(model, "randomized", False) else 1

    def compute(todo: list[int]) -> pd.DataFrame:
        rows = []
        loader = DataLoader(Subset(eval_set, [positions[i] for i in todo]), batch_size=int(settings.batch_size)
                            if settings.batch_size != "auto" else 256, shuffle=False)
        for x, y, sid in loader:
            tic = time.perf_counter()
            calls, everyone = RowCalls(sid.to(device)), torch.arange(len(y), device=device)
            x, y = as_input(model, x.to(device)), y.to(device)
            preds = {"clean_pred": pooled_vote(model, x, y, None, draws, calls=calls, rows=everyone, call_rows=None).pred}
            for s in SEVERITIES:
                xs = read_released(released, name, s, sid, y, dataset) if released else corrupt(x.cpu(), sid, name, s, settings.seed)
                preds[f"pred_s{s}"] = pooled_vote(model, as_input(model, xs.to(device)), y, None, draws, calls=calls,
                                                  rows=everyone, call_rows=None).pred
            rows.append(_batch_frame(preds, y.cpu(), sid, (time.perf_counter() - tic) / len(y)))
        return pd.concat(rows, ignore_index=True).assign(**static)
    return compute


def _batch_frame(preds: dict[str, torch.Tensor], y: torch.Tensor, sid: torch.Tensor, seconds: float) -> pd.DataFrame:
    """One batch's records: the predictions, whether each is right, and the smallest severity that breaks the sample."""
    frame = pd.DataFrame({"sample_id": sid.numpy(), "label": y.numpy(),
                          **{k: v.cpu().numpy() for k, v in preds.items()}})
    frame["clean_correct"] = frame["clean_pred"] == frame["label"]
    for s in SEVERITIES:
        frame[f"correct_s{s}"] = frame[f"pred_s{s}"] == frame["label"]
    broken = pd.Series(float("inf"), index=frame.index)
    for s in reversed(SEVERITIES):
        broken = broken.where(frame[f"correct_s{s}"], float(s))
    frame["min_severity"] = broken.where(frame["clean_correct"], 0.0)
    frame["seconds"] = seconds
    return frame


def _static_columns(spec: CellSpec, identity: dict[str, Any], model: torch.nn.Module, device: torch.device,
                    name: str, side: int) -> dict[str, Any]:
    """The columns every record of a corruption cell shares: provenance, names, the corruption and its source."""
    settings, source = spec.settings, identity["corruption_source"]
    return {
        "run_id": str(settings.run_id or datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")),
        "cell_key": content_key(identity), "advbench_version": __version__, "torch_version": torch.__version__,
        "shard_group": content_key({k: v for k, v in identity.items() if k != "shard"}),
        "dataset": identity["dataset"], "model": identity["model"], "model_label": model_label(spec),
        "weights": json.dumps(identity.get("weights"), sort_keys=True, default=str),
        "model_sha256": module_digest(model), "defense": identity["defense"],
        "defense_category": category_label(spec.target.defense.category),
        "threat": "corruptions", "corruption": name, "corruption_family": CORRUPTIONS[name].family,
        "corruption_source": source["source"],
        "corruption_constants": source.get("constants", "released"),
        "image_side": side, "judge_draws": settings.judge_draws if getattr(model, "randomized", False) else 1,
        "seed": settings.seed, "shard": settings.shard[0], "shard_count": settings.shard[1], "device": str(device),
        "precision": str(getattr(model, "precision", "fp32")), "channels_last": bool(getattr(model, "channels_last", False)),
    }


def accuracy_curve(frame: pd.DataFrame) -> pd.Series:
    """Accuracy at each severity (the `correct_s<k>` columns' means), indexed by severity."""
    return pd.Series({s: float(frame[f"correct_s{s}"].mean()) for s in SEVERITIES})


def _summarize(frame: pd.DataFrame, label: str, out: Path | None) -> None:
    """One line per corruption cell: clean accuracy, accuracy at each severity, their mean."""
    curve = accuracy_curve(frame)
    steps = " ".join(f"{v:.1%}" for v in curve)
    console.print(f"{label}: clean {frame['clean_correct'].mean():.1%}, severities 1-5 {steps}, mean {curve.mean():.1%}, "
                  f"{len(frame)} samples" + (f" -> {out}" if out is not None else ""), soft_wrap=True)


def _aggregate_line(parts: list[Path], label: str) -> None:
    """RobustBench's number for the run: the mean accuracy over its corruptions × severities."""
    frames = [pd.read_parquet(p) for p in parts]
    mean = sum(accuracy_curve(f).mean() for f in frames) / len(frames)
    console.print(f"{label}: corruption accuracy {mean:.1%} (mean over {len(frames)} corruptions × 5 severities)",
                  soft_wrap=True)
