"""Per-sample measurements of one batch: the budget run, the minimum ε, the verdicts, the costs.

`evaluate_batch` is the engine's core and the Python entry for a batch: it builds the oracle
of the threat's knowledge level, dispatches on the attack's kind and returns record columns.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from advbench.core.errors import AdvbenchError
from advbench.core.runtime import call_slices
from advbench.core.steps import clip, per_sample, project
from advbench.robustness.attacks.attack_contract import Attack, AttackResult
from advbench.robustness.attacks.model_draws import RowCalls
from advbench.robustness.attacks.oracles import build_oracle
from advbench.robustness.defenses.certify import certified_column
from advbench.robustness.evaluation.batch import Batch, pooled_vote
from advbench.robustness.evaluation.search import min_eps_search
from advbench.robustness.naming import NORM_AT
from advbench.robustness.specs import SearchSettings
from advbench.robustness.threat import ThreatModel, distances

_FRAME_COLUMNS = ("sample_id", "label", "target", "clean_correct", "seconds")
"""Record columns `_batch_frame` adds to what `evaluate_batch` measures."""


JUDGE_DRAWS = 20
"""Fresh passes a randomized model's verdict is voted over (`judge.draws`): an example is
adversarial when at least half of them meet the goal. Deterministic models are judged once."""


def evaluate_batch(attack: Attack, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor,
                   target: torch.Tensor | None, threat: ThreatModel, search: SearchSettings, *,
                   sample_id: torch.Tensor | None = None, substitute: torch.nn.Module | None = None,
                   draws: int = JUDGE_DRAWS, call_rows: int | None = None) -> dict[str, torch.Tensor | str]:
    """All per-sample measurements of one batch, keyed by record column (CPU tensors, one str).

    `call_rows`: the most samples one attack call or verdict takes (None: the whole batch); a
    cell hands in a pool of several batches with its `batch_size` here (`batch.Batch`).

    The attack sees only the oracle of `threat.knowledge`; success is judged here, on the
    deployed `model` itself, uncounted. The clean input counts as the probe at ε = 0: a sample
    it already fools has min_eps 0 and succeeds at the budget whatever the attack returned.
    Every example behind `adv_pred` and the `dist_*` columns lies within the budget.
    `certified`: whether interval bounds prove the ℓ∞ budget ball safe (NaN where IBP does not apply).

    A randomized `model` (`randomized = True`) is judged by a vote over `draws` fresh passes
    (`oracles.vote`), here and in the attack's own stopping rule; `adv_fraction` is the share
    of draws meeting the goal on the example behind the budget columns. Its passes, the attack's
    and the votes', draw by (sample id, how many passes the sample has had in this batch), so a
    sample's records do not depend on the batch, the chunk or a resume (`random.RowCalls`).
    """
    n = x.shape[0]
    ids = torch.arange(n, device=x.device) if sample_id is None else sample_id.to(x.device)
    measure = _MEASURES.get(attack.kind)
    if measure is None:
        raise AdvbenchError(f"{type(attack).__name__} has kind '{attack.kind}'; valid: {', '.join(_MEASURES)}")
    # An attack that judges itself (AutoAttack's judge=original) decides success; clean inputs get one pass, as there.
    draws = draws if getattr(model, "randomized", False) and not getattr(attack, "judges_itself", False) else 1
    calls, everyone = RowCalls(ids), torch.arange(n, device=x.device)
    correct = pooled_vote(model, x, y, None, draws, calls=calls, rows=everyone, call_rows=call_rows)
    if not bool(torch.isfinite(correct.logits).all()):
        raise AdvbenchError("the model returned NaN or infinite logits on clean inputs; check the checkpoint")
    clean = correct if target is None else pooled_vote(model, x, y, target, draws, calls=calls, rows=everyone,
                                                       call_rows=call_rows)
    oracle = build_oracle(threat.knowledge, model, n, substitute, num_classes=correct.logits.shape[1], draws=draws,
                          calls=calls, call_rows=call_rows)
    measured = measure(Batch(attack, oracle, model, x, y, target, threat, ids, clean, correct.pred, call_rows),
                       search)
    radius = threat.eps * threat.scale(x)
    measured["certified"] = torch.cat([certified_column(model, x[s], y[s], threat.norm, radius)
                                       for s in call_slices(n, call_rows)])
    return measured


def _measure_budgeted(b: Batch, search: SearchSettings) -> dict[str, torch.Tensor | str]:
    """The run at the budget, then the ε search: min_eps is the smallest succeeding probe."""
    everyone = torch.arange(b.x.shape[0], device=b.x.device)
    budget = torch.full((b.x.shape[0],), b.threat.eps, dtype=torch.float64, device=b.x.device)
    if search.enabled:
        b.oracle.remember_clean(b.x)
    res = b.attack_at(everyone, budget)
    verdict = b.judge(res.x_adv, everyone)
    own = res.pred is not None  # the attack judged itself (AutoAttack's judge=original): its verdicts stand
    won, margin = res.success if own else verdict.met, b.margin(verdict, everyone)
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
    if own:  # the pass that judged each sample: the attack's where it won, else the clean one (the original's y_adv)
        pred_at, fraction = torch.where(won, res.pred, b.clean.pred), torch.where(won, 1.0, b.clean.fraction)
    first = torch.where(fallback, torch.zeros_like(res.first_success), res.first_success)
    budget_cost = (b.oracle.grad_evals.clone(), b.oracle.queries.clone())
    if search.enabled:
        hi, lo, adv_norm = min_eps_search(b, hi, lo, adv_norm, margin, search)
    return _columns(b, res, (pred_at, fraction), x_at, hi, lo, adv_norm, first, budget_cost, "search")


def _measure_minimizing(b: Batch, search: SearchSettings) -> dict[str, torch.Tensor | str]:
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


_MEASURES: dict[str, Callable[[Batch, SearchSettings], dict[str, torch.Tensor | str]]] = {
    "budgeted": _measure_budgeted,
    "minimizing": _measure_minimizing,
}
"""How each attack kind (`Attack.kind`) yields its minimum ε."""


def _columns(b: Batch, res: AttackResult, at_budget: tuple[torch.Tensor, torch.Tensor], x_at: torch.Tensor,
             min_eps: torch.Tensor, min_eps_lo: torch.Tensor, adv_norm: torch.Tensor, first: torch.Tensor,
             budget_cost: tuple[torch.Tensor, torch.Tensor], source: str) -> dict[str, torch.Tensor | str]:
    """The record columns; `at_budget` is the verdict's (label, share of draws meeting the goal) on `x_at`.

    A randomized model's `recheck_fraction` is a second vote on `x_at`, as large and as uncounted as the
    first, after every pass the sample had (later call indices, so independent draws): a report that picks
    each sample's worst example by the first votes re-judges it by this one, which the pick cannot bias.
    """
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
        **{f"dist_{name}": v for name, v in d.items()},
    }
    if getattr(b.model, "randomized", False):
        out["recheck_fraction"] = b.judge(x_at, torch.arange(x_at.shape[0], device=x_at.device)).fraction
    clash = sorted(set(res.info) & {*out, *_FRAME_COLUMNS, "min_eps_source", "grad_mode"})
    if clash:
        raise AdvbenchError(f"{type(b.attack).__name__} reports info columns {', '.join(clash)} that the engine writes")
    # Attacks see raw norms; their per-checkpoint norms are recorded in threat units, as min_eps is.
    out.update({k: v.double() / b.scale if k.startswith(NORM_AT) else v for k, v in res.info.items()})
    out = {k: v.detach().cpu() for k, v in out.items()}
    out["min_eps_source"] = source
    out["grad_mode"] = b.oracle.grad_mode
    return out
