"""Carlini–Wagner's search over the constant c, shared by C&W ℓ2 and EAD (`ead`), and C&W ℓ2 itself.

Both minimise ‖δ‖-terms + c·max(margin(x + δ) + κ, 0) for a sequence of per-sample constants c
(`next_const`), each optimisation from the input afresh; they differ in the distance term and the
optimiser, so each says only how one optimisation at c runs (`ConstantSearch.optimise`). The
smallest adversarial iterate over every optimisation is kept (`SmallestAdversarial`).
"""

from __future__ import annotations

import math

import torch

from advbench.core import hyperparameters as hyper
from advbench.core.norms import L2_NORM
from advbench.core.steps import adam_step, clip
from advbench.robustness.attacks.attack_contract import Attack, AttackResult
from advbench.robustness.attacks.minimum_norm import SmallestAdversarial, goal_margin, rows_of
from advbench.robustness.attacks.oracles import Oracle, TransferOracle


def next_const(const: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor,
               found: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """C&W's per-sample search over c after one optimisation at `const`.

    Success: c was large enough, so it becomes the upper bound and c decreases (bisection).
    Failure: c becomes the lower bound and c increases, ×10 until a first success, then by
    bisection. (ARES 2.0 has the two directions swapped.)
    """
    hi = torch.where(found, torch.minimum(hi, const), hi)
    lo = torch.where(found, lo, torch.maximum(lo, const))
    const = torch.where(torch.isinf(hi), const * 10, (lo + hi) / 2)
    return const, lo, hi



class ConstantSearch(Attack):
    """The outer loop of C&W and EAD: each sample runs `binary_search_steps` optimisations of at most
    `iterations` gradient steps, each from x, and searches its own c from `initial_const` (`next_const`).
    A sample adversarial at its input is done (norm 0). With `abort_early`, a sample stops an
    optimisation when its loss fell by less than 0.01% over a tenth of `iterations` (`keep_going`).
    An example counts only if the model's top-1 meets the goal with margin ≤ −κ (`adversarial`).

    Strength (`first_success`) is the number of gradient steps the sample had taken, summed over
    the binary-search steps, when the example within eps was found. That equals this same run
    stopped after that many steps, not a rerun with smaller `iterations` (which changes every
    optimisation's length, the early-abort checks and the c schedule). `strength_budget`, which
    the engine and the ensemble read, is `iterations · binary_search_steps`.
    """

    kind = "minimizing"
    iterations: int
    binary_search_steps: int
    initial_const: float
    confidence: float
    abort_early: bool

    @property
    def strength_budget(self) -> int:
        """Gradient steps over all binary-search steps."""
        return self.iterations * self.binary_search_steps

    def smallest(self, x: torch.Tensor, eps: torch.Tensor, norm: str) -> SmallestAdversarial:
        """The record of the kept examples: ranked by the threat's norm unless a subclass says otherwise."""
        return SmallestAdversarial(x, eps, norm)

    def run(self, oracle: Oracle, x: torch.Tensor, y: torch.Tensor, *, eps: torch.Tensor, norm: str,
            target: torch.Tensor | None, sample_id: torch.Tensor) -> AttackResult:
        n = x.shape[0]
        best = self.smallest(x, eps, norm)
        everyone = torch.arange(n, device=x.device)
        clean = oracle.logits(x, everyone)
        already = self.adversarial(oracle, x, clean, y, target, everyone)
        best.offer(everyone, x, already, 0)
        todo = everyone[~already]  # a clean adversarial has norm 0: nothing to improve
        const = torch.full((n,), self.initial_const, dtype=torch.float64, device=x.device)
        lo = torch.zeros_like(const)
        hi = torch.full_like(const, math.inf)
        spent = torch.zeros(n, dtype=torch.long, device=x.device)
        for _ in range(self.binary_search_steps):
            if todo.numel() == 0:
                break
            found = self.optimise(oracle, x, y, target, const, todo, best, spent)
            const[todo], lo[todo], hi[todo] = next_const(const[todo], lo[todo], hi[todo], found)
        return best.result()

    def adversarial(self, oracle: Oracle, x: torch.Tensor, logits: torch.Tensor, y: torch.Tensor,
                    target: torch.Tensor | None, idx: torch.Tensor) -> torch.Tensor:
        """White: top-1 meets the goal with margin ≤ −κ. Transfer: the target's top-1 meets it
        (κ then only shapes the optimisation on the substitute)."""
        met = oracle.verdict(x, y, target, idx, logits)
        if isinstance(oracle, TransferOracle):
            return met
        return met & (goal_margin(logits, y, target) <= -self.confidence)

    def penalty(self, logits: torch.Tensor, y: torch.Tensor, target: torch.Tensor | None,
                const: torch.Tensor) -> torch.Tensor:
        """c·max(margin + κ, 0) per row: the objective's goal term."""
        return const * (goal_margin(logits, y, target) + self.confidence).clamp_min(0)

    def keep_going(self, i: int, loss: torch.Tensor, prev: torch.Tensor) -> torch.Tensor | None:
        """With `abort_early`, at every tenth of `iterations`: which optimising rows go on after step `i`,
        those whose `loss` fell to at most 0.9999 of the last check's (`prev`, inf at first); else None."""
        if self.abort_early and i % math.ceil(self.iterations / 10) == 0:
            return loss <= 0.9999 * prev
        return None

    def optimise(self, oracle: Oracle, x: torch.Tensor, y: torch.Tensor, target: torch.Tensor | None,
                 const: torch.Tensor, todo: torch.Tensor, best: SmallestAdversarial,
                 spent: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        """One optimisation of rows `todo` at their c, offering its iterates to `best` and counting
        each gradient step in `spent`; whether each of `todo` found an adversarial example."""
        raise NotImplementedError


class TanhBox:
    """C&W's change of variables x' = lo + (hi − lo)·(tanh(w) + 1)/2: in bounds by construction.

    Pixels at a bound start at w = atanh(±(1 − 1e-6)) ≈ ±7.25, where the gradient is ~1e-6,
    so Adam barely moves them: costly on images with many saturated pixels (digits).
    """

    @staticmethod
    def start(x: torch.Tensor, bounds: tuple[float, float]) -> torch.Tensor:
        lo, hi = bounds
        return torch.atanh(((x - lo) / (hi - lo) * 2 - 1) * (1 - 1e-6))

    @staticmethod
    def to_model(w: torch.Tensor, x: torch.Tensor, bounds: tuple[float, float]) -> torch.Tensor:
        lo, hi = bounds
        return lo + (hi - lo) * (torch.tanh(w) + 1) / 2

    @staticmethod
    def chain(w: torch.Tensor, x: torch.Tensor, bounds: tuple[float, float], grad: torch.Tensor) -> torch.Tensor:
        """d loss / dw from d loss / dx'."""
        lo, hi = bounds
        return grad * (hi - lo) / 2 * (1 - torch.tanh(w) ** 2)


class ClipBox:
    """C&W's clipped gradient descent: w = δ, x' = clip(x + δ) inside the objective.

    The gradient passes where x + δ lies within the bounds, ends included, so a pixel at a
    bound moves inwards at full speed; a coordinate pushed outside stays clipped (zero
    gradient) and costs nothing, since the distance is measured on the clipped x'.
    """

    @staticmethod
    def start(x: torch.Tensor, bounds: tuple[float, float]) -> torch.Tensor:
        return torch.zeros_like(x)

    @staticmethod
    def to_model(w: torch.Tensor, x: torch.Tensor, bounds: tuple[float, float]) -> torch.Tensor:
        return clip(x + w, bounds)

    @staticmethod
    def chain(w: torch.Tensor, x: torch.Tensor, bounds: tuple[float, float], grad: torch.Tensor) -> torch.Tensor:
        """d loss / dδ from d loss / dx': zero where the clip is active."""
        lo, hi = bounds
        inside = (x + w >= lo) & (x + w <= hi)
        return grad * inside


BOXES: dict[str, type[TanhBox] | type[ClipBox]] = {"tanh": TanhBox, "clip": ClipBox}


class CarliniWagnerL2(ConstantSearch):
    """Carlini–Wagner ℓ2: min ‖x' − x‖₂² + c·max(margin(x') + κ, 0) with Adam on a variable w, searched over c
    as `ConstantSearch` says.

    `box` keeps x' in bounds: "tanh" (the seed's, `TanhBox`) or "clip" (`ClipBox`, C&W's
    clipped gradient descent, which moves saturated pixels). Each optimisation starts Adam
    with fresh moments.
    """

    knowledge = ("white", "transfer")
    norms = ("l2",)

    hyperparameters = {"iterations": hyper.Whole(1), "binary_search_steps": hyper.Whole(1),
                       "initial_const": hyper.Real(0, open_low=True), "stepsize": hyper.Real(0, open_low=True),
                       "confidence": hyper.Real(0), "abort_early": hyper.Flag(), "box": hyper.Choice(tuple(BOXES))}

    def __init__(self, *, iterations: int = 100, binary_search_steps: int = 10, initial_const: float = 1.0,
                 stepsize: float = 0.01, confidence: float = 0.0, abort_early: bool = True,
                 box: str = "tanh") -> None:
        self.set_hyperparameters(locals())

    steps = ConstantSearch.strength_budget  # the name the budget had first

    def optimise(self, oracle: Oracle, x: torch.Tensor, y: torch.Tensor, target: torch.Tensor | None,
                 const: torch.Tensor, todo: torch.Tensor, best: SmallestAdversarial,
                 spent: torch.Tensor) -> torch.Tensor:
        """Adam on w from the box's start at x, judging each iterate where its gradient is taken."""
        found = torch.zeros(todo.shape[0], dtype=torch.bool, device=x.device)
        pos = torch.arange(todo.shape[0], device=x.device)  # rows of `todo` still optimising
        box = BOXES[self.box]
        w = box.start(x[todo], oracle.bounds)
        m, v = torch.zeros_like(w), torch.zeros_like(w)
        prev = torch.full((todo.shape[0],), math.inf, dtype=x.dtype, device=x.device)
        for i in range(self.iterations):
            act = todo[pos]
            ya, ta, xo = y[act], rows_of(target, act), x[act]
            c = const[act].to(x.dtype)
            xa = box.to_model(w, xo, oracle.bounds)
            logits, g = oracle.value_and_grad(xa, lambda z: self.penalty(z, ya, ta, c), act)
            adv = self.adversarial(oracle, xa, logits, ya, ta, act)
            best.offer(act, xa, adv, spent[act])
            found[pos] |= adv
            loss = L2_NORM.size(xa - xo) ** 2 + self.penalty(logits, ya, ta, c)
            g_w = box.chain(w, xo, oracle.bounds, g + 2 * (xa - xo))
            w -= adam_step(g_w, m, v, i + 1, self.stepsize)
            spent[act] += 1
            if (keep := self.keep_going(i, loss, prev)) is not None:
                prev = loss[keep]
                pos, w, m, v = pos[keep], w[keep], m[keep], v[keep]
                if pos.numel() == 0:
                    break
        return found
