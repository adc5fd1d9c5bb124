"""MADC: per-image gradient ascent in the spirit of MAD competition (Wang & Simoncelli 2008).

MADC pits two metrics against each other: push one as far as possible while holding the
other fixed. Here the metric attacked is pushed towards its better end while the MSE to the
original stays inside a ball. Every image of a batch is attacked at once, with a per-image
step size t:

    candidate = P(delta + t * g / rms(g))     (g: gradient of the metric's goodness)
    P: scale back onto the MSE ball mse <= budget (and into |delta| <= eps when `linf`),
       then clip x + delta to [0, 1]
    accept the candidate if the metric improved (t *= 1.2), else keep delta (t /= 2)

Accepting only improvements makes the attack monotone even on metrics whose score is rough
at the pixel scale (NIQE's patch statistics change abruptly); each step costs one forward
and backward pass, the same as plain gradient ascent. The start step is a fraction `lr` of
the ball's radius. `budget = eps ** mse_power`.

One class serves both places MADC appears: `advbench iqa run` (attack=madc: RMS <= eps and
|delta| <= eps, `mse_power=2, linf=True`, the defaults) and the seed's Table 1 (`advbench uap
eval`, `advbench.quality.uap.evaluation.madc_attack`: MSE <= amplitude ** mse_power, no ℓ∞ bound),
where it is the slow, image-specific reference for the UAP.
"""

from __future__ import annotations

import torch

from advbench.core import hyperparameters as hyper
from advbench.quality.attacks.metric_attack import Attacked, MetricAttack, check_finite_step, final_scores
from advbench.quality.metrics.metric_contract import QualityMetric
from advbench.quality.metrics.scoring import goodness


def _goodness_and_grad(metric: QualityMetric, x: torch.Tensor, delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    delta = delta.detach().requires_grad_(True)
    good = goodness(metric, metric(x + delta))
    (grad,) = torch.autograd.grad(good.sum(), delta)
    return check_finite_step(good.detach(), grad)


class MADC(MetricAttack):
    """`steps` accept-if-better steps inside MSE <= eps ** mse_power (and |delta| <= eps when `linf`)."""

    name = "madc"
    hyperparameters = {"steps": hyper.Whole(1), "lr": hyper.Real(0, open_low=True),
                       "mse_power": hyper.Real(0, open_low=True), "linf": hyper.Flag()}

    def __init__(self, *, steps: int = 50, lr: float = 0.05, mse_power: float = 2.0, linf: bool = True) -> None:
        self.set_hyperparameters(locals())

    def run(self, metric: QualityMetric, x: torch.Tensor, eps: torch.Tensor) -> Attacked:
        x_adv, kept = self.ascend(metric, x, eps, self.steps)
        lo, hi = metric.score_range
        raw = lo + kept * metric.range_width if metric.higher_better else hi - kept * metric.range_width
        return Attacked(x_adv, torch.cat([raw[:, :-1], final_scores(metric, x_adv)], 1), self.steps + 1)

    def ascend(self, metric: QualityMetric, x: torch.Tensor, eps: torch.Tensor,
               steps: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`steps` candidate steps (0: none) on a batch at budgets `eps` (N,): the attacked images and the
        goodness of the kept candidate after each step, (N, steps) (the start's, (N, 1), when none)."""
        dims = tuple(range(1, x.dim()))
        shape = (-1,) + (1,) * (x.dim() - 1)
        budget = eps.double().pow(self.mse_power).to(dtype=x.dtype, device=x.device).expand(len(x))
        linf = eps.to(dtype=x.dtype, device=x.device).view(shape) if self.linf else None
        delta = torch.zeros_like(x)
        good, grad = _goodness_and_grad(metric, x, delta)
        step = self.lr * budget.sqrt()
        kept = []
        for _ in range(steps):
            with torch.no_grad():
                rms = grad.pow(2).mean(dims).sqrt().clamp_min(1e-12)
                cand = delta + (step / rms).view(shape) * grad
                mse = cand.pow(2).mean(dims).clamp_min(1e-20)
                cand = cand * (budget / mse).sqrt().clamp(max=1.0).view(shape)
                if linf is not None:
                    cand = torch.maximum(torch.minimum(cand, linf), -linf)
                cand = (x + cand).clamp(0, 1) - x
            cand_good, cand_grad = _goodness_and_grad(metric, x, cand)
            better = cand_good > good
            keep = better.view(shape)
            delta = torch.where(keep, cand, delta)
            grad = torch.where(keep, cand_grad, grad)
            good = torch.where(better, cand_good, good)
            step = torch.where(better, step * 1.2, step * 0.5)
            kept.append(good)
        trace = torch.stack(kept, 1) if kept else good.unsqueeze(1)
        return (x + delta).detach(), trace
