"""Decoupled Direction and Norm (DDN; Rony et al. 2019): a minimum-norm ℓ2 gradient attack.

DDN decouples where a step goes from how far the example may lie: each iteration takes one
normalised cross-entropy gradient step, then rescales the perturbation onto an ℓ2 sphere
whose radius ε shrinks by (1 − γ) while the iterate is adversarial and grows by (1 + γ)
while it is not, so ε hovers around each sample's decision boundary and drifts down along
it. As DeepFool and C&W (`minimum_norm`), it returns per sample the smallest adversarial
iterate it saw, the input itself where it saw none.
"""

from __future__ import annotations

import torch

from advbench.core import hyperparameters as hyper
from advbench.core.norms import L2_NORM
from advbench.core.steps import clip, cosine_anneal, per_sample
from advbench.robustness.attacks.attack_contract import Attack, AttackResult
from advbench.robustness.attacks.minimum_norm import SmallestAdversarial, unit_l2
from advbench.robustness.attacks.oracles import Oracle

FINAL_STEPSIZE = 0.01
"""Where the cosine schedule of the step size ends (the paper's, Foolbox's and adv-lib's)."""


class DDN(Attack):
    """DDN ℓ2 (Rony et al. 2019), with the paper's schedule as Foolbox's and adv-lib's DDN run it.

    From δ = 0 and ε = `init_epsilon`, iteration i (of `steps`) takes the loss gradient g at
    x + δ (cross-entropy of the label, ascended; targeted: of the target, descended), judges
    x + δ and keeps it if it is the smallest adversarial example so far, then sets
    δ ← δ + α_i·g/‖g‖₂, ε ← ε·(1 − γ) if x + δ was adversarial else ε·(1 + γ) (at most the
    farthest point of the box, ‖max(x − lo, hi − x)‖₂), δ ← ε·δ/‖δ‖₂, and clips x + δ into
    the oracle's bounds. α_i anneals from 1 to 0.01 on a cosine (`cosine_anneal`).

    One gradient evaluation an iteration, `steps` a sample; a sample adversarial at its input
    stops after the first (its norm, 0, cannot be beaten). Strength (`first_success`) is the
    number of steps behind the iterate first found within eps. Under transfer knowledge it
    optimises on the substitute and an iterate is adversarial when the target's top-1 label
    (a counted query) meets the goal; that verdict also steers ε.
    """

    kind = "minimizing"
    knowledge = ("white", "transfer")
    norms = ("l2",)
    pooled_calls = True  # every gradient is `oracle.loss_grad`'s

    hyperparameters = {"steps": hyper.Whole(1), "init_epsilon": hyper.Real(0, open_low=True),
                       "gamma": hyper.Real(0, 1, open_low=True, open_high=True)}

    def __init__(self, *, steps: int = 100, init_epsilon: float = 1.0, gamma: float = 0.05) -> None:
        self.set_hyperparameters(locals())

    @property
    def strength_budget(self) -> int:
        """Iterations, one gradient evaluation each: `steps`."""
        return self.steps

    def run(self, oracle: Oracle, x: torch.Tensor, y: torch.Tensor, *, eps: torch.Tensor, norm: str,
            target: torch.Tensor | None, sample_id: torch.Tensor) -> AttackResult:
        n = x.shape[0]
        best = SmallestAdversarial(x, eps, norm)
        lo, hi = oracle.bounds
        worst = L2_NORM.size(torch.maximum(x - lo, hi - x))
        radius = torch.full((n,), float(self.init_epsilon), dtype=x.dtype, device=x.device)
        delta = torch.zeros_like(x)
        labels = y if target is None else target
        active = torch.arange(n, device=x.device)
        for i in range(self.steps):
            xa = x[active] + delta[active]
            goal = None if target is None else target[active]
            logits, grad = oracle.loss_grad(xa, labels[active], target is not None, active)
            hit = oracle.verdict(xa, y[active], goal, active, logits)
            best.offer(active, xa, hit, i)
            if i == 0:  # adversarial at the input: nothing smaller to find
                active, grad, hit = active[~hit], grad[~hit], hit[~hit]
                if active.numel() == 0:
                    break
            step = delta[active] + cosine_anneal(i, self.steps, 1.0, FINAL_STEPSIZE) * unit_l2(grad, i, sample_id[active])
            radius[active] = torch.where(hit, radius[active] * (1 - self.gamma),
                                         radius[active] * (1 + self.gamma)).minimum(worst[active])
            step = step * per_sample(radius[active] / L2_NORM.size(step).clamp_min(1e-12), step)
            delta[active] = clip(x[active] + step, oracle.bounds) - x[active]
        return best.result()
