"""Runs one benchmark cell: batches, the fixed-budget run, the minimum-ε search, records.

A cell is dataset × defense × attack × threat model × seed (× shard). Its records are written
in chunks under a hidden `.partial/` folder while it runs, then merged into one part file:
a killed run loses at most the chunk in flight, and a rerun picks up where it stopped.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
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
from advbench.attacks.base import Attack, AttackResult
from advbench.attacks.optimized import goal_margin
from advbench.attacks.oracles import Oracle, Vote, build_oracle, vote
from advbench.attacks.steps import clip, lp_norm, per_sample, project
from advbench.curves import NORM_AT, category_label
from advbench.data.targets import target_classes
from advbench.defenses.certify import certified_column
from advbench.defenses.masking import cell_flags
from advbench.defenses.wrappers import WRAPPERS
from advbench.errors import AdvbenchError
from advbench.gate import gate_cell
from advbench.keys import content_key, dataset_identity, file_digest, model_identity, plain
from advbench.records import write_part
from advbench.resume import CellFiles, ChunkStore, sample_ids, sweep_orphans
from advbench.runtime import as_input, batch_size, deploy, execution_identity, resolve_device, set_threads
from advbench.substitute import load_substitute, substitute_identity
from advbench.threat import ThreatModel, distances

console = Console(stderr=True)

# Budget and bounds checks allow float rounding of the projection, nothing more.
_REL_TOL = 1e-5
_ABS_TOL = 1e-6

_FRAME_COLUMNS = ("sample_id", "label", "target", "clean_correct", "seconds")
"""Record columns `_batch_frame` adds to what `evaluate_batch` measures."""

DEFENSE_LABELS = ("name", "description", "category", "threat_model")
"""Keys of a `conf/defense` YAML that describe it and never change a number (not in cell keys)."""


JUDGE_DRAWS = 20
"""Fresh passes a randomized model's verdict is voted over (`judge.draws`): an example is
adversarial when at least half of them meet the goal. Deterministic models are judged once."""

SEARCH_METHODS = ("margin", "bisect")
"""How the minimum-ε search places its probes (`search.method`): see `min_eps_search`."""


@dataclass(frozen=True)
class SearchSettings:
    """Minimum-ε search of budgeted attacks: probes of the attack at other ε, placed by `method`.

    `resolution` is the final bracket width as a fraction of the budget; `max_factor` caps
    the upward search at that multiple of the budget (beyond it min_eps is inf).
    """

    enabled: bool = True
    resolution: float = 0.05
    max_factor: float = 4.0
    max_probes: int = 12
    method: str = "margin"

    def __post_init__(self) -> None:
        if self.method not in SEARCH_METHODS:
            raise AdvbenchError(f"search.method is '{self.method}'; valid: {', '.join(SEARCH_METHODS)}")


@dataclass
class _Batch:
    """One batch under attack, and the three things every measurement needs of it.

    ε values are float64 in threat units throughout (the budget is `threat.eps` itself), so
    a sample that succeeds at the budget records min_eps == eps_budget bit for bit; only the
    attack is handed its ε as raw norms in the input's dtype.
    """

    attack: Attack
    oracle: Oracle
    model: torch.nn.Module
    x: torch.Tensor
    y: torch.Tensor
    target: torch.Tensor | None
    threat: ThreatModel
    sample_id: torch.Tensor
    clean: Vote
    """The clean input's verdict under the cell's goal (the probe at ε = 0)."""
    clean_pred: torch.Tensor
    """The clean prediction: the label most draws give, when it is the true one the majority's."""

    @property
    def scale(self) -> float:
        return self.threat.scale(self.x)

    def raw(self, eps: torch.Tensor) -> torch.Tensor:
        """Threat-unit ε (float64) as the raw per-sample norm bound an attack works with."""
        return (eps * self.scale).to(self.x.dtype)

    def attack_at(self, idx: torch.Tensor, eps: torch.Tensor) -> AttackResult:
        """The attack on samples `idx` at per-sample ε (threat units), its cost counted per sample."""
        budgeted = self.attack.kind == "budgeted"
        t = None if self.target is None else self.target[idx]
        res = self.attack(self.oracle.subset(idx), self.x[idx], self.y[idx], eps=self.raw(eps), norm=self.threat.norm,
                          target=t, sample_id=self.sample_id[idx])
        check_contract(res.x_adv, self.x[idx], self.raw(eps) if budgeted else None, self.threat.norm,
                       self.oracle.bounds, type(self.attack).__name__)
        return res

    def judge(self, x_adv: torch.Tensor, idx: torch.Tensor) -> Vote:
        """The deployed model's verdict on `x_adv` (a vote over `oracle.draws` passes), uncounted."""
        target = None if self.target is None else self.target[idx]
        verdict = vote(self.model, x_adv, self.y[idx], target, self.oracle.draws)
        if not bool(torch.isfinite(verdict.logits).all()):
            raise AdvbenchError(f"the model returned NaN or infinite logits on {type(self.attack).__name__}'s examples")
        return verdict

    def margin(self, verdict: Vote, idx: torch.Tensor) -> torch.Tensor:
        """How far the verdict's mean logits are from the goal (float64, < 0 once met): the search's guide."""
        target = None if self.target is None else self.target[idx]
        return goal_margin(verdict.logits, self.y[idx], target).double()

    def norm(self, x_adv: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """‖x_adv − x‖ in threat units, float64."""
        return lp_norm(x_adv.double() - self.x[idx].double(), self.threat.norm) / self.scale

    def strength(self, first: torch.Tensor, success: torch.Tensor) -> torch.Tensor:
        """first_success_strength: the attack's own where it has one, the full strength for a
        success it did not date, -1 for failures (so the strength curve ends at Table 3)."""
        full = torch.full_like(first, int(getattr(self.attack, "steps", 1)))
        return torch.where(success, torch.where(first >= 0, first, full), torch.full_like(first, -1))


def evaluate_batch(attack: Attack, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor,
                   target: torch.Tensor | None, threat: ThreatModel, search: SearchSettings, *,
                   sample_id: torch.Tensor | None = None, substitute: torch.nn.Module | None = None,
                   draws: int = JUDGE_DRAWS) -> dict[str, torch.Tensor | str]:
    """All per-sample measurements of one batch, keyed by record column (CPU tensors, one str).

    The attack sees only the oracle of `threat.knowledge`; success is judged here, on the
    deployed `model` itself, uncounted. The clean input counts as the probe at ε = 0: a sample
    it already fools has min_eps 0 and succeeds at the budget whatever the attack returned.
    Every example behind `adv_pred` and the `dist_*` columns lies within the budget.
    `certified`: whether interval bounds prove the ℓ∞ budget ball safe (NaN where IBP does not apply).

    A randomized `model` (`randomized = True`) is judged by a vote over `draws` fresh passes
    (`oracles.vote`), here and in the attack's own stopping rule; `adv_fraction` is the share
    of draws meeting the goal on the example behind the budget columns.
    """
    n = x.shape[0]
    ids = torch.arange(n, device=x.device) if sample_id is None else sample_id.to(x.device)
    measure = _MEASURES.get(attack.kind)
    if measure is None:
        raise AdvbenchError(f"{type(attack).__name__} has kind '{attack.kind}'; valid: {', '.join(_MEASURES)}")
    draws = draws if getattr(model, "randomized", False) else 1
    correct = vote(model, x, y, None, draws)
    if not bool(torch.isfinite(correct.logits).all()):
        raise AdvbenchError("the model returned NaN or infinite logits on clean inputs; check the checkpoint")
    clean = correct if target is None else vote(model, x, y, target, draws)
    oracle = build_oracle(threat.knowledge, model, n, substitute, num_classes=correct.logits.shape[1], draws=draws)
    measured = measure(_Batch(attack, oracle, model, x, y, target, threat, ids, clean, correct.pred), search)
    measured["certified"] = certified_column(model, x, y, threat.norm, threat.eps * threat.scale(x))
    return measured


def _measure_budgeted(b: _Batch, search: SearchSettings) -> dict[str, torch.Tensor | str]:
    """The run at the budget, then the ε search: min_eps is the smallest succeeding probe."""
    everyone = torch.arange(b.x.shape[0], device=b.x.device)
    budget = torch.full((b.x.shape[0],), b.threat.eps, dtype=torch.float64, device=b.x.device)
    if search.enabled:
        b.oracle.remember_clean(b.x)
    res = b.attack_at(everyone, budget)
    verdict = b.judge(res.x_adv, everyone)
    won, margin = verdict.met, b.margin(verdict, everyone)
    clean_adv = b.clean.met
    zero, inf, nan = (torch.full_like(budget, v) for v in (0.0, math.inf, math.nan))
    hi = torch.where(clean_adv, zero, torch.where(won, budget, inf))
    lo = torch.where(clean_adv, nan, torch.where(won, zero, budget))
    adv_norm = torch.where(clean_adv, zero, torch.where(won, b.norm(res.x_adv, everyone), inf))
    # Behind the budget columns: the attack's example, or the clean input where only it fools the model.
    fallback = clean_adv & ~won
    x_at = torch.where(per_sample(fallback, b.x), b.x, res.x_adv)
    pred_at = torch.where(fallback, b.clean.pred, verdict.pred)
    fraction = torch.where(fallback, b.clean.fraction, verdict.fraction)
    first = torch.where(fallback, torch.zeros_like(res.first_success), res.first_success)
    budget_cost = (b.oracle.grad_evals.clone(), b.oracle.queries.clone())
    if search.enabled:
        hi, lo, adv_norm = min_eps_search(b, hi, lo, adv_norm, margin, search)
    return _columns(b, res, (pred_at, fraction), x_at, hi, lo, adv_norm, first, budget_cost, "search")


def _measure_minimizing(b: _Batch, search: SearchSettings) -> dict[str, torch.Tensor | str]:
    """One run: min_eps is the norm of the example the model confirms; no search over ε.

    Where that example lies beyond the budget, its projection onto the budget ball stands for
    the attack at the budget; if the projection fools the model too, it is a verified
    example within the budget and bounds min_eps (so success at the budget ⇔ min_eps ≤ budget).
    """
    everyone = torch.arange(b.x.shape[0], device=b.x.device)
    budget = torch.full((b.x.shape[0],), b.threat.eps, dtype=torch.float64, device=b.x.device)
    res = b.attack_at(everyone, budget)
    verdict = b.judge(res.x_adv, everyone)
    clean_adv = b.clean.met
    inf = torch.full_like(budget, math.inf)
    found = torch.where(clean_adv, torch.zeros_like(budget), torch.where(verdict.met, b.norm(res.x_adv, everyone), inf))
    x_found = torch.where(per_sample(clean_adv, b.x), b.x, res.x_adv)
    pred_found = torch.where(clean_adv, b.clean.pred, verdict.pred)
    fraction_found = torch.where(clean_adv, b.clean.fraction, verdict.fraction)
    within = found <= budget
    projected = clip(project(x_found, b.x, b.raw(budget), b.threat.norm), b.oracle.bounds)
    at_projection = b.judge(projected, everyone)
    rescued = ~within & at_projection.met
    proj_norm = torch.where(rescued, b.norm(projected, everyone), inf)
    min_eps = torch.where(rescued, torch.minimum(proj_norm, budget), found)
    adv_norm = torch.minimum(found, proj_norm)
    x_at = torch.where(per_sample(within, b.x), x_found, projected)
    pred_at = torch.where(within, pred_found, at_projection.pred)
    fraction = torch.where(within, fraction_found, at_projection.fraction)
    first = torch.where(clean_adv, torch.zeros_like(res.first_success), res.first_success)
    lo = torch.full_like(budget, math.nan)
    return _columns(b, res, (pred_at, fraction), x_at, min_eps, lo, adv_norm, first,
                    (b.oracle.grad_evals.clone(), b.oracle.queries.clone()), "norm")


_MEASURES: dict[str, Callable[[_Batch, SearchSettings], dict[str, torch.Tensor | str]]] = {
    "budgeted": _measure_budgeted,
    "minimizing": _measure_minimizing,
}
"""How each attack kind (`Attack.kind`) yields its minimum ε."""


def _columns(b: _Batch, res: AttackResult, at_budget: tuple[torch.Tensor, torch.Tensor], x_at: torch.Tensor,
             min_eps: torch.Tensor, min_eps_lo: torch.Tensor, adv_norm: torch.Tensor, first: torch.Tensor,
             budget_cost: tuple[torch.Tensor, torch.Tensor], source: str) -> dict[str, torch.Tensor | str]:
    """The record columns; `at_budget` is the verdict's (label, share of draws meeting the goal) on `x_at`."""
    success = min_eps <= b.threat.eps
    d = distances(x_at, b.x)
    out: dict[str, torch.Tensor | str] = {
        "clean_pred": b.clean_pred,
        "success_at_budget": success,
        "adv_pred": at_budget[0],
        "adv_fraction": at_budget[1],
        "min_eps": min_eps,
        "min_eps_lo": min_eps_lo,
        "adv_norm": adv_norm,
        "first_success_strength": b.strength(first, success),
        "grad_evals": b.oracle.grad_evals,
        "search_grad_evals": b.oracle.grad_evals - budget_cost[0],
        "queries": b.oracle.queries,
        "search_queries": b.oracle.queries - budget_cost[1],
        "grad_reuses": b.oracle.grad_reuses,
        "judge_draws": torch.full_like(b.oracle.grad_reuses, b.oracle.draws),
        "dist_linf": d["linf"],
        "dist_l2": d["l2"],
        "dist_l2_norm": d["l2_norm"],
    }
    clash = sorted(set(res.info) & {*out, *_FRAME_COLUMNS, "min_eps_source", "grad_mode"})
    if clash:
        raise AdvbenchError(f"{type(b.attack).__name__} reports info columns {', '.join(clash)} that the engine writes")
    # Attacks see raw norms; their per-checkpoint norms are recorded in threat units, as min_eps is.
    out.update({k: v.double() / b.scale if k.startswith(NORM_AT) else v for k, v in res.info.items()})
    out = {k: v.detach().cpu() for k, v in out.items()}
    out["min_eps_source"] = source
    out["grad_mode"] = b.oracle.grad_mode
    return out


def check_contract(x_adv: torch.Tensor, x: torch.Tensor, eps: torch.Tensor | None, norm: str,
                   bounds: tuple[float, float], name: str) -> None:
    """An attack may never leave the input bounds, nor its budget `eps` (None: a minimizing
    attack, which has none); if one does, stop loudly."""
    if not bool(torch.isfinite(x_adv).all()):
        raise AdvbenchError(f"{name} returned non-finite values")
    lo, hi = bounds
    if bool((x_adv < lo - _ABS_TOL).any()) or bool((x_adv > hi + _ABS_TOL).any()):
        raise AdvbenchError(f"{name} returned examples outside the input bounds {bounds}")
    if eps is None:
        return
    over = lp_norm(x_adv - x, norm) > eps * (1 + _REL_TOL) + _ABS_TOL
    if bool(over.any()):
        raise AdvbenchError(f"{name} exceeded its {norm} budget on {int(over.sum())} samples")


def min_eps_search(b: _Batch, hi: torch.Tensor, lo: torch.Tensor, adv_norm: torch.Tensor, margin: torch.Tensor,
                   search: SearchSettings) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Narrow each sample's bracket of probed ε values (float64, threat units).

    `hi` is the smallest probe at which the attack succeeded (inf: none yet), `lo` the largest
    probe below it at which it failed (0: the clean input, when every probe below `hi`
    succeeded; NaN: nothing below, hi is 0); `margin` is the deployed model's goal margin on
    the budget run's example. Every probe is one batched attack call, from scratch, over the
    samples whose bracket is wider than the resolution, each at its own ε strictly inside its
    bracket. A failed budget run is never probed below, and a succeeded one never above, so
    success at the budget ⇔ hi ≤ budget. `adv_norm` tracks the smallest adversarial example
    any probe verified.

    `bisect` halves from the budget while it succeeds, doubles while it fails, then bisects.
    `margin` places each probe at the root of the final margin as a function of ε, estimated
    from the probes so far (`_margin_probe`), for as long as bisection could still close the
    sample's bracket with the probes left; then it bisects.
    """
    resolution = search.resolution * b.threat.eps
    wider = resolution * (1 + 1e-12)  # a probe at lo + resolution closes the bracket despite rounding
    max_eps = search.max_factor * b.threat.eps
    hi, lo, adv_norm = hi.clone(), lo.clone(), adv_norm.clone()
    everyone = torch.arange(b.x.shape[0], device=b.x.device)
    m0 = b.margin(b.clean, everyone)
    m_lo = torch.where(lo > 0, margin, m0)   # the failing end's margin: the budget run's, or the clean input's
    m_hi = torch.where(torch.isfinite(hi), margin, math.nan)
    for round_ in range(search.max_probes):
        idx = ((hi - lo > wider) & (lo < max_eps)).nonzero().squeeze(1)
        if idx.numel() == 0:
            break
        h, l = hi[idx], lo[idx]
        probe = torch.where(torch.isinf(h), torch.clamp(2 * l, max=max_eps), (l + h) / 2)
        if search.method == "margin":
            placed = _margin_probe(l, h, m0[idx], m_lo[idx], m_hi[idx], adv_norm[idx], resolution, max_eps)
            # Guided only while bisection could still close the bracket with the probes left after this one.
            spare = search.max_probes - round_ - 1 >= _bisection_probes(l, h, wider, max_eps)
            probe = torch.where(torch.isfinite(placed) & spare, placed, probe)
        res = b.attack_at(idx, probe)
        verdict = b.judge(res.x_adv, idx)
        won, m = verdict.met, b.margin(verdict, idx)
        hi[idx] = torch.where(won, probe, h)
        lo[idx] = torch.where(won, l, probe)
        m_hi[idx] = torch.where(won, m, m_hi[idx])
        m_lo[idx] = torch.where(won, m_lo[idx], m)
        adv_norm[idx] = torch.where(won, torch.minimum(adv_norm[idx], b.norm(res.x_adv, idx)), adv_norm[idx])
    return hi, lo, adv_norm


def _bisection_probes(lo: torch.Tensor, hi: torch.Tensor, resolution: float, max_eps: float) -> torch.Tensor:
    """Probes bisection needs at most to close [lo, hi] (doubling up to max_eps first when hi is inf)."""
    bisect = lambda width: torch.ceil(torch.log2(torch.clamp(width / resolution, min=1.0)))  # noqa: E731
    doubling = torch.ceil(torch.log2(torch.clamp(max_eps / lo, min=1.0)))
    return torch.where(torch.isinf(hi), doubling + bisect(torch.full_like(lo, max_eps / 2)), bisect(hi - lo))


_SPREAD = 0.03
"""How far below (above, with no success yet) its estimate a probe goes, as a fraction of the
estimate's distance from the failing end: estimates from a failure near the root are within a few
percent. Chosen on the digits benchmark: natural BIM ℓ∞ costs 1.57, 1.59, 1.95 full runs at 0.03,
0.06, 0.1 (before `_SURFACE` and `_GRID`)."""

_SURFACE = 0.99
"""An example at a norm above this fraction of its probe's ε counts as on the ball's surface."""

_GRID = 4
"""Guided probes lie on multiples of resolution / _GRID (so does the budget: 1 / resolution is whole)."""


def _margin_probe(lo: torch.Tensor, hi: torch.Tensor, m0: torch.Tensor, m_lo: torch.Tensor, m_hi: torch.Tensor,
                  nu: torch.Tensor, resolution: float, max_eps: float) -> torch.Tensor:
    """The next probe per sample from the final margins seen so far (NaN: no usable estimate).

    Estimates of the root r of margin(ε): the line through the clean margin `m0` (ε = 0) and
    the failing end's `m_lo` (extrapolated; exact for a linear margin), and regula falsi between
    the failing end and the smallest verified example (norm `nu`, margin `m_hi` <= 0); the
    smaller wins. The probe then aims to end the search in two steps: one failure just below r
    and one success within the resolution above it, or the closing probe itself when r lies
    within the resolution of an end.
    """
    slope = (m0 - m_lo) / lo
    extrapolated = torch.where((lo > 0) & (slope > 0), lo + m_lo / slope, math.inf)
    ref = torch.where(torch.isfinite(nu) & (nu > lo), nu, hi)
    falsi = torch.where(torch.isfinite(ref) & (m_hi < 0) & (m_lo > 0), lo + (ref - lo) * m_lo / (m_lo - m_hi), math.inf)
    r = torch.minimum(extrapolated, falsi)
    spread = _SPREAD * (r - lo)
    up = torch.isinf(hi)
    # no success yet: probe above the estimate (a success), up to max_eps
    above = torch.clamp(torch.maximum(r + spread, lo + resolution), max=max_eps)
    # bracketed: the closing success from lo, the closing failure below hi, or a failure just below r
    below = torch.where(r + spread <= lo + resolution, lo + resolution,
                        torch.where(r - spread >= hi - resolution, hi - resolution, r - spread))
    # With no failure yet and the example on the ball's surface, nothing measured says how far below hi the
    # root lies (an early-stopped success's margin is barely negative): probe no higher than halfway.
    blind = (lo == 0) & ~(nu < hi * _SURFACE)
    below = torch.where(blind, torch.minimum(below, hi / 2), below)
    probe = torch.where(up, above, below)
    # On a grid of resolution / _GRID, which the bracket's ends (0, the budget, earlier probes) lie on too:
    # the last bits of a margin change with the batch a sample is in, and must not move its probes.
    step = resolution / _GRID
    probe = torch.where(up, torch.ceil(probe / step - 1e-9), torch.floor(probe / step + 1e-9)) * step
    inside = torch.isfinite(r) & (probe > lo + step / 2) & (probe < hi - step / 2)
    return torch.where(inside, probe, math.nan)


def cell_identity(cfg: DictConfig, threat: ThreatModel, attack: Attack) -> dict[str, Any]:
    """Everything that changes a cell's numbers; its hash names the part file.

    Names are labels for the file name; the numbers are fixed by the configs behind them
    (data root, split, subset, model, recipe) and by the weights (see `weights_identity`).
    """
    return {
        "dataset": cfg.dataset.name,
        "dataset_config": dataset_identity(cfg.dataset, evaluation=True),
        "model": cfg.model.name,
        "model_config": model_identity(cfg.model),
        "defense": cfg.defense.name,
        "defense_config": {k: v for k, v in plain(cfg.defense).items() if k not in DEFENSE_LABELS},
        "weights": weights_identity(cfg),
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
        **judge_identity(cfg),
        **execution_identity(str(cfg.get("precision", "fp32")), bool(cfg.get("channels_last", False))),
        **substitute_identity(cfg, threat),
    }


def judge_draws(cfg: DictConfig) -> int:
    """`judge.draws` of the run (JUDGE_DRAWS when a config predates the key)."""
    return int(OmegaConf.select(cfg, "judge.draws", default=JUDGE_DRAWS))


def judge_identity(cfg: DictConfig) -> dict[str, int]:
    """The vote's size where it changes numbers: only behind a randomized wrapper, so the
    cells of deterministic models keep their keys."""
    wrapper = plain(cfg.defense.get("wrapper")) or {}
    randomized = getattr(WRAPPERS.get(wrapper.get("type")), "randomized", False)
    return {"judge_draws": judge_draws(cfg)} if randomized else {}


def weights_identity(cfg: DictConfig) -> dict[str, str]:
    """The bytes of an explicit `checkpoint=`, else the content key of the cache entry."""
    from advbench.defenses.training import checkpoint_key

    if cfg.get("checkpoint"):
        path = Path(cfg.checkpoint)
        if not path.is_file():
            raise AdvbenchError(f"checkpoint '{path}' not found")
        return {"checkpoint_sha256": file_digest(path)}
    return {"cache_key": checkpoint_key(cfg)}


def cell_key(identity: dict[str, Any]) -> str:
    return content_key(identity)


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


def _in_sweep() -> bool:
    """Whether this cell is one job of a `-m` sweep (which skips cells its attack does not support)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def run_main(cfg: DictConfig) -> Path | None:
    """Hydra task of `advbench run`: one cell, records to parquet (skipped if present).

    None: a sweep's cell that the attack does not support (norm, knowledge or goal), skipped
    with one line so that presets can sweep attacks × threats.
    """
    set_threads(cfg.get("threads"))
    device = resolve_device(str(cfg.device))
    dataset = instantiate(cfg.dataset)
    threat = build_threat(cfg, dataset.budgets)
    attack: Attack = instantiate(cfg.attack.params)
    label = f"{cfg.dataset.name}/{cfg.defense.name}/{cfg.attack.name} {threat.norm} {threat.goal} ε={threat.eps:g}"
    if threat.knowledge != "white":
        label += f" ({threat.knowledge})"
    why = attack.unsupported(threat.norm, threat.knowledge, threat.goal)
    if why is not None:
        if not _in_sweep():
            raise AdvbenchError(why)
        console.print(f"[dim]skip {label}: {why}[/dim]", soft_wrap=True)
        return None
    identity = cell_identity(cfg, threat, attack)
    out = part_path(Path(cfg.records_dir), identity)
    files = CellFiles(out)
    if out.parent.is_dir():
        sweep_orphans(out.parent)
    # Under the cell's lock a concurrent run of the same cell waits here, then skips.
    with files.lock():
        files.remove_orphans()
        if cfg.force:
            files.clear_partial()
        elif files.part_is_readable():
            files.clear_partial()
            console.print(f"[dim]skip {label}: records exist at {out} (force=true to redo)[/dim]", soft_wrap=True)
            gate_cell(cfg.get("gate"), out, label, in_sweep=_in_sweep())
            return out
        execution = {"precision": str(cfg.get("precision", "fp32")), "channels_last": bool(cfg.get("channels_last", False))}
        model = deploy(load_defended_model(cfg, dataset).to(device), **execution)
        substitute = load_substitute(cfg, dataset, threat)
        frame = evaluate_cell(cfg, dataset, model, attack, threat, identity, out, label, device,
                              substitute=None if substitute is None else deploy(substitute.to(device), **execution))
        write_part(frame, out)
        files.clear_partial()
    summarize(frame, label, out)
    gate_cell(cfg.get("gate"), out, label, in_sweep=_in_sweep())
    return out


def load_defended_model(cfg: DictConfig, dataset: Any) -> torch.nn.Module:
    """The defense's model: an explicit `checkpoint=` path, else the cache (trained on demand),
    behind the defense's `wrapper:` if it has one (the cache entry is then its `base:`'s)."""
    from advbench.defenses.training import build_defended_model, load_trained_model
    from advbench.defenses.wrappers import wrap
    from advbench.models.checkpoint import load_checkpoint

    if cfg.get("checkpoint"):
        model = build_defended_model(cfg.model, cfg.defense.get("recipe"), dataset.num_classes, dataset.input_shape[0])
        load_checkpoint(Path(cfg.checkpoint), model)
        model = model.eval().requires_grad_(False)
    else:
        model = load_trained_model(cfg, dataset)
    return wrap(model, plain(cfg.defense.get("wrapper")), seed=int(cfg.seed))


def evaluate_cell(cfg: DictConfig, dataset: Any, model: torch.nn.Module, attack: Attack, threat: ThreatModel,
                  identity: dict[str, Any], out: Path, label: str, device: torch.device,
                  substitute: torch.nn.Module | None = None) -> pd.DataFrame:
    """Evaluate the cell chunk by chunk, reusing the verified chunks a killed run wrote.

    `substitute` is the model transfer attacks craft on (None for other knowledge levels).
    """
    eval_set = dataset.eval_set()
    positions = list(range(int(cfg.shard.index), len(eval_set), int(cfg.shard.count)))
    chunk = int(cfg.chunk_size)
    if chunk < 1:
        raise AdvbenchError(f"chunk_size must be >= 1, got {chunk}")
    ids = sample_ids(eval_set)
    store = ChunkStore(CellFiles(out).partial, cell_key(identity), __version__, [ids[p] for p in positions])
    store.load()
    search = SearchSettings(**OmegaConf.to_container(cfg.search))  # type: ignore[arg-type]
    run_id = str(cfg.get("run_id") or datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S"))
    static = {
        "run_id": run_id,
        "cell_key": cell_key(identity),
        "advbench_version": __version__,
        "dataset": identity["dataset"],
        "model": identity["model"],
        "defense": identity["defense"],
        "defense_category": category_label(plain(cfg.defense).get("category")),
        "attack": identity["attack"],
        "attack_params": json.dumps(identity["attack_params"], sort_keys=True),
        "norm": threat.norm,
        "goal": threat.goal,
        "knowledge": threat.knowledge,
        "eps_budget": threat.eps,
        "strength_budget": int(getattr(attack, "steps", 1)),
        "seed": int(cfg.seed),
        "shard": int(cfg.shard.index),
        "shard_count": int(cfg.shard.count),
        "device": str(device),
        "precision": str(getattr(model, "precision", "fp32")),
        "channels_last": bool(getattr(model, "channels_last", False)),
    }
    batch = batch_size(cfg.batch_size, model, eval_set[positions[0]][0] if positions else torch.zeros(0),
                       min(len(positions), chunk), device)
    if cfg.batch_size == "auto":
        console.print(f"[dim]{label}: batch_size=auto -> {batch} on {device}[/dim]", soft_wrap=True)
    static.update(cell_flags(model, eval_set, positions[:batch], device, label=label,
                             warn_user=threat.knowledge == "white"))
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TimeRemainingColumn(), console=console, transient=True) as progress:
        task = progress.add_task(label, total=len(positions))
        while todo := store.missing():
            progress.update(task, completed=len(positions) - len(todo))
            rows = []
            loader = DataLoader(Subset(eval_set, [positions[i] for i in todo[:chunk]]),
                                batch_size=batch, shuffle=False)
            for x, y, sample_id in loader:
                tic = time.perf_counter()
                x, y = as_input(model, x.to(device)), y.to(device)
                target = target_classes(sample_id, y.cpu(), dataset.num_classes, int(cfg.seed)).to(device) \
                    if threat.targeted else None
                measured = evaluate_batch(attack, model, x, y, target, threat, search, sample_id=sample_id,
                                          substitute=substitute, draws=judge_draws(cfg))
                seconds = (time.perf_counter() - tic) / len(y)
                rows.append(_batch_frame(measured, y.cpu(), sample_id, target, seconds))
                progress.advance(task, len(y))
            store.add(pd.concat(rows, ignore_index=True).assign(**static))
    frame = store.merged()
    frame["created_at"] = pd.Timestamp.now(tz="UTC")
    return frame


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


def summarize(frame: pd.DataFrame, label: str, out: Path) -> None:
    """One line per cell: clean accuracy, accuracy/ASR at the budget, certified accuracy where IBP applies, median min-ε."""
    clean = frame["clean_correct"].mean()
    robust = (frame["adv_pred"] == frame["label"]).mean()
    verified = frame["certified"].dropna() if "certified" in frame else pd.Series(dtype=float)
    proven = f", certified {verified.mean():.1%}" if len(verified) else ""
    console.print(f"{label}: clean {clean:.1%}, adversarial accuracy {robust:.1%}{proven}, "
                  f"median min-ε {frame['min_eps'].median():.4g}, {len(frame)} samples -> {out}", soft_wrap=True)
