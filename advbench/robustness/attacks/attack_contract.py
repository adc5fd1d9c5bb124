"""What every attack sees (an oracle) and returns (an AttackResult).

The base class owns `__call__`: it checks inputs once, so subclasses implement `run` and
never see a raw model, only an oracle (`advbench.robustness.attacks.oracles`) of the knowledge levels
they declare; the oracle counts their cost per sample.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple

import torch

from advbench.core import hyperparameters as hyper
from advbench.core.errors import AdvbenchError
from advbench.robustness.attacks.oracles import Oracle
from advbench.robustness.threat import GOALS, goal_met


@dataclass
class AttackResult:
    """Per-sample outcome of one batched attack call.

    `success` refers to the returned `x_adv`. `first_success` is the iteration after which the
    sample first met the goal within the budget `eps` (0: already adversarial before any step,
    -1: never). `info` holds extra per-sample record columns (name -> tensor (n,)). Cost is not
    here: the oracle counts it. `pred`: for an attack that judges itself (`judges_itself`), the label
    of the pass that called each successful sample adversarial (-1 elsewhere); None otherwise.
    """

    x_adv: torch.Tensor
    success: torch.Tensor
    first_success: torch.Tensor
    info: dict[str, torch.Tensor] = field(default_factory=dict)
    pred: torch.Tensor | None = None


GRADIENT_KNOWLEDGE = ("white", "transfer")
"""Knowledge levels whose attacks spend gradient evaluations (transfer: of the substitute); the
others spend queries of the target."""


class Cost(NamedTuple):
    """Per-sample cost: gradient evaluations (forward + backward) and forward-only queries."""

    grad_evals: int
    queries: int

    def __add__(self, other: object) -> Cost:  # type: ignore[override]
        if not isinstance(other, Cost):
            return NotImplemented
        return Cost(self.grad_evals + other.grad_evals, self.queries + other.queries)

    def __mul__(self, factor: object) -> Cost:  # type: ignore[override]
        if not isinstance(factor, int):
            return NotImplemented
        return Cost(self.grad_evals * factor, self.queries * factor)


class Attack(hyper.DeclaresHyperparameters):
    """Base class: hyperparameters in `__init__`, data at call time.

    `hyperparameters` declares each constructor argument's valid values (`core.hyperparameters`);
    the constructor hands its arguments to `set_hyperparameters`, the one check. `kind` says
    how the engine gets a minimum ε: "budgeted" attacks stay inside `eps` and are searched
    over ε; "minimizing" attacks return the smallest example they found, whatever `eps`
    (which then only dates `first_success`), and its norm is the minimum ε.
    `strength_budget` is the unit and end of `first_success`.
    """

    kind: ClassVar[str] = "budgeted"
    knowledge: ClassVar[tuple[str, ...]] = ("white",)
    norms: ClassVar[tuple[str, ...]] = ("linf", "l2")
    goals: ClassVar[tuple[str, ...]] = GOALS
    revision: ClassVar[str | None] = None
    """A tag for a change of the algorithm that changes its numbers at the same hyperparameters
    (say how it spends its budget): part of the cell key where set, so records an earlier
    version wrote are computed again instead of being taken for this version's."""
    pooled_calls: ClassVar[bool] = False
    """Whether every model call of the attack that can need a batch's memory goes through the
    oracle's `loss_grad`, which splits calls beyond `Oracle.call_rows`: the engine then hands it
    a whole pool at once (`evaluation.batch`), so samples that stop early leave room for others
    instead of shrinking the calls. Attacks with their own objectives (`value_and_grad`) cannot."""

    def __call__(self, oracle: Oracle, x: torch.Tensor, y: torch.Tensor, *, eps: torch.Tensor,
                 norm: str, target: torch.Tensor | None = None,
                 sample_id: torch.Tensor | None = None) -> AttackResult:
        why = self.unsupported(norm, oracle.knowledge, "targeted" if target is not None else "untargeted")
        if why is not None:
            raise AdvbenchError(why)
        n = x.shape[0]
        if len(oracle) != n:
            raise ValueError(f"the oracle counts cost for {len(oracle)} samples, the batch has {n}")
        if eps.shape != (n,):
            raise ValueError(f"eps must have shape ({n},), got {tuple(eps.shape)}")
        if bool((eps < 0).any()) or not bool(torch.isfinite(eps).all()):
            raise AdvbenchError("eps must be finite and >= 0 for every sample")
        if target is not None and target.shape != y.shape:
            raise ValueError(f"target must have shape {tuple(y.shape)}, got {tuple(target.shape)}")
        if sample_id is None:
            sample_id = torch.arange(n, device=x.device)
        elif sample_id.shape != (n,):
            raise ValueError(f"sample_id must have shape ({n},), got {tuple(sample_id.shape)}")
        return self.run(oracle, x, y, eps=eps.to(x), norm=norm, target=target, sample_id=sample_id.to(x.device))

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "run" in vars(cls) and cls.strength_budget is Attack.strength_budget:
            raise TypeError(f"attack {cls.__name__} has a run but does not say its strength_budget")

    @property
    def strength_budget(self) -> int:
        """The most strength a sample can be given: the end of `first_success`'s scale (iterations,
        Adam steps, queries ... as the attack counts them) and the records' `strength_budget`.
        Every attack says what it is; a single-step attack's is 1."""
        raise NotImplementedError(f"{type(self).__name__} does not say its strength_budget")

    def declared_cost(self, knowledge: str, goal: str, num_classes: int) -> Cost:
        """The most one run of the attack spends on a sample, from its declared budget: a stated
        cost before anything runs (`advbench.robustness.cost`).

        One unit of `strength_budget` is one gradient evaluation under white-box and transfer
        knowledge (on the substitute) and one query under score and decision knowledge; an
        attack that spends more per unit (one gradient per candidate class) says so here. The
        forward passes gradient attacks make to check success are not part of the budget (the
        records count them). A randomized model multiplies gradients by its EOT passes."""
        budget = int(self.strength_budget)
        return Cost(grad_evals=budget, queries=0) if knowledge in GRADIENT_KNOWLEDGE else Cost(grad_evals=0, queries=budget)

    def unsupported(self, norm: str, knowledge: str, goal: str) -> str | None:
        """Why the attack cannot run under this norm, knowledge level and goal; None if it can.

        A sweep skips such cells with this line; a single run stops with it.
        """
        name = type(self).__name__
        if norm not in self.norms:
            return f"{name} supports norms {', '.join(self.norms)}, got '{norm}'"
        if knowledge not in self.knowledge:
            return f"{name} needs {'/'.join(self.knowledge)} access, got a {knowledge} oracle"
        if goal not in self.goals:
            return f"{name} supports {'/'.join(self.goals)} attacks, not {goal}"
        return None

    def for_norm(self, norm: str) -> Attack:
        """The attack as it runs under a threat in `norm`: itself, unless its settings depend on the
        norm (AutoAttack's versions do, as the original's do). The engine asks before anything else."""
        return self

    def run(self, oracle: Oracle, x: torch.Tensor, y: torch.Tensor, *, eps: torch.Tensor, norm: str,
            target: torch.Tensor | None, sample_id: torch.Tensor) -> AttackResult:  # pragma: no cover - abstract
        raise NotImplementedError

    def params(self) -> dict[str, object]:
        """Hyperparameters for the record's `attack_params` column."""
        return {k: v for k, v in vars(self).items() if not k.startswith("_")}


def success_of(logits: torch.Tensor, y: torch.Tensor, target: torch.Tensor | None) -> torch.Tensor:
    return goal_met(logits.argmax(dim=1), y, target)
