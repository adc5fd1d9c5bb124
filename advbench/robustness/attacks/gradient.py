"""Gradient attacks with a budget: FGSM, BIM, PGD, MIM, all one projected-ascent loop.

The loop keeps per-sample state in tensors and drops samples from the active set as soon as
they meet the goal, returning the first adversarial iterate. That makes `first_success` the
strength at which each sample broke (the accuracy-vs-iterations curve needs no reruns), and
makes high-ε probes of the minimum-ε search cheap.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from advbench.core import hyperparameters as hyper
from advbench.core.steps import accumulate_momentum, ascend, unit_direction
from advbench.robustness.attacks.attack_contract import Attack, AttackResult
from advbench.robustness.attacks.oracles import TransferOracle, WhiteBoxOracle
from advbench.robustness.attacks.starts import random_start


class IterativeGradientAttack(Attack):
    """x_{t+1} = clip(Π_ε(x_t + α·dir(g_t))) with α = rel_stepsize·ε.

    `decay` turns on MIM's momentum on ℓ1-normalised gradients; `random_init` is PGD's start.
    Under a transfer oracle the gradient is the substitute's and success is the target's top-1
    label, checked before each step (one counted query per active sample): a sample stops at
    the first iterate that fools the target, so the strength (iterations on the substitute)
    curve still comes from one run. `early_stop = False` checks only the last iterate. A
    sample stops on the oracle's `verdict`; on a randomized model it is dated but runs on
    (`Oracle.stops_on_hit`). On a deterministic white-box target the verdict on an iterate runs
    inside its gradient call, before the backward, and broken samples leave after the step, only on
    iterations where one broke (`_Screen`): on a GPU the host waits for the verdict, not the device.
    Subclasses hook in through `_gradient` (where the gradient is taken) and `_direction`.
    """

    knowledge = ("white", "transfer")
    early_stop = True
    pooled_calls = True  # every gradient is `oracle.loss_grad`'s (DIM's and TI's too)

    hyperparameters = {"steps": hyper.Whole(1), "rel_stepsize": hyper.Real(0, open_low=True),
                       "random_init": hyper.Flag(), "decay": hyper.Real(0, optional=True),
                       "seed": hyper.Whole(None)}

    def __init__(self, *, steps: int = 20, rel_stepsize: float = 0.15, random_init: bool = False,
                 decay: float | None = None, seed: int = 0) -> None:
        self.set_hyperparameters(locals())

    @property
    def strength_budget(self) -> int:
        """Iterations: `steps`."""
        return self.steps

    def run(self, oracle: WhiteBoxOracle, x: torch.Tensor, y: torch.Tensor, *, eps: torch.Tensor,
            norm: str, target: torch.Tensor | None, sample_id: torch.Tensor) -> AttackResult:
        targeted = target is not None
        if self.random_init:
            x_adv = random_start(x, eps, norm, oracle.bounds, seed=self.seed, sample_id=sample_id)
        else:
            x_adv = x.clone()
        first = torch.full((x.shape[0],), -1, dtype=torch.long, device=x.device)
        a = _Active.of(x_adv, first, x, y, target, sample_id, self.rel_stepsize * eps, eps, self.decay is not None)
        screened = self._screens(oracle)
        for t in range(self.steps + 1):
            logits = grad = screen = None
            if t < self.steps and not isinstance(oracle, TransferOracle):  # one pass: verdict and step
                if screened:
                    screen = _Screen(oracle, a, t)
                    logits, grad = oracle.loss_grad(a.x_adv, a.labels, targeted, a.rows, screen=screen)
                else:
                    logits, grad = self._gradient(oracle, a.x_adv, a.labels, targeted, a.rows, a.sample_id, t)
            if screen is not None and screen.hit is not None:  # judged inside the call: step, then drop
                before = a.x_adv
                self._step(a, grad, norm, oracle.bounds)  # queued before the wait, broken rows too
                if screen.broke():
                    a = a.dropping(screen.unbroken.nonzero().squeeze(1), before, x_adv, first)
                    if a.rows.numel() == 0:
                        break
                continue
            if self.early_stop or t == self.steps:
                undated = a.first < 0
                hit = oracle.verdict(a.x_adv, a.y, a.target, a.rows, logits, undated=undated)
                a.first.masked_fill_(hit & undated, t)
            if t == self.steps:
                break
            if self.early_stop and oracle.stops_on_hit:
                # The iteration's one host-device synchronisation: the size of the new active set.
                keep = (~hit).nonzero().squeeze(1)
                if keep.numel() < a.rows.numel():
                    a.write(x_adv, first)
                    a, grad = a.take(keep), None if grad is None else grad[keep]
                    if a.rows.numel() == 0:
                        break
            if grad is None:
                _, grad = self._gradient(oracle, a.x_adv, a.labels, targeted, a.rows, a.sample_id, t)
            self._step(a, grad, norm, oracle.bounds)
        a.write(x_adv, first)
        return AttackResult(x_adv=x_adv, success=first >= 0, first_success=first)

    def _screens(self, oracle: WhiteBoxOracle) -> bool:
        """Whether the verdict on an iterate runs inside its gradient call, between the forward and
        the backward (`_Screen`): early stopping on a deterministic white-box target, and this
        class's own `_gradient` (DIM's and TI's forward another input than the iterate)."""
        return (self.early_stop and oracle.stops_on_hit and not isinstance(oracle, TransferOracle)
                and type(self)._gradient is IterativeGradientAttack._gradient)

    def _step(self, a: _Active, grad: torch.Tensor, norm: str, bounds: tuple[float, float]) -> None:
        """Every row of `a` one projected step along `grad` (and its momentum)."""
        direction, a.momentum = self._direction(grad, a.momentum, norm)
        a.x_adv = ascend(a.x_adv, a.x, direction, a.alpha, a.eps, norm, bounds)

    def _gradient(self, oracle: WhiteBoxOracle, x: torch.Tensor, labels: torch.Tensor, targeted: bool,
                  idx: torch.Tensor, sample_id: torch.Tensor, t: int) -> tuple[torch.Tensor | None, torch.Tensor]:
        """Logits at x (None when the model saw another input) and the gradient to ascend at step t."""
        return oracle.loss_grad(x, labels, targeted, idx)

    def _direction(self, grad: torch.Tensor, momentum: torch.Tensor | None,
                   norm: str) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The step's unit direction and the active samples' momentum after it (None without)."""
        if momentum is None:
            return unit_direction(grad, norm), None
        momentum = accumulate_momentum(momentum, grad, self.decay)
        return unit_direction(momentum, norm), momentum


@dataclass
class _Active:
    """The samples an attack still steps, one row each: their batch rows and per-sample state.

    Gathered again only on the iterations where some sample leaves (most iterations of a large
    batch lose none), where indexing every batch-sized tensor by the active rows on every
    iteration cost a dozen gathers and two scatters a step. `write` puts the iterates and first
    successes back into the batch's tensors.
    """

    rows: torch.Tensor
    x_adv: torch.Tensor
    x: torch.Tensor
    y: torch.Tensor
    target: torch.Tensor | None
    sample_id: torch.Tensor
    alpha: torch.Tensor
    eps: torch.Tensor
    first: torch.Tensor
    momentum: torch.Tensor | None

    @classmethod
    def of(cls, x_adv: torch.Tensor, first: torch.Tensor, x: torch.Tensor, y: torch.Tensor,
           target: torch.Tensor | None, sample_id: torch.Tensor, alpha: torch.Tensor, eps: torch.Tensor,
           momentum: bool) -> _Active:
        """The whole batch, its iterates and first successes copies of `x_adv` and `first` (which `write` fills)."""
        return cls(rows=torch.arange(x.shape[0], device=x.device), x_adv=x_adv.clone(), x=x, y=y, target=target,
                   sample_id=sample_id, alpha=alpha, eps=eps, first=first.clone(),
                   momentum=torch.zeros_like(x) if momentum else None)

    @property
    def labels(self) -> torch.Tensor:
        """What the loss is taken against: the target, or the true label when untargeted."""
        return self.y if self.target is None else self.target

    def take(self, keep: torch.Tensor) -> _Active:
        """Rows `keep` of this set."""
        state = {f.name: getattr(self, f.name) for f in fields(self)}
        return _Active(**{k: None if v is None else v[keep] for k, v in state.items()})

    def write(self, x_adv: torch.Tensor, first: torch.Tensor) -> None:
        x_adv[self.rows] = self.x_adv
        first[self.rows] = self.first

    def dropping(self, keep: torch.Tensor, before: torch.Tensor, x_adv: torch.Tensor, first: torch.Tensor) -> _Active:
        """Rows `keep` of this set, every row's iterate from before its step (`before`) written out
        first: the broken rows' results, as if the set had shrunk before the step."""
        stepped, self.x_adv = self.x_adv, before
        self.write(x_adv, first)
        self.x_adv = stepped
        return self.take(keep)


class _Screen:
    """The verdict on a gradient call's iterates, from the logits its forward hands over before the
    backward is launched (`WhiteBoxOracle.value_and_grads`): it dates first successes and starts the
    count of rows left unbroken towards the host. On CUDA the count travels through pinned memory
    without waiting, so `broke`, read once the step is queued, waits for the verdict alone while the
    device runs the backward and the step; only an iteration where a sample broke then waits for the
    device, to drop it (before, every iteration drained the device's queue to size the active set).
    `hit` stays None where the call judged nothing (several EOT passes, rows served from memory)."""

    def __init__(self, oracle: WhiteBoxOracle, a: _Active, t: int) -> None:
        self.oracle, self.a, self.t = oracle, a, t
        self.hit: torch.Tensor | None = None
        self.unbroken = self.left = self.ready = None

    def __call__(self, logits: torch.Tensor) -> None:
        a = self.a
        self.hit = self.oracle.verdict(a.x_adv, a.y, a.target, a.rows, logits)
        a.first.masked_fill_(self.hit, self.t)  # every row is undated: a screened set drops a row at its first hit
        self.unbroken = ~self.hit
        left = self.unbroken.sum()
        if left.is_cuda:
            self.left = torch.empty((), dtype=left.dtype, pin_memory=True).copy_(left, non_blocking=True)
            self.ready = torch.cuda.Event()
            self.ready.record(torch.cuda.current_stream(left.device))  # the rows' device, whichever is current
        else:
            self.left = left

    def broke(self) -> bool:
        """Whether a row broke at this iterate (the host waits for the verdict, not for the backward)."""
        if self.ready is not None:
            self.ready.synchronize()
        return int(self.left) < self.unbroken.shape[0]


class FGSM(IterativeGradientAttack):
    """One step of size ε (Goodfellow et al.); the ℓ2 version steps along g/‖g‖₂."""

    def __init__(self, *, seed: int = 0) -> None:
        super().__init__(steps=1, rel_stepsize=1.0, seed=seed)


class BIM(IterativeGradientAttack):
    """Basic iterative method; the seed's defaults: α = 0.15·ε, 20 iterations."""

    def __init__(self, *, steps: int = 20, rel_stepsize: float = 0.15, seed: int = 0) -> None:
        super().__init__(steps=steps, rel_stepsize=rel_stepsize, seed=seed)


class PGD(IterativeGradientAttack):
    """BIM from a uniform random start in the ε-ball (Madry et al.), drawn per sample from (seed, sample_id)."""

    def __init__(self, *, steps: int = 20, rel_stepsize: float = 0.125, seed: int = 0) -> None:
        super().__init__(steps=steps, rel_stepsize=rel_stepsize, random_init=True, seed=seed)


class MIM(IterativeGradientAttack):
    """Momentum iterative method: g ← μ·g + ∇/‖∇‖₁, step along sign(g) (or g/‖g‖₂)."""

    def __init__(self, *, steps: int = 20, rel_stepsize: float = 0.15, decay: float = 1.0, seed: int = 0) -> None:
        super().__init__(steps=steps, rel_stepsize=rel_stepsize, decay=decay, seed=seed)
