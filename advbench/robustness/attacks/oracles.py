"""What an attack may learn about the model under attack: one oracle per knowledge level.

Attacks never see a model, only an oracle built by the engine from `threat.knowledge`:

- white     logits and input gradients of the target;
- transfer  logits and gradients of a substitute model, top-1 labels of the target;
- score     logits of the target, with no autograd path back to it;
- decision  top-1 labels of the target.

Each oracle counts cost per sample of the batch it was built for (`grad_evals`: forward +
backward passes; `queries`: forward-only evaluations of the target), so records carry what
each sample cost whatever the attack does. Every method takes `idx`, the batch indices of the
rows of `x` (an attack's active set; repeats are counted repeatedly). `subset(idx)` is a view
over some samples whose counts land in the parent's counters: the minimum-ε search probes
through it. `remember_clean(x)` lets a white-box oracle serve the loss gradient at a sample's
clean input from memory after its first evaluation (every probe of the search starts there);
`grad_reuses` counts the gradients so served, which `grad_evals` does not.

A randomized model answers each pass with a fresh draw, so one pass cannot say whether an
example is adversarial: `verdict` is the one judgement of success attacks date success by, and
it is the engine's (`vote`): over `draws` fresh passes, an example meets the goal when at least
half of them do. One pass screens first (the logits an attack already has), so only rows the
screen calls adversarial pay for the vote; a deterministic model is judged by that one pass.
On a randomized model attacks do not stop at their first passing verdict (`stops_on_hit`).
`calls` (the batch's `RowCalls`) keys each of its passes per row by (sample id, call index).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from advbench.core.errors import AdvbenchError
from advbench.core.runtime import call_slices, forward, grad_rows
from advbench.robustness.attacks.clean_gradients import CleanGradients
from advbench.robustness.attacks.model_draws import Drawing, RowCalls, copy_counts, eot_copies, stacked
from advbench.robustness.attacks.votes import logits_of, vote
from advbench.robustness.threat import goal_met

Objective = Callable[[torch.Tensor], torch.Tensor]
Screen = Callable[[torch.Tensor], None]


def _device(model: nn.Module) -> torch.device:
    p = next(model.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


class Oracle:
    """Per-sample cost counters, subset views, and what every oracle exposes: bounds, classes."""

    knowledge: ClassVar[str]
    grad_mode: str = "none"
    """What the oracle's gradients are (records' `grad_mode`): none without gradients."""
    eot_passes: int | None = None
    """Passes per white-box gradient set by the attack (`with_eot`); None: the model's `eot_samples`."""

    def __init__(self, model: nn.Module, n: int, *, substitute: nn.Module | None = None,
                 num_classes: int | None = None, draws: int = 1, calls: RowCalls | None = None,
                 call_rows: int | None = None) -> None:
        self._target = model
        self.call_rows = call_rows
        """The most rows one gradient call takes (`loss_grad` splits larger ones); None: any."""
        self.draws = int(draws) if getattr(model, "randomized", False) else 1
        """Passes `verdict` votes over: `judge.draws` for a randomized target, else 1."""
        self.bounds: tuple[float, float] = tuple(getattr(model, "bounds", (0.0, 1.0)))  # type: ignore[assignment]
        self.num_classes = num_classes
        device = _device(model)
        self.calls = calls if calls is not None else RowCalls(torch.arange(n, device=device))
        self._grad_evals = torch.zeros(n, dtype=torch.long, device=device)
        self._queries = torch.zeros(n, dtype=torch.long, device=device)
        self._reuses = torch.zeros(n, dtype=torch.long, device=device)
        self._rows: torch.Tensor | None = None  # a view's rows in the counters; None: all of them

    def __len__(self) -> int:
        return self._grad_evals.shape[0] if self._rows is None else self._rows.shape[0]

    @property
    def grad_evals(self) -> torch.Tensor:
        """Gradient evaluations per sample (a copy for views, the live counter otherwise)."""
        return self._grad_evals if self._rows is None else self._grad_evals[self._rows]

    @property
    def queries(self) -> torch.Tensor:
        """Forward-only evaluations of the target per sample."""
        return self._queries if self._rows is None else self._queries[self._rows]

    @property
    def grad_reuses(self) -> torch.Tensor:
        """Gradients per sample served from memory (`remember_clean`) instead of evaluated again."""
        return self._reuses if self._rows is None else self._reuses[self._rows]

    def remember_clean(self, x: torch.Tensor) -> bool:
        """Whether this oracle remembers gradients at the clean inputs; one without gradients has none."""
        return False

    @property
    def stops_on_hit(self) -> bool:
        """Whether an attack may stop a sample at the first iterate its verdict passes.

        Not on a randomized model: the first iterate whose vote passes sits where its chance
        of passing is about one half, so the engine's fresh vote on it fails about half the
        time (regression to the mean). There the attack runs its full course, dating each
        sample's first passing verdict for the strength curve, and returns its last iterate.
        """
        return self.draws == 1

    def verdict(self, x: torch.Tensor, y: torch.Tensor, target: torch.Tensor | None, idx: torch.Tensor,
                logits: torch.Tensor | None = None, undated: torch.Tensor | None = None) -> torch.Tensor:
        """Whether each row of `x` meets the goal, as the engine will judge it.

        `logits`: the target's logits at `x` the attack already holds (screened for free),
        else one counted query screens. On a randomized target the rows the screen passes are
        confirmed by a vote over `draws` fresh passes, each counted as a query, and only the
        rows in `undated` (a mask: those whose first success is not yet dated) are judged at
        all; the others count as not met. A deterministic target judges every row.
        """
        if undated is not None and self.draws > 1:
            met = torch.zeros(x.shape[0], dtype=torch.bool, device=x.device)
            rows = undated.nonzero().squeeze(1)
            if rows.numel():
                met[rows] = self.verdict(x[rows], y[rows], None if target is None else target[rows], idx[rows],
                                         None if logits is None else logits[rows])
            return met
        met = goal_met(self._top1(x, idx, logits), y, target)
        if self.draws == 1:
            return met
        rows = met.nonzero().squeeze(1)
        if rows.numel():
            self._queries.index_add_(0, self._batch_rows(idx[rows]), torch.full_like(rows, self.draws))
            y_t = None if target is None else target[rows]
            met[rows] = vote(self._target, x[rows], y[rows], y_t, self.draws, calls=self.calls, rows=self._batch_rows(idx[rows])).met
        return met

    def _top1(self, x: torch.Tensor, idx: torch.Tensor, logits: torch.Tensor | None) -> torch.Tensor:
        """The target's top-1 labels at `x`: from `logits` when given, else one counted query."""
        return (logits if logits is not None else self.logits(x, idx)).argmax(dim=1)  # type: ignore[attr-defined]

    def subset(self, idx: torch.Tensor) -> Oracle:
        """A view over samples `idx` of this oracle; its costs are counted into this one's."""
        view = copy.copy(self)
        view._rows = self._batch_rows(idx)
        return view

    def scores(self) -> ScoreOracle:
        """This oracle's samples as a score oracle, costs counted into this one's: a white-box
        ensemble runs a score-based member through it (AutoAttack's Square), whose logits
        queries then land in the cell's `queries` as they would under score knowledge."""
        if self.knowledge != "white":
            raise AdvbenchError(f"a {self.knowledge} oracle cannot answer score queries")
        view = ScoreOracle.__new__(ScoreOracle)
        view.__dict__.update(self.__dict__)
        return view

    def with_eot(self, passes: int) -> Oracle:
        """A view whose gradients are EOT means over `passes` passes whatever the model's `eot_samples`
        (AutoAttack's rand version: eot_iter = 20), each pass counted as one grad_eval."""
        view = copy.copy(self)
        view.eot_passes = passes
        return view

    def _batch_rows(self, idx: torch.Tensor) -> torch.Tensor:
        """Rows `idx` of this oracle (or view) as rows of the whole batch's counters."""
        rows = idx.to(self._grad_evals.device)
        return rows if self._rows is None else self._rows[rows]

    def _in_calls(self, model: nn.Module, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """`model`'s logits at rows `idx`, forward only, in calls of at most `call_rows` rows (a
        pooled attack's, see `Attack.pooled_calls`), each pass keyed by its own rows."""
        size = x.shape[0] if self.call_rows is None else self.call_rows
        return torch.cat([logits_of(model, x[s], self.calls.pass_of(model, self._batch_rows(idx[s])))
                          for s in call_slices(x.shape[0], size)])

    def _count(self, counter: torch.Tensor, x: torch.Tensor, idx: torch.Tensor) -> None:
        rows = self._counted_rows(x, idx)
        counter.index_add_(0, rows, torch.ones_like(rows))

    def _counted_rows(self, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """`_batch_rows(idx)`, once `idx` is checked to name one batch row per row of `x`."""
        if idx.dim() != 1 or idx.shape[0] != x.shape[0]:
            raise ValueError(f"idx must have shape ({x.shape[0]},) like the rows of x, got {tuple(idx.shape)}")
        return self._batch_rows(idx)


class WhiteBoxOracle(Oracle):
    """Logits and input gradients of the model."""

    knowledge = "white"

    def __init__(self, model: nn.Module, n: int, *, substitute: nn.Module | None = None,
                 num_classes: int | None = None, draws: int = 1, calls: RowCalls | None = None,
                 call_rows: int | None = None) -> None:
        super().__init__(model, n, substitute=substitute, num_classes=num_classes, draws=draws, calls=calls,
                         call_rows=call_rows)
        self._memo: CleanGradients | None = None

    @property
    def _white(self) -> nn.Module:
        """The model the white-box methods act on (the substitute for transfer)."""
        return self._target

    @property
    def grad_mode(self) -> str:  # type: ignore[override]
        """exact, bpda (identity backward through a non-differentiable wrapper) or eot: the
        model says which (`advbench.robustness.defenses.wrappers`), plain models are exact."""
        return str(getattr(self._white, "grad_mode", "exact"))

    def remember_clean(self, x: torch.Tensor) -> bool:
        """Keep each sample's logits and loss gradient at its clean input `x` (this oracle's whole
        batch) once evaluated, and serve them again to any later call at
        exactly that input, labels and goal.

        Only for deterministic models: a randomized one (`randomized`, EOT) draws anew on every
        pass, so nothing is remembered and False is returned.
        """
        if self._rows is not None or len(self) != x.shape[0]:
            raise ValueError("remember_clean takes the whole batch of the oracle, not a view's rows")
        if getattr(self._white, "randomized", False) or int(getattr(self._white, "eot_samples", 1)) > 1:
            return False
        self._memo = CleanGradients(x.detach())
        return True

    def logits(self, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """Logits, forward only (+1 query per row)."""
        self._count(self._queries, x, idx)
        return self._in_calls(self._white, x, idx)

    def value_and_grad(self, x: torch.Tensor, objective: Objective, idx: torch.Tensor,
                       screen: Screen | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits at x and d(Σ objective(logits))/dx (+1 grad_eval per row and pass).

        `objective` maps logits (m, K) to per-sample losses (m,); summing keeps each sample's
        gradient its own (models are in eval mode, so samples do not interact). A randomized
        model's `eot_samples` > 1 makes it an EOT mean over that many passes (`value_and_grads`, as
        `screen`). A model with no autograd path from its output to x (a codec without BPDA) gets a
        zero gradient, as the masked-gradient flags count it: its masking shows in the records."""
        def column(z: torch.Tensor) -> torch.Tensor:
            if (value := objective(z)).shape != (z.shape[0],):
                raise ValueError(f"objective must return one loss per sample, shape ({z.shape[0]},), got {tuple(value.shape)}")
            return value[:, None]
        logits, grads = self.value_and_grads(x, column, idx, screen)
        return logits, grads[:, 0]

    def value_and_grads(self, x: torch.Tensor, objectives: Objective, idx: torch.Tensor,
                        screen: Screen | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits at x (m, K) and the input gradients (m, k, ...) of the k columns of objectives(logits):
        one forward a pass, one backward of it a column (FAB's class gradients), +k grad_evals a row and pass.
        EOT passes go through the model as stacked copies of x, `eot_copies` a call, averaged in pass
        order: the mean of the same passes, each drawing what it drew in a call of its own. A single
        pass hands its logits to `screen` before its backward is launched (an attack's verdict then
        runs while the device still has the backward to do); several passes do not call it."""
        passes = self.eot_passes or int(getattr(self._white, "eot_samples", 1))
        rows, m = self._counted_rows(x, idx), x.shape[0]
        cap = grad_rows(len(self), x.device) if self.call_rows is None else min(self.call_rows, grad_rows(len(self), x.device))
        logits_sum = grad_sum = None
        counts = copy_counts(passes, eot_copies(self._white, passes, x, cap))
        for copies, draw in zip(counts, self.calls.calls_of(self._white, rows, counts)):
            logits, grads = self._passes(x, objectives, rows, copies, draw, screen if passes == 1 else None)
            for lg, gr in zip(logits.split(m), grads.split(m)):  # summed pass by pass, as separate calls would be
                logits_sum, grad_sum = (lg, gr) if logits_sum is None else (logits_sum + lg, grad_sum + gr)
        return (logits_sum, grad_sum) if passes == 1 else (logits_sum / passes, grad_sum / passes)  # 1: no pass over it

    def _passes(self, x: torch.Tensor, objectives: Objective, rows: torch.Tensor, copies: int, draw: Drawing,
                screen: Screen | None) -> tuple[torch.Tensor, torch.Tensor]:
        """`copies` passes at x in one call drawing `draw`: logits (copies·m, K) and gradients (copies·m, k, ...)."""
        m, xr = x.shape[0], stacked(x, copies).detach().requires_grad_(True)
        with draw, torch.enable_grad():
            logits = forward(self._white, xr)
            if screen is not None:
                screen(logits.detach())
            values = torch.cat([objectives(z) for z in logits.split(m)]) if copies > 1 else objectives(logits)
            if values.dim() != 2 or values.shape[0] != copies * m:
                raise ValueError(f"objectives must return (m, k) values for m = {m} rows, got {tuple(values.shape)}")
            k = values.shape[1]
            self._grad_evals.index_add_(0, rows, torch.full_like(rows, copies * k))
            grads = [torch.autograd.grad((values[:, j] if k > 1 else values).sum(), xr, retain_graph=j < k - 1, allow_unused=True)[0]
                     if values.requires_grad else None for j in range(k)]
        grads = [torch.zeros_like(xr) if g is None else g for g in grads]  # no path to the input: what a naive attacker gets
        return logits.detach(), grads[0][:, None] if k == 1 else torch.stack(grads, dim=1)

    def loss_grad(self, x: torch.Tensor, labels: torch.Tensor, targeted: bool, idx: torch.Tensor,
                  screen: Screen | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Gradient of the attacker's cross-entropy objective, to be ascended: untargeted CE(logits, y),
        targeted −CE(logits, target). `screen` as `value_and_grads`'s, on a call of one piece and pass
        whose rows are not served from memory (else not called)."""
        if self.call_rows is not None and x.shape[0] > self.call_rows:  # a pooled attack's call: in pieces
            parts = [self.loss_grad(x[s], labels[s], targeted, idx[s]) for s in call_slices(x.shape[0], self.call_rows)]
            return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])

        def loss(rows: torch.Tensor | None) -> Objective:
            wanted = labels if rows is None else labels[rows]
            if targeted:
                return lambda z: -F.cross_entropy(z, wanted, reduction="none")
            return lambda z: F.cross_entropy(z, wanted, reduction="none")

        if self._memo is None:
            return self.value_and_grad(x, loss(None), idx, screen)
        rows = self._batch_rows(idx)
        clean = self._memo.at_clean(x, rows)
        # One host sync where no row is at its clean input (every call of an iteration past its start),
        # three where some are (those, the misses, the clean ones among them): not one a tensor gathered.
        if not bool(clean.any()):
            return self.value_and_grad(x, loss(None), idx, screen)
        hit = self._memo.stored(clean, rows, labels, targeted)
        miss = (~hit).nonzero().squeeze(1)
        if miss.numel() == x.shape[0]:
            logits, grad = self.value_and_grad(x, loss(None), idx)
        else:
            logits, grad = self._memo.recall(rows)
            if miss.numel():
                logits[miss], grad[miss] = self.value_and_grad(x[miss], loss(miss), idx[miss])
            self._reuses.index_add_(0, rows, hit.long())
        new = miss[clean[miss]]
        if new.numel():
            self._memo.store(rows[new], labels[new], targeted, logits[new], grad[new])
        return logits, grad


class TransferOracle(WhiteBoxOracle):
    """White-box access to a substitute model; only top-1 labels of the target."""

    knowledge = "transfer"

    def __init__(self, model: nn.Module, n: int, *, substitute: nn.Module | None = None,
                 num_classes: int | None = None, draws: int = 1, calls: RowCalls | None = None,
                 call_rows: int | None = None) -> None:
        if substitute is None:
            raise AdvbenchError("transfer knowledge needs a substitute model; set substitute=...")
        super().__init__(model, n, num_classes=num_classes, draws=draws, calls=calls, call_rows=call_rows)
        sub_bounds = tuple(getattr(substitute, "bounds", (0.0, 1.0)))
        if sub_bounds != self.bounds:
            raise AdvbenchError(f"substitute input bounds {sub_bounds} differ from the target's {self.bounds}")
        self._substitute = substitute

    @property
    def _white(self) -> nn.Module:
        return self._substitute

    def logits(self, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """The substitute's logits: the attacker's own model, so no target query is counted."""
        return self._in_calls(self._substitute, x, idx)

    def labels(self, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """Top-1 labels of the target (+1 query per row)."""
        self._count(self._queries, x, idx)
        return self._in_calls(self._target, x, idx).argmax(dim=1)

    def _top1(self, x: torch.Tensor, idx: torch.Tensor, logits: torch.Tensor | None) -> torch.Tensor:
        """The target's labels (counted): the logits an attack holds are the substitute's."""
        return self.labels(x, idx)


class ScoreOracle(Oracle):
    """Logits of the target and nothing else: no gradient can reach the model."""

    knowledge = "score"

    def logits(self, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """Logits (+1 query per row); the result has no grad_fn even if x requires grad."""
        self._count(self._queries, x, idx)
        return logits_of(self._target, x.detach(), self.calls.pass_of(self._target, self._batch_rows(idx)))


class DecisionOracle(Oracle):
    """Top-1 labels of the target only."""

    knowledge = "decision"

    def labels(self, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """Predicted classes (+1 query per row)."""
        self._count(self._queries, x, idx)
        return logits_of(self._target, x.detach(), self.calls.pass_of(self._target, self._batch_rows(idx))).argmax(dim=1)

    def _top1(self, x: torch.Tensor, idx: torch.Tensor, logits: torch.Tensor | None) -> torch.Tensor:
        return self.labels(x, idx)


ORACLES: dict[str, type[Oracle]] = {cls.knowledge: cls for cls in (WhiteBoxOracle, TransferOracle, ScoreOracle, DecisionOracle)}


def build_oracle(knowledge: str, model: nn.Module, n: int, substitute: nn.Module | None = None, *,
                 num_classes: int | None = None, draws: int = 1, calls: RowCalls | None = None,
                 call_rows: int | None = None) -> Oracle:
    """The oracle of a knowledge level over `model`, counting cost for a batch of `n` samples.

    `substitute` is used by the transfer oracle only; `draws` is the vote of `verdict` on a
    randomized model (`judge.draws`); `calls` its passes per sample (the engine's; None: ids 0..n-1);
    `call_rows` the most rows one gradient call takes (a pool's batch size).
    """
    if knowledge not in ORACLES:
        raise AdvbenchError(f"unknown knowledge level '{knowledge}'; valid: {', '.join(ORACLES)}")
    return ORACLES[knowledge](model, n, substitute=substitute, num_classes=num_classes, draws=draws, calls=calls,
                              call_rows=call_rows)
