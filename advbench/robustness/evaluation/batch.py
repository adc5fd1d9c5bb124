"""One pool of samples under attack: the attack called at per-sample ε, its contract checked, its examples judged.

ε values are float64 threat units throughout; only the attack is handed raw norms in the input's
dtype. Judging is the deployed model's verdict, uncounted (a vote over draws on a randomized model).

A pool may hold more samples than one call should take (`call_rows`, the cell's `batch_size`):
every attack call and verdict then runs on consecutive pieces of at most `call_rows` of the rows
asked for. The minimum-ε search asks for all of a round's pending samples across the pool at once,
so its calls stay near the configured batch size while the pool drains, where a batch's own
probes would shrink with its pending samples. A sample's records do not depend on its companions
(its probes, random draws and noise follow its sample id), so pooling changes no record.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TypeVar

import torch

from advbench.core.errors import AdvbenchError, user_code_failed
from advbench.core.norms import Norm
from advbench.core.norms import norm as norm_of
from advbench.core.runtime import call_slices
from advbench.robustness.attacks.attack_contract import Attack, AttackResult
from advbench.robustness.attacks.minimum_norm import goal_margin
from advbench.robustness.attacks.model_draws import RowCalls
from advbench.robustness.attacks.oracles import Oracle
from advbench.robustness.attacks.votes import Vote, vote
from advbench.robustness.threat import ThreatModel

# Budget and bounds checks allow float rounding of the projection, nothing more.
_REL_TOL = 1e-5


_ABS_TOL = 1e-6


@dataclass
class Batch:
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
    call_rows: int | None = None
    """The most rows one attack call or verdict takes (None: the whole pool)."""

    @property
    def scale(self) -> float:
        return self.threat.scale(self.x)

    def raw(self, eps: torch.Tensor) -> torch.Tensor:
        """Threat-unit ε (float64) as the raw per-sample norm bound an attack works with."""
        return (eps * self.scale).to(self.x.dtype)

    def attack_at(self, idx: torch.Tensor, eps: torch.Tensor) -> AttackResult:
        """The attack on samples `idx` at per-sample ε (threat units), its cost counted per sample,
        in calls of at most `call_rows` samples, or in one for an attack whose model calls the
        oracle splits (`Attack.pooled_calls`): early stopping then refills its calls from the pool."""
        if self.attack.pooled_calls:  # its gradient calls split themselves (`Oracle.call_rows`): one call
            return self._attack_call(idx, eps)
        return concat([self._attack_call(idx[s], eps[s]) for s in call_slices(idx.shape[0], self.call_rows)])

    def _attack_call(self, idx: torch.Tensor, eps: torch.Tensor) -> AttackResult:
        budgeted = self.attack.kind == "budgeted"
        t = None if self.target is None else self.target[idx]
        try:
            res = self.attack(self.oracle.subset(idx), self.x[idx], self.y[idx], eps=self.raw(eps),
                              norm=self.threat.norm, target=t, sample_id=self.sample_id[idx])
        except SystemExit as exc:  # an attack of one's own calling sys.exit: said, not a silent end of the run
            raise user_code_failed(f"attack {type(self.attack).__name__}", "attacking a batch", exc) from None
        check_contract(res.x_adv, self.x[idx], self.raw(eps) if budgeted else None, self.threat.norm,
                       self.oracle.bounds, type(self.attack).__name__)
        return res

    def judge(self, x_adv: torch.Tensor, idx: torch.Tensor) -> Vote:
        """The deployed model's verdict on `x_adv` (a vote over `oracle.draws` passes), uncounted."""
        target = None if self.target is None else self.target[idx]
        verdict = pooled_vote(self.model, x_adv, self.y[idx], target, self.oracle.draws, calls=self.oracle.calls,
                              rows=idx, call_rows=self.call_rows)
        if not bool(torch.isfinite(verdict.logits).all()):
            raise AdvbenchError(f"the model returned NaN or infinite logits on {type(self.attack).__name__}'s examples")
        return verdict

    def margin(self, verdict: Vote, idx: torch.Tensor) -> torch.Tensor:
        """How far the verdict's mean logits are from the goal (float64, < 0 once met): the search's guide."""
        target = None if self.target is None else self.target[idx]
        return goal_margin(verdict.logits, self.y[idx], target).double()

    def norm(self, x_adv: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """‖x_adv − x‖ in threat units, float64."""
        return self.threat.ball.distance(x_adv.double(), self.x[idx].double()) / self.scale

    def strength(self, first: torch.Tensor, success: torch.Tensor) -> torch.Tensor:
        """first_success_strength: the attack's own where it has one, the full strength for a
        success it did not date, -1 for failures (so the strength curve ends at Table 3)."""
        full = torch.full_like(first, self.attack.strength_budget)
        return torch.where(success, torch.where(first >= 0, first, full), torch.full_like(first, -1))


_Part = TypeVar("_Part", AttackResult, Vote)


def concat(parts: list[_Part]) -> _Part:
    """Per-row results of consecutive calls as one: tensor fields (and dicts of them) concatenated; a
    field every call leaves None (AttackResult.pred of an attack the engine judges) stays None."""
    if len(parts) == 1:
        return parts[0]
    joined = {}
    for f in dataclasses.fields(parts[0]):
        values = [getattr(p, f.name) for p in parts]
        joined[f.name] = ({k: torch.cat([v[k] for v in values]) for k in values[0]} if isinstance(values[0], dict)
                          else None if values[0] is None else torch.cat(values))
    return type(parts[0])(**joined)


def pooled_vote(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, target: torch.Tensor | None, draws: int,
                *, calls: RowCalls, rows: torch.Tensor, call_rows: int | None) -> Vote:
    """`vote` over rows `rows` of a pool, in calls of at most `call_rows` rows."""
    return concat([vote(model, x[s], y[s], None if target is None else target[s], draws, calls=calls, rows=rows[s])
                   for s in call_slices(rows.shape[0], call_rows)])


def check_contract(x_adv: torch.Tensor, x: torch.Tensor, eps: torch.Tensor | None, norm: str | Norm,
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
    over = norm_of(norm).distance(x_adv, x) > eps * (1 + _REL_TOL) + _ABS_TOL
    if bool(over.any()):
        raise AdvbenchError(f"{name} exceeded its {norm} budget on {int(over.sum())} samples")
