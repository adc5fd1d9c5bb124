"""The per-image gradient attacks of the MSU metrics-robustness benchmark (Antsiferova et al., AAAI 2024).

All of them ascend the metric's goodness under an ℓ∞ budget ε per image, stepping and
projecting with `advbench.core.steps`, the code the robustness half's FGSM/BIM/MIM use:

* FGSM: one step of size ε along sign(∇).
* I-FGSM: `steps` sign steps of a fixed size α (MSU: 10 steps of 1/255), projected onto the ε-ball.
* MI-FGSM: I-FGSM along the sign of a momentum of ℓ1-normalised gradients (Dong et al. 2018, decay 1).
* AMI-FGSM: MI-FGSM whose step adapts to the budget, α = ε / steps (MSU's AMI-FGSM settings).
* Korhonen–You: Adam (lr 0.005, 10 steps) on the gradient masked by the image's spatial
  activity (Sobel magnitude of luma, dilated), so changes hide in textured regions; projected
  onto the ε-ball here, so every attack meets one budget.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from advbench.core import hyperparameters as hyper
from advbench.core.steps import accumulate_momentum, adam_step, linf_box, step_in_box
from advbench.quality.attacks.metric_attack import BOUNDS, Attacked, MetricAttack, final_scores, score_and_grad
from advbench.quality.metrics.metric_contract import QualityMetric

_LUMA = torch.tensor([0.299, 0.587, 0.114])


class IterativeFGSM(MetricAttack):
    """Sign steps on the goodness gradient, momentum `decay` (0: none), step α or ε/steps when α is None."""

    hyperparameters = {"steps": hyper.Whole(1), "alpha": hyper.Real(0, open_low=True, optional=True),
                       "decay": hyper.Real(0)}

    def __init__(self, *, steps: int = 10, alpha: float | None = 1 / 255, decay: float = 0.0) -> None:
        self.set_hyperparameters(locals())

    def run(self, metric: QualityMetric, x: torch.Tensor, eps: torch.Tensor) -> Attacked:
        alpha = eps / self.steps if self.alpha is None else torch.full_like(eps, self.alpha)
        lo, hi = linf_box(x, eps, BOUNDS)
        x_adv, momentum, trace = x.clone(), torch.zeros_like(x) if self.decay else None, []
        for t in range(self.steps):
            scores, grad = score_and_grad(metric, x_adv)
            if t:
                trace.append(scores)
            if momentum is None:  # without momentum, sign(g / ‖g‖₁) is sign(g): skip the normalisation
                direction = grad.sign_()
            else:
                momentum = accumulate_momentum(momentum, grad, self.decay)
                direction = momentum.sign()
            x_adv = step_in_box(x_adv, direction, alpha, lo, hi)
        return Attacked(x_adv, torch.cat([torch.stack(trace, 1) if trace else x.new_zeros(len(x), 0),
                                          final_scores(metric, x_adv)], 1), self.steps)


class MetricFGSM(IterativeFGSM):
    """One signed-gradient step on a metric's score (the robustness half's `FGSM` attacks classifiers)."""

    name = "fgsm"

    def __init__(self) -> None:
        super().__init__(steps=1, alpha=None)


class IFGSM(IterativeFGSM):
    name = "ifgsm"


class MIFGSM(IterativeFGSM):
    name = "mifgsm"

    def __init__(self, *, steps: int = 10, alpha: float | None = 1 / 255, decay: float = 1.0) -> None:
        super().__init__(steps=steps, alpha=alpha, decay=decay)


class AMIFGSM(IterativeFGSM):
    name = "amifgsm"

    def __init__(self, *, steps: int = 10, alpha: float | None = None, decay: float = 1.0) -> None:
        super().__init__(steps=steps, alpha=alpha, decay=decay)


def activity_map(x: torch.Tensor) -> torch.Tensor:
    """(N, 1, H, W) in [0, 1]: Sobel gradient magnitude of luma (border zeroed), over its image maximum,
    dilated with a 5x5 disk: where Korhonen and You let the perturbation go."""
    luma = (x * _LUMA.to(x).view(1, 3, 1, 1)).sum(1, keepdim=True)
    sobel = torch.tensor([[-1.0, 0.0, 1.0], [-2.0, 0.0, 2.0], [-1.0, 0.0, 1.0]], dtype=x.dtype, device=x.device)
    kernels = torch.stack([sobel, sobel.T]).unsqueeze(1)
    edges = F.conv2d(F.pad(luma, (1, 1, 1, 1), mode="replicate"), kernels).norm(dim=1, keepdim=True)
    edges = F.pad(edges[..., 1:-1, 1:-1], (1, 1, 1, 1))
    peak = edges.amax(dim=(1, 2, 3), keepdim=True)
    edges = torch.where(peak > 0, edges / peak.clamp_min(1e-12), torch.ones_like(edges))
    return torch.maximum(F.max_pool2d(edges, (3, 5), stride=1, padding=(1, 2)),
                         F.max_pool2d(edges, (5, 3), stride=1, padding=(2, 1)))


class Korhonen(MetricAttack):
    name = "korhonen"
    hyperparameters = {"steps": hyper.Whole(1), "lr": hyper.Real(0, open_low=True)}

    def __init__(self, *, steps: int = 10, lr: float = 0.005) -> None:
        self.set_hyperparameters(locals())

    def run(self, metric: QualityMetric, x: torch.Tensor, eps: torch.Tensor) -> Attacked:
        mask = activity_map(x)
        lo, hi = linf_box(x, eps, BOUNDS)
        x_adv, m, v, trace = x.clone(), torch.zeros_like(x), torch.zeros_like(x), []
        for t in range(1, self.steps + 1):
            scores, grad = score_and_grad(metric, x_adv)
            if t > 1:
                trace.append(scores)
            x_adv = torch.clamp(x_adv + adam_step(grad.mul_(mask), m, v, t, self.lr), lo, hi)
        return Attacked(x_adv, torch.cat([torch.stack(trace, 1) if trace else x.new_zeros(len(x), 0),
                                          final_scores(metric, x_adv)], 1), self.steps)
