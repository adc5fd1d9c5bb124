"""A score-based attack on metrics: Square's ℓ∞ random search on the metric's score, no gradient.

Gradient attacks need a backward pass through the metric; classic NIQE or BRISQUE as users run
them, a metric with a rounding or an argmax inside, or a defended metric have none worth
following (BPDA would have to guess one). `MetricSquare` asks only for scores: every step
recolours one random square of the best image so far with ±ε per channel (Andriushchenko et al.
2020; the step, p's schedule and the block draws are `advbench.core.square_search`'s, the robustness
half's Square's) and keeps it when the metric's goodness rises. So the best score never moves
towards the metric's worse end, whichever direction the metric calls better.

The search starts from the clean image, not from Square's ±ε stripes: NIQE-like metrics punish
noise on every pixel, and a start of full-image noise would hand the search a worse image to climb
from. The budget is `n_queries` metric forwards per image, the clean image's included, counted
where they are spent (`queries` in the records); the trace holds the best raw score after each
query, so its last entry is the score of the returned image. Random numbers are keyed by each
row's own pixels (`advbench.core.sample_draws.row_keys`) and the seed: a row's search does not depend on
its batch, its chunk or a resume.
"""

from __future__ import annotations

import torch

from advbench.core import hyperparameters as hyper
from advbench.core.sample_draws import row_keys
from advbench.core.square_search import linf_draws, linf_step, p_schedule, recoloured
from advbench.quality.attacks.metric_attack import BOUNDS, Attacked, MetricAttack
from advbench.quality.metrics.metric_contract import QualityMetric
from advbench.quality.metrics.scoring import signed_gain


class MetricSquare(MetricAttack):
    """Square's ℓ∞ random search on a metric's goodness: `n_queries` forwards per image, p from `p_init`."""

    name = "square"
    needs_gradient = False
    hyperparameters = {"n_queries": hyper.Whole(1), "p_init": hyper.Real(0, 1, open_low=True),
                       "seed": hyper.Whole(None)}

    def __init__(self, *, n_queries: int = 1000, p_init: float = 0.05, seed: int = 0) -> None:
        self.set_hyperparameters(locals())

    @property
    def iterations(self) -> int:
        """The trace's width: one best score per query."""
        return self.n_queries

    @torch.no_grad()
    def run(self, metric: QualityMetric, x: torch.Tensor, eps: torch.Tensor) -> Attacked:
        queries = torch.zeros(len(x), dtype=torch.int64, device=x.device)

        def score(images: torch.Tensor) -> torch.Tensor:
            queries.add_(1)  # every call carries every row of the batch
            return metric(images).detach()

        best_x, best = x.clone(), score(x)
        trace = [best]
        moved = recoloured(x, eps, BOUNDS)
        draws = linf_draws(self.seed, row_keys(x), x, self.n_queries - 1)
        everyone = torch.arange(len(x), device=x.device)
        for t in range(1, self.n_queries):
            p = p_schedule(self.p_init, t - 1, self.n_queries)
            candidate = linf_step(moved, best_x, p, *draws.at(t, everyone))
            scores = score(candidate)
            better = signed_gain(metric, best, scores) > 0
            best_x = torch.where(better.view(-1, 1, 1, 1), candidate, best_x)
            best = torch.where(better, scores, best)
            trace.append(best)
        return Attacked(best_x, torch.stack(trace, 1), grad_evals=0, queries=queries)
