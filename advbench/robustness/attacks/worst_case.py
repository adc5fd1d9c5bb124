"""Worst-case ensemble: several attacks in turn, each on the samples the earlier ones left robust.

Per sample the ensemble succeeds if any member succeeds within the budget, so it is at least
as strong as each member on every sample (members draw their randomness from (seed,
sample_id), so a member meets a sample exactly as it would alone). The engine's minimum-ε
search calls the ensemble once per probe, so a sample's `min_eps` is the smallest probed ε
at which some member broke it.

`first_success` adds up strengths: a sample broken by member k at its iteration t reports
s_1 + … + s_{k−1} + t, where s_i is member i's `strength_budget`. That is the number
of iterations spent on the sample, because a sample reaches member k only after every earlier
member ran its full budget on it without success. The record column `broken_by` holds the
index into `attack_params["members"]` of the member that broke the sample (the name is
`Ensemble.members[i]`), -1 where none did.

A minimum-norm member (DeepFool, C&W) counts as successful only where its smallest example
lies inside the budget. Members are attack options, which only the command line reads: it hands
the ensemble their builder (`build_member`, `advbench.cli.option_targets.member_attack`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from advbench.core import hyperparameters as hyper
from advbench.core.errors import AdvbenchError
from advbench.core.keys import plain_value
from advbench.robustness.attacks.attack_contract import Attack, AttackResult, Cost
from advbench.robustness.attacks.oracles import Oracle

MemberBuilder = Callable[[str, int, Mapping[str, Any] | None], Attack]
"""An attack option's name, the ensemble's seed and the member's overrides -> the member attack."""


class MemberNames(hyper.Range):
    """Attack option names, at least one, none twice; kept as a list of str."""

    def _check(self, owner: object, name: str, value: Any) -> Any:
        value = plain_value(value)
        if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
            raise hyper.refuse(owner, name, "a list of attack option names", value)
        names = [str(m) for m in value]
        if not names:
            raise AdvbenchError("an ensemble needs at least one member (attack.members=[apgd_ce,...])")
        if len(set(names)) != len(names):
            raise AdvbenchError(f"ensemble members repeat: {', '.join(names)}")
        return names

    def _bad(self) -> list[Any]:
        return [[], ["apgd_ce", "apgd_ce"], ["nope"], "apgd_ce", 3]


class MemberParams(hyper.Range):
    """Member name -> its hyperparameter overrides; None is none (kept as {})."""

    def _check(self, owner: object, name: str, value: Any) -> Any:
        value = plain_value(value)
        if value is None:
            return {}
        if not isinstance(value, Mapping) or not all(v is None or isinstance(v, Mapping) for v in value.values()):
            raise hyper.refuse(owner, name, "a mapping of member names to their params", value)
        return dict(value)

    def bad(self) -> list[Any]:
        return [{"nope": {}}, ["apgd_ce"], 3, {"apgd_ce": 3}]


class Builder(hyper.Range):
    """The builder of the members from their option names (`MemberBuilder`), handed down by the command line."""

    def _check(self, owner: object, name: str, value: Any) -> Any:
        if not callable(value):
            raise hyper.refuse(owner, name, "a builder of attacks from option names", value)
        return value

    def _bad(self) -> list[Any]:
        return ["apgd_ce", 3]


class Ensemble(Attack):
    """Members in order; accepts what every member accepts (norms, goals, knowledge)."""

    kind = "budgeted"
    hyperparameters = {"members": MemberNames(), "member_params": MemberParams(), "seed": hyper.Whole(None),
                       "build_member": Builder()}

    def __init__(self, *, members: Sequence[str], build_member: MemberBuilder,
                 member_params: Mapping[str, Mapping[str, Any]] | None = None, seed: int = 0) -> None:
        self.set_hyperparameters(locals())
        self._assemble(self.members, self.member_params)

    def _assemble(self, members: Sequence[str], member_params: Mapping[str, Mapping[str, Any] | None]) -> None:
        """Build the members with their overrides and what they all support."""
        unknown = sorted(set(member_params) - set(members))
        if unknown:
            raise AdvbenchError(f"member_params names {', '.join(unknown)}, not among the members "
                                f"{', '.join(members)}")
        self._attacks = [self.build_member(name, self.seed, member_params.get(name)) for name in members]
        self.norms = self._shared("norms")
        self.goals = self._shared("goals")
        self.knowledge = self._shared("knowledge")

    def _shared(self, attribute: str) -> tuple[str, ...]:
        """What every member supports, in the first member's order; an error if that is nothing.

        A score-based member runs under white knowledge too: the white-box oracle answers its
        logits queries (`Oracle.scores`), as AutoAttack runs Square on the model's scores.
        """
        first, *rest = (_knows(a) if attribute == "knowledge" else getattr(a, attribute) for a in self._attacks)
        common = tuple(v for v in first if all(v in other for other in rest))
        if not common:
            raise AdvbenchError(f"ensemble members {', '.join(self.members)} share no supported {attribute}")
        return common

    @property
    def late_score_members(self) -> tuple[int, ...]:
        """The members (indices) that see only scores and run after some white-box member: the
        samples they break are ones the gradients missed (`evaluation.cell.scores_beat_gradients`)."""
        white = [i for i, a in enumerate(self._attacks) if "white" in a.knowledge]
        return tuple(i for i, a in enumerate(self._attacks) if "white" not in a.knowledge and white and i > white[0])

    @property
    def strength_budget(self) -> int:
        """The members' budgets added up."""
        return sum(a.strength_budget for a in self._attacks)

    steps = strength_budget  # the name the budget had first

    def declared_cost(self, knowledge: str, goal: str, num_classes: int) -> Cost:
        """The members' costs added up, each under the knowledge it runs with (scores for a score-based member)."""
        return sum((self._member_cost(a, knowledge if knowledge in a.knowledge else "score", goal, num_classes)
                    for a in self._attacks), Cost(0, 0))

    def _member_cost(self, attack: Attack, knowledge: str, goal: str, num_classes: int) -> Cost:
        """What member `attack` declares for one run under `knowledge`."""
        return attack.declared_cost(knowledge, goal, num_classes)

    def params(self) -> dict[str, object]:
        """Member names, overrides and seed, plus each member's resolved hyperparameters."""
        return {"members": self.members, "member_params": self.member_params, "seed": self.seed,
                "resolved": {name: a.params() for name, a in zip(self.members, self._attacks)}}

    def run(self, oracle: Oracle, x: torch.Tensor, y: torch.Tensor, *, eps: torch.Tensor, norm: str,
            target: torch.Tensor | None, sample_id: torch.Tensor) -> AttackResult:
        n = x.shape[0]
        x_adv = x.clone()
        first = torch.full((n,), -1, dtype=torch.long, device=x.device)
        broken_by = torch.full((n,), -1, dtype=torch.long, device=x.device)
        pred, judged = torch.full((n,), -1, dtype=torch.long, device=x.device), False
        active = torch.arange(n, device=x.device)
        offset = 0
        for i, attack in enumerate(self._attacks):
            if active.numel() == 0:
                break
            view, t = self._member_oracle(attack, oracle.subset(active)), None if target is None else target[active]
            res = attack(view, x[active], y[active], eps=eps[active], norm=norm, target=t, sample_id=sample_id[active])
            won, example, label = self._member_won(view, res, y[active], t)
            keep = won if attack.kind == "minimizing" else torch.ones_like(won)
            x_adv[active[keep]] = example[keep]
            if label is not None:
                pred[active[won]], judged = label[won], True
            first[active[won]] = offset + res.first_success[won]
            broken_by[active[won]] = i
            active = active[~won]
            offset += attack.strength_budget
        return AttackResult(x_adv=x_adv, success=first >= 0, first_success=first, info={"broken_by": broken_by},
                            pred=pred if judged else None)

    def _member_won(self, view: Oracle, res: AttackResult, y: torch.Tensor,
                    target: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Which samples member's result `res` broke, its examples, and the labels that judged them
        where the ensemble judges itself (None: the engine judges). first_success >= 0:
        adversarial within eps, for minimum-norm members too (their first_success dates the first
        example inside eps; x_adv is then inside as well)."""
        return res.success & (res.first_success >= 0), res.x_adv, None

    def _member_oracle(self, attack: Attack, view: Oracle) -> Oracle:
        """The oracle a member sees: `view`, or its score view where the member needs score access."""
        return view.scores() if view.knowledge not in attack.knowledge and "score" in attack.knowledge else view


def _knows(attack: Attack) -> tuple[str, ...]:
    """The knowledge levels a member runs under inside an ensemble: its own, and white where it takes scores."""
    return attack.knowledge + (("white",) if "score" in attack.knowledge and "white" not in attack.knowledge else ())
