"""AutoAttack (Croce & Hein, ICML 2020) in its own versions: the original's member lists and settings.

`version` picks what the original's `AutoAttack(version=...)` runs, for ℓ∞ and ℓ2 alike
(`pyautoattack/autoattack.py`, `_set_version`; ℓ1 below):

- standard: APGD-CE (100 iterations, one start), APGD-T (9 target classes, one start each),
  FAB-T (9 target classes, no final search), Square (5,000 iterations, p_init 0.8);
- plus: APGD-CE and APGD-DLR with 5 restarts, FAB with 5 restarts, Square, APGD-T, FAB-T;
- rand: APGD-CE and APGD-DLR, one start, every gradient an EOT mean over 20 passes, for
  randomized models; `judge` says who decides success: `vote` (the default), the engine's vote
  over `judge.draws` passes as for any randomized model; `original`, the original's own rule
  (`_FirstPass`), so the number is the one the original (and RobustBench) reports;
- custom: `members`, attack option names, in order; the original's six members keep the
  settings its constructor gives them (`ORIGINAL_DEFAULTS`: APGD-CE, APGD-DLR and FAB with
  5 restarts), as its custom version does, so a custom list reads the original's number.
  `attack=ensemble` runs the same members with each option's own, lighter settings (one start).

Under ℓ1 the original's standard version runs APGD-CE with 5 restarts and APGD-T towards 5
classes, both APGD-ℓ1 with its ε schedule (`use_largereps`: 3ε, 2ε, then ε; `apgd_sparse`),
then FAB-T and Square in their ℓ1 versions, as here (`NORM_VERSIONS`, chosen by `for_norm`); the
other versions run their members as under ℓ∞ and ℓ2 (custom, rand: APGD-ℓ1 without the ε
schedule, as the original's).

Each member runs on the samples the earlier ones left robust (`worst_case.Ensemble`), so
`broken_by` says which member broke a sample; `member_params` overrides a member's settings
on top of the version's (records keep them, so such a run does not pass for the version).
Square is a score-based member under white-box knowledge: the white-box oracle answers its
logits queries (`Oracle.scores`), which the records count in `queries`.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from advbench.core import hyperparameters as hyper
from advbench.core.errors import AdvbenchError
from advbench.core.norms import L1_NORM, Norm
from advbench.core.norms import norm as norm_of
from advbench.robustness.attacks.attack_contract import Attack, AttackResult, Cost
from advbench.robustness.attacks.oracles import Oracle
from advbench.robustness.attacks.worst_case import Builder, Ensemble, MemberBuilder, MemberNames, MemberParams
from advbench.robustness.threat import goal_met

_ONE_START = {"n_restarts": 1}
_FIVE_STARTS = {"n_restarts": 5}
_NO_FINAL_SEARCH = {"final_search": 0}  # the original's FAB stops at its last iterate
ORIGINAL_DEFAULTS: dict[str, dict[str, Any]] = {
    "apgd_ce": {**_FIVE_STARTS, "n_iter": 100},
    "apgd_dlr": {**_FIVE_STARTS, "n_iter": 100},
    "fab": {**_FIVE_STARTS, **_NO_FINAL_SEARCH, "n_iter": 100},
    "square_autoattack": {"n_queries": 5001, "p_init": 0.8},  # 5,000 iterations after the start's query
    "apgd_t": {**_ONE_START, "n_iter": 100, "n_target_classes": 9},
    "fab_t": {**_ONE_START, **_NO_FINAL_SEARCH, "n_iter": 100, "n_target_classes": 9},
}
"""The settings the original's `AutoAttack.__init__` gives each member, which its custom version
keeps: APGD-CE, APGD-DLR and FAB share objects built with 5 restarts, APGD-T one start towards 9
classes, and FAB-T runs the FAB object with one start (its `run_standard_evaluation`)."""


def _original(*members: str, **changed: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """`members` in order with the original's constructor settings, as its `_set_version` changes them."""
    return {name: {**ORIGINAL_DEFAULTS[name], **changed.get(name, {})} for name in members}


VERSIONS: dict[str, dict[str, dict[str, Any]]] = {
    "standard": _original("apgd_ce", "apgd_t", "fab_t", "square_autoattack", apgd_ce=_ONE_START),
    "plus": _original("apgd_ce", "apgd_dlr", "fab", "square_autoattack", "apgd_t", "fab_t"),
    "rand": _original("apgd_ce", "apgd_dlr", apgd_ce=_ONE_START, apgd_dlr=_ONE_START),
}
"""Each version's members, in the order they run, with the original's settings for them."""
NORM_VERSIONS: dict[Norm, dict[str, dict[str, dict[str, Any]]]] = {
    L1_NORM: {"standard": _original("apgd_ce", "apgd_t", "fab_t", "square_autoattack", apgd_ce={"large_eps": True},
                                    apgd_t={"n_target_classes": 5, "large_eps": True})},
}
"""The versions whose settings the original's `_set_version` changes for a norm: under ℓ1 APGD-CE keeps its
constructor's 5 restarts, both APGD members take the ε schedule and APGD-T 5 classes."""
EOT_PASSES = {"rand": 20}
"""Passes per gradient (the original's `eot_iter`) where a version sets them; else the model's."""
JUDGES = ("vote", "original")
"""Who decides a randomized model's verdict: the engine's vote, or the original's own rule (rand only)."""


class _CustomMembers(MemberNames):
    """Attack option names for version=custom; None for the other versions, which name their own."""

    optional = True


class AutoAttack(Ensemble):
    """AutoAttack's `version`: its members and their settings, then the worst case over them."""

    hyperparameters = {"version": hyper.Choice((*VERSIONS, "custom")), "members": _CustomMembers(),
                       "member_params": MemberParams(), "seed": hyper.Whole(None), "judge": hyper.Choice(JUDGES),
                       "build_member": Builder()}

    def __init__(self, *, build_member: MemberBuilder, version: str = "standard", members: Sequence[str] | None = None,
                 member_params: Mapping[str, Mapping[str, Any]] | None = None, seed: int = 0,
                 judge: str = "vote") -> None:
        self.set_hyperparameters(locals())
        if judge == "original" and version != "rand":
            raise AdvbenchError(f"AutoAttack: attack.judge=original is the rand version's rule; version={version} "
                                "is judged by the engine (attack.judge=vote)")
        if (self.members is None) == (version == "custom"):
            raise AdvbenchError("AutoAttack: attack.members names the members of version=custom only; "
                                f"version={version} " + ("needs them" if version == "custom" else "runs its own"))
        self.members = list(VERSIONS[version]) if self.members is None else self.members
        self._assemble_version(VERSIONS.get(version) or custom_settings(self.members))

    def _assemble_version(self, settings: Mapping[str, Mapping[str, Any]]) -> None:
        """The members with the version's `settings` and, on top, `member_params`."""
        self._assemble(self.members, {name: {**settings.get(name, {}), **(self.member_params.get(name) or {})}
                                      for name in {*settings, *self.member_params}})

    def for_norm(self, norm: str) -> Attack:
        """The version as the original runs it under `norm` (`NORM_VERSIONS`); itself where that is the same."""
        settings = NORM_VERSIONS.get(norm_of(norm), {}).get(self.version)
        if settings is None:
            return self
        other = copy.copy(self)
        other.members = list(settings)
        other._assemble_version(settings)
        return other

    @property
    def judges_itself(self) -> bool:
        """Whether success is this attack's own verdict (judge=original), which the engine then
        takes as it is, judging clean inputs by one pass too, as the original does."""
        return self.judge == "original"

    def params(self) -> dict[str, object]:
        """The version; for a version with EOT (rand) who judged and the EOT passes per gradient, which
        the others do not have (their records stay as they were); then what an ensemble records
        (members, overrides, seed, resolved settings)."""
        passes = EOT_PASSES.get(self.version)
        eot = {} if passes is None else {"judge": self.judge, "eot_passes": passes}
        return {"version": self.version, **eot, **super().params()}

    def _member_oracle(self, attack: Attack, view: Oracle) -> Oracle:
        """The ensemble's view, with the version's EOT passes per gradient where it sets them, and
        judged by single passes under judge=original."""
        view = super()._member_oracle(attack, view)
        passes = EOT_PASSES.get(self.version)
        view = view if passes is None or view.knowledge != "white" else view.with_eot(passes)
        return _FirstPass(view) if self.judges_itself else view

    def _member_won(self, view: Oracle, res: AttackResult, y: torch.Tensor,
                    target: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Under judge=original: the iterate a single pass last called adversarial, confirmed by one more
        pass, whose label is the sample's verdict (the original's `y_adv`)."""
        if not isinstance(view, _FirstPass):
            return super()._member_won(view, res, y, target)
        won = view.confirmed(y, target)
        return won, torch.where(view.hit.view(-1, *[1] * (res.x_adv.dim() - 1)), view.kept, res.x_adv), view.label

    def _member_cost(self, attack: Attack, knowledge: str, goal: str, num_classes: int) -> Cost:
        """A member's cost with the version's EOT passes per white-box gradient, each one evaluation;
        judge=original adds its forward passes: one an iterate and start, one at the clean input, one to
        confirm, and the member's own at the clean input and each start's last iterate (APGD)."""
        cost = super()._member_cost(attack, knowledge, goal, num_classes)
        passes = EOT_PASSES.get(self.version) if knowledge == "white" else None
        extra = attack.strength_budget + 2 * getattr(attack, "n_restarts", 1) + 3 if self.judges_itself else 0
        return Cost(cost.grad_evals * (passes or 1), cost.queries + extra)


class _FirstPass:
    """A member's oracle under judge=original, the rule of the original's `run_standard_evaluation`
    with its APGD under EOT (`pyautoattack/autopgd_base.py`): the iterate a member keeps is the
    last one (the start included; the clean input where a pass already misclassifies it) at which
    a single noisy pass met the goal, and the sample is broken when one more pass at that iterate
    agrees (`confirmed`). The member runs its full course (`stops_on_hit` is False). Every pass
    is a counted query; the rest is the wrapped view's."""

    stops_on_hit = False

    def __init__(self, view: Oracle) -> None:
        self._view = view
        self.kept: torch.Tensor | None = None
        self.hit = torch.zeros(len(view), dtype=torch.bool, device=view.grad_evals.device)
        self.label = torch.full((len(view),), -1, dtype=torch.long, device=view.grad_evals.device)

    def __len__(self) -> int:
        return len(self._view)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._view, name)

    def verdict(self, x: torch.Tensor, y: torch.Tensor, target: torch.Tensor | None, idx: torch.Tensor,
                logits: torch.Tensor | None = None, undated: torch.Tensor | None = None) -> torch.Tensor:
        """One fresh pass at every row of `x`; the rows it calls adversarial keep `x` as their iterate
        and its label (`label`: the last such pass's, the confirming one's after `confirmed`)."""
        labels = self._view.logits(x, idx).argmax(dim=1)
        met = goal_met(labels, y, target)
        if self.kept is None:
            self.kept = torch.zeros((len(self), *x.shape[1:]), dtype=x.dtype, device=x.device)
        self.kept[idx[met]] = x[met]
        self.hit[idx[met]] = True
        self.label[idx[met]] = labels[met].to(self.label.device)
        return met

    def confirmed(self, y: torch.Tensor, target: torch.Tensor | None) -> torch.Tensor:
        """Whether one more pass at each sample's kept iterate meets the goal (False where none was kept)."""
        won = torch.zeros_like(self.hit)
        rows = self.hit.nonzero().squeeze(1)
        if rows.numel():
            won[rows] = self.verdict(self.kept[rows], y[rows], None if target is None else target[rows], rows)
        return won


def custom_settings(members: Sequence[str]) -> dict[str, dict[str, Any]]:
    """What the original's custom version runs `members` with: its constructor's settings for its
    six members, so that a custom list reads the number the original would. FAB after FAB-T keeps
    one start, because the original's FAB-T sets the shared FAB object's `n_restarts = 1` for good;
    other attack options keep their own settings."""
    settings = {name: dict(ORIGINAL_DEFAULTS[name]) for name in members if name in ORIGINAL_DEFAULTS}
    if "fab" in settings and "fab_t" in members[:members.index("fab")]:
        settings["fab"].update(_ONE_START)
    return settings
