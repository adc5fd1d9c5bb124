"""Runs one benchmark cell: batches, the fixed-budget run, the minimum-ε search, records.

A cell is dataset × defense × attack × threat model × seed (× shard). Its records are written
in chunks under a hidden `.partial/` folder while it runs, then merged into one part file:
a killed run loses at most the chunk in flight, and a rerun picks up where it stopped.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from torch.utils.data import DataLoader, Subset

from advbench import __version__
from advbench.attacks.base import Attack
from advbench.attacks.oracles import Oracle, build_oracle
from advbench.attacks.steps import lp_norm
from advbench.data.targets import target_classes
from advbench.errors import AdvbenchError
from advbench.records import read_records, write_part
from advbench.runtime import resolve_device, set_threads
from advbench.threat import ThreatModel, distances, goal_met

console = Console(stderr=True)

# Budget and bounds checks allow float rounding of the projection, nothing more.
_REL_TOL = 1e-5
_ABS_TOL = 1e-6


@dataclass(frozen=True)
class SearchSettings:
    """Minimum-ε search: geometric line search from the budget, then bisection.

    `resolution` is the final bracket width as a fraction of the budget; `max_factor` caps
    the upward line search at that multiple of the budget (beyond it min_eps is inf).
    """

    enabled: bool = True
    resolution: float = 0.05
    max_factor: float = 4.0
    max_probes: int = 12


def evaluate_batch(attack: Attack, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor,
                   target: torch.Tensor | None, threat: ThreatModel, search: SearchSettings, *,
                   sample_id: torch.Tensor | None = None,
                   substitute: torch.nn.Module | None = None) -> dict[str, torch.Tensor]:
    """All per-sample measurements of one batch, as CPU tensors keyed by record column."""
    norm = threat.norm
    scale = threat.scale(x)
    budget = threat.eps * scale
    clean_logits = _judge(model, x)
    if not bool(torch.isfinite(clean_logits).all()):
        raise AdvbenchError("the model returned NaN or infinite logits on clean inputs; check the checkpoint")
    clean_pred = clean_logits.argmax(dim=1)

    oracle = build_oracle(threat.knowledge, model, x.shape[0], substitute, num_classes=clean_logits.shape[1])
    eps = torch.full((x.shape[0],), budget, device=x.device, dtype=x.dtype)
    result = attack(oracle, x, y, eps=eps, norm=norm, target=target, sample_id=sample_id)
    check_contract(result.x_adv, x, eps, norm, oracle.bounds, type(attack).__name__)
    adv_logits = _judge(model, result.x_adv)
    if not bool(torch.isfinite(adv_logits).all()):
        raise AdvbenchError(f"the model returned NaN or infinite logits on {type(attack).__name__}'s examples")
    adv_pred = adv_logits.argmax(dim=1)
    success = goal_met(adv_pred, y, target)
    first = torch.where(success, result.first_success, torch.full_like(result.first_success, -1))

    budget_evals = oracle.grad_evals.clone()
    if search.enabled:
        hi, lo = min_eps_search(attack, oracle, model, x, y, target, norm, budget, result.x_adv, success, search,
                                sample_id)
    else:
        hi = torch.where(success, lp_norm(result.x_adv - x, norm), torch.full_like(eps, math.inf))
        lo = torch.zeros_like(eps)

    d = distances(result.x_adv, x)
    out = {
        "clean_pred": clean_pred,
        "success_at_budget": success,
        "adv_pred": adv_pred,
        "min_eps": hi / scale,
        "min_eps_lo": lo / scale,
        "first_success_strength": first,
        "grad_evals": oracle.grad_evals,
        "search_grad_evals": oracle.grad_evals - budget_evals,
        "queries": oracle.queries,
        "dist_linf": d["linf"],
        "dist_l2": d["l2"],
        "dist_l2_norm": d["l2_norm"],
    }
    return {k: v.detach().cpu() for k, v in out.items()}


def check_contract(x_adv: torch.Tensor, x: torch.Tensor, eps: torch.Tensor, norm: str,
                   bounds: tuple[float, float], name: str) -> None:
    """An attack may never leave the input bounds or its budget; if one does, stop loudly."""
    if not bool(torch.isfinite(x_adv).all()):
        raise AdvbenchError(f"{name} returned non-finite values")
    lo, hi = bounds
    if bool((x_adv < lo - _ABS_TOL).any()) or bool((x_adv > hi + _ABS_TOL).any()):
        raise AdvbenchError(f"{name} returned examples outside the input bounds {bounds}")
    over = lp_norm(x_adv - x, norm) > eps * (1 + _REL_TOL) + _ABS_TOL
    if bool(over.any()):
        raise AdvbenchError(f"{name} exceeded its {norm} budget on {int(over.sum())} samples")


def min_eps_search(attack: Attack, oracle: Oracle, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor,
                   target: torch.Tensor | None, norm: str, budget: float, x_adv: torch.Tensor,
                   success: torch.Tensor, search: SearchSettings,
                   sample_id: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample bracket [lo, hi] of the smallest budget at which the attack succeeds.

    Every probe is one batched attack call over the samples whose bracket is still wider than
    the resolution, each at its own ε: halving from the budget while it succeeds, doubling
    while it fails, bisecting once bracketed. `hi` is tightened to the norm of the adversarial
    example actually found, so it is always the size of a verified adversarial perturbation.
    """
    inf = torch.full_like(success, math.inf, dtype=x.dtype)
    hi = torch.where(success, torch.clamp(lp_norm(x_adv - x, norm), max=budget), inf)
    lo = torch.where(success, torch.zeros_like(hi), torch.full_like(hi, budget))
    ids = sample_id.to(x.device) if sample_id is not None else torch.arange(x.shape[0], device=x.device)
    resolution = search.resolution * budget
    max_eps = search.max_factor * budget
    for _ in range(search.max_probes):
        need = (hi - lo > resolution) & (lo < max_eps)
        idx = need.nonzero().squeeze(1)
        if idx.numel() == 0:
            break
        h, l = hi[idx], lo[idx]
        probe = torch.where(torch.isinf(h), torch.clamp(2 * l, max=max_eps), torch.where(l == 0, h / 2, (l + h) / 2))
        t = target[idx] if target is not None else None
        res = attack(oracle.subset(idx), x[idx], y[idx], eps=probe, norm=norm, target=t, sample_id=ids[idx])
        check_contract(res.x_adv, x[idx], probe, norm, oracle.bounds, type(attack).__name__)
        won = goal_met(_judge(model, res.x_adv).argmax(dim=1), y[idx], t)
        found = torch.minimum(probe, lp_norm(res.x_adv - x[idx], norm))
        hi[idx] = torch.where(won, torch.minimum(h, found), h)
        lo[idx] = torch.where(won, l, probe)
        lo = torch.minimum(lo, hi)
    return hi, lo


def _judge(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The deployed model's logits: how the engine decides success, outside any oracle's count."""
    with torch.inference_mode():
        return model(x).clone()


def cell_identity(cfg: DictConfig, threat: ThreatModel, attack: Attack) -> dict[str, Any]:
    """Everything that changes a cell's numbers; its hash names the part file."""
    return {
        "dataset": cfg.dataset.name,
        "n_samples": cfg.dataset.get("n_samples"),
        "model": cfg.model.name,
        "defense": cfg.defense.name,
        "attack": cfg.attack.name,
        "attack_params": attack.params(),
        "norm": threat.norm,
        "goal": threat.goal,
        "knowledge": threat.knowledge,
        "eps": threat.eps,
        "normalized_l2": threat.normalized_l2,
        "seed": int(cfg.seed),
        "shard": [int(cfg.shard.index), int(cfg.shard.count)],
        "search": OmegaConf.to_container(cfg.search),
    }


def cell_key(identity: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:12]


def part_path(records_dir: Path, identity: dict[str, Any]) -> Path:
    i = identity
    stem = f"{i['dataset']}_{i['defense']}_{i['attack']}_{i['norm']}_{i['goal']}_s{i['seed']}"
    if i["shard"][1] > 1:
        stem += f"_shard{i['shard'][0]}of{i['shard'][1]}"
    return records_dir / f"{stem}_{cell_key(i)}.parquet"


def build_threat(cfg: DictConfig, budgets: dict[str, Any]) -> ThreatModel:
    """Threat from cfg.threat; eps defaults to the data set's budget for the norm."""
    t = cfg.threat
    norm = str(t.norm)
    eps = t.get("eps")
    if eps is None:
        if norm not in budgets:
            raise AdvbenchError(f"dataset '{cfg.dataset.name}' has no default {norm} budget; set threat.eps")
        eps = budgets[norm]
    normalized = bool(budgets.get("l2_normalized", False)) if norm == "l2" else False
    return ThreatModel(norm=norm, goal=str(t.goal), knowledge=str(t.knowledge), eps=float(eps), normalized_l2=normalized)


def run_main(cfg: DictConfig) -> Path:
    """Hydra task of `advbench run`: one cell, records to parquet (skipped if present)."""
    set_threads(cfg.get("threads"))
    device = resolve_device(str(cfg.device))
    dataset = instantiate(cfg.dataset)
    threat = build_threat(cfg, dataset.budgets)
    attack: Attack = instantiate(cfg.attack.params)
    identity = cell_identity(cfg, threat, attack)
    out = part_path(Path(cfg.records_dir), identity)
    label = f"{cfg.dataset.name}/{cfg.defense.name}/{cfg.attack.name} {threat.norm} {threat.goal} ε={threat.eps:g}"
    if out.exists() and not cfg.force:
        console.print(f"[dim]skip {label}: records exist at {out} (force=true to redo)[/dim]", soft_wrap=True)
        return out

    model = load_defended_model(cfg, dataset).to(device)
    frame = evaluate_cell(cfg, dataset, model, attack, threat, identity, out, label, device)
    write_part(frame, out)
    shutil.rmtree(_partial_dir(out), ignore_errors=True)
    summarize(frame, label, out)
    return out


def load_defended_model(cfg: DictConfig, dataset: Any) -> torch.nn.Module:
    """The defense's model: an explicit `checkpoint=` path, else the cache (trained on demand)."""
    from advbench.defenses.training import load_trained_model
    from advbench.models import instantiate_model
    from advbench.models.checkpoint import load_checkpoint

    if cfg.get("checkpoint"):
        model = instantiate_model(cfg.model, dataset.num_classes, dataset.input_shape[0])
        load_checkpoint(Path(cfg.checkpoint), model)
        return model.eval().requires_grad_(False)
    return load_trained_model(cfg, dataset)


def _partial_dir(out: Path) -> Path:
    return out.parent / ".partial" / out.stem


def evaluate_cell(cfg: DictConfig, dataset: Any, model: torch.nn.Module, attack: Attack, threat: ThreatModel,
                  identity: dict[str, Any], out: Path, label: str, device: torch.device) -> pd.DataFrame:
    """Evaluate the cell chunk by chunk, reusing chunks a killed run already wrote."""
    eval_set = dataset.eval_set()
    shard_idx = list(range(int(cfg.shard.index), len(eval_set), int(cfg.shard.count)))
    chunk = int(cfg.chunk_size)
    partial = _partial_dir(out)
    search = SearchSettings(**OmegaConf.to_container(cfg.search))  # type: ignore[arg-type]
    run_id = str(cfg.get("run_id") or datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S"))
    static = {
        "run_id": run_id,
        "cell_key": cell_key(identity),
        "advbench_version": __version__,
        "dataset": identity["dataset"],
        "model": identity["model"],
        "defense": identity["defense"],
        "attack": identity["attack"],
        "attack_params": json.dumps(identity["attack_params"], sort_keys=True),
        "norm": threat.norm,
        "goal": threat.goal,
        "knowledge": threat.knowledge,
        "eps_budget": threat.eps,
        "strength_budget": int(getattr(attack, "steps", 1)),
        "seed": int(cfg.seed),
        "shard": int(cfg.shard.index),
        "device": str(device),
    }
    frames = []
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TimeRemainingColumn(), console=console, transient=True) as progress:
        task = progress.add_task(label, total=len(shard_idx))
        for c, start in enumerate(range(0, len(shard_idx), chunk)):
            chunk_file = partial / f"chunk-{c:05d}.parquet"
            ids = shard_idx[start:start + chunk]
            if chunk_file.exists():
                frames.append(read_records([chunk_file]))
                progress.advance(task, len(ids))
                continue
            rows = []
            loader = DataLoader(Subset(eval_set, ids), batch_size=int(cfg.batch_size), shuffle=False)
            for x, y, sample_id in loader:
                tic = time.perf_counter()
                x, y = x.to(device), y.to(device)
                target = target_classes(sample_id, y.cpu(), dataset.num_classes, int(cfg.seed)).to(device) \
                    if threat.targeted else None
                measured = evaluate_batch(attack, model, x, y, target, threat, search, sample_id=sample_id)
                seconds = (time.perf_counter() - tic) / len(y)
                rows.append(_batch_frame(measured, y.cpu(), sample_id, target, seconds))
                progress.advance(task, len(y))
            part = pd.concat(rows, ignore_index=True).assign(**static)
            write_part(part, chunk_file)
            frames.append(part)
    frame = pd.concat(frames, ignore_index=True)
    frame["created_at"] = pd.Timestamp.now(tz="UTC")
    return frame


def _batch_frame(measured: dict[str, torch.Tensor], y: torch.Tensor, sample_id: torch.Tensor,
                 target: torch.Tensor | None, seconds: float) -> pd.DataFrame:
    cols: dict[str, Any] = {
        "sample_id": sample_id.numpy(),
        "label": y.numpy(),
        "target": (target.cpu() if target is not None else torch.full_like(y, -1)).numpy(),
    }
    cols.update({k: v.numpy() for k, v in measured.items()})
    frame = pd.DataFrame(cols)
    frame["clean_correct"] = frame["clean_pred"] == frame["label"]
    frame["seconds"] = seconds
    return frame


def summarize(frame: pd.DataFrame, label: str, out: Path) -> None:
    """One line per cell: clean accuracy, accuracy/ASR at the budget, median min-ε."""
    clean = frame["clean_correct"].mean()
    robust = (frame["adv_pred"] == frame["label"]).mean()
    console.print(f"{label}: clean {clean:.1%}, adversarial accuracy {robust:.1%}, "
                  f"median min-ε {frame['min_eps'].median():.4g}, {len(frame)} samples -> {out}", soft_wrap=True)
