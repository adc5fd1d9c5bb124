"""EAD (Chen et al., AAAI 2018): elastic-net attacks, a minimum-norm ℓ1 attack on C&W's search over c.

EAD minimises c·max(margin(x') + κ, 0) + ‖x' − x‖₂² + β‖x' − x‖₁ over x' in the box. The ℓ1 term is
not differentiable, so instead of C&W's Adam it takes FISTA steps: a gradient step on the smooth
part, then the shrinkage-thresholding S_β towards x, projected onto the box (`shrink`), and a
momentum step k/(k + 3) from there. The search over c and the κ verdict are C&W's
(`carlini_wagner.ConstantSearch`). Which adversarial iterate it keeps is its decision rule:
"L1", the smallest ℓ1 norm (the paper's best ℓ1 results), or "EN", the smallest elastic-net
distance β‖δ‖₁ + ‖δ‖₂²; the record is its ℓ1 norm either way.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from advbench.core import hyperparameters as hyper
from advbench.core.norms import L1_NORM, L2_NORM
from advbench.robustness.attacks.carlini_wagner import ConstantSearch
from advbench.robustness.attacks.minimum_norm import SmallestAdversarial, rows_of
from advbench.robustness.attacks.oracles import Oracle


def elastic_net(delta: torch.Tensor, beta: float) -> torch.Tensor:
    """β‖δ‖₁ + ‖δ‖₂² per row: EAD's distance."""
    return beta * L1_NORM.size(delta) + L2_NORM.size(delta) ** 2


DECISION_RULES: dict[str, Callable[[torch.Tensor, float], torch.Tensor]] = {
    "L1": lambda delta, beta: L1_NORM.size(delta),
    "EN": elastic_net,
}
"""How EAD ranks its adversarial iterates to keep one: by ℓ1 norm or by elastic-net distance."""


def shrink(z: torch.Tensor, x: torch.Tensor, beta: float, bounds: tuple[float, float]) -> torch.Tensor:
    """The projected shrinkage-thresholding of EAD's ISTA step: each coordinate of z − x moves β towards
    0 (0 where within β of it), and x + that is clipped to the box. The threshold is β itself, not
    the step size times β, as in the paper's Algorithm 1, the authors' code and Foolbox."""
    lo, hi = bounds
    d = z - x
    return torch.where(d > beta, (z - beta).clamp(max=hi), torch.where(d < -beta, (z + beta).clamp(min=lo), x))


class EAD(ConstantSearch):
    """EAD with FISTA, the authors' code's and Foolbox 3.3.4's algorithm, batched and searched per sample.

    Each optimisation starts at x_0 = y_0 = x. Step k (of at most `iterations`) takes the gradient g
    of c·max(margin + κ, 0) + ‖·−x‖₂² at y_k (one gradient evaluation), x_{k+1} = `shrink`(y_k − α_k·g)
    with α_k = `stepsize`·√(1 − k/iterations), y_{k+1} = x_{k+1} + k/(k + 3)·(x_{k+1} − x_k) (Foolbox's
    momentum; the authors' code takes (k + 1)/(k + 4)); then it
    judges x_{k+1} (one forward: y leaves the box, x never does) and offers it to the kept examples
    by the decision rule. The early-abort check takes the whole objective at x_{k+1}, ℓ1 term
    included, as the authors' code does (Foolbox's leaves the ℓ1 term out and sums the batch).

    Under a transfer threat (`l1_transfer`) it optimises the substitute, and an iterate is adversarial
    once the target's top-1 label meets the goal (C&W's rule, κ shaping the substitute's objective
    only). ℓ1 only: its ℓ1 term and decision rule aim at the ℓ1 norm, which under ℓ2 would only
    pull the example away from the smallest ℓ2 step (C&W is that attack).
    """

    knowledge = ("white", "transfer")
    norms = ("l1",)

    hyperparameters = {"iterations": hyper.Whole(1), "binary_search_steps": hyper.Whole(1),
                       "initial_const": hyper.Real(0, open_low=True), "stepsize": hyper.Real(0, open_low=True),
                       "beta": hyper.Real(0, open_low=True), "confidence": hyper.Real(0), "abort_early": hyper.Flag(),
                       "decision_rule": hyper.Choice(tuple(DECISION_RULES))}

    def __init__(self, *, iterations: int = 1000, binary_search_steps: int = 9, initial_const: float = 1e-3,
                 stepsize: float = 1e-2, beta: float = 1e-3, confidence: float = 0.0, abort_early: bool = True,
                 decision_rule: str = "L1") -> None:
        self.set_hyperparameters(locals())

    def smallest(self, x: torch.Tensor, eps: torch.Tensor, norm: str) -> SmallestAdversarial:
        """Examples ranked by the decision rule."""
        rule = DECISION_RULES[self.decision_rule]
        return SmallestAdversarial(x, eps, norm, lambda delta: rule(delta, self.beta))

    def optimise(self, oracle: Oracle, x: torch.Tensor, y: torch.Tensor, target: torch.Tensor | None,
                 const: torch.Tensor, todo: torch.Tensor, best: SmallestAdversarial,
                 spent: torch.Tensor) -> torch.Tensor:
        """FISTA from x at each row's c."""
        found = torch.zeros(todo.shape[0], dtype=torch.bool, device=x.device)
        pos = torch.arange(todo.shape[0], device=x.device)  # rows of `todo` still optimising
        x_k = x[todo].clone()
        y_k = x_k.clone()
        prev = torch.full((todo.shape[0],), torch.inf, dtype=x.dtype, device=x.device)
        for k in range(self.iterations):
            act = todo[pos]
            ya, ta, xo = y[act], rows_of(target, act), x[act]
            c = const[act].to(x.dtype)
            _, g = oracle.value_and_grad(y_k, lambda z: self.penalty(z, ya, ta, c), act)
            alpha = self.stepsize * (1 - k / self.iterations) ** 0.5
            x_next = shrink(y_k - alpha * (g + 2 * (y_k - xo)), xo, self.beta, oracle.bounds)
            y_k = x_next + k / (k + 3) * (x_next - x_k)
            x_k = x_next
            spent[act] += 1
            logits = oracle.logits(x_k, act)
            adv = self.adversarial(oracle, x_k, logits, ya, ta, act)
            best.offer(act, x_k, adv, spent[act])
            found[pos] |= adv
            loss = self.penalty(logits, ya, ta, c) + elastic_net(x_k - xo, self.beta)
            if (keep := self.keep_going(k, loss, prev)) is not None:
                prev = loss[keep]
                pos, x_k, y_k = pos[keep], x_k[keep], y_k[keep]
                if pos.numel() == 0:
                    break
        return found
