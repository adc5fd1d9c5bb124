"""NATTACK (Li et al. 2019): learn a Gaussian over the perturbation's pre-image from scores alone.

The search variable is the mean μ of N(μ, σ²I) in arctanh space: a draw z gives the example
x' = Π(tanh-box(atanh-box(x) + z)), Π the projection onto the ε-ball and the input range, so
every draw is a valid candidate. μ follows the natural-evolution-strategy estimate of the
expected reward's gradient, with the reward −max(margin, 0) standardised over the population
(the authors' clipped margin, here on the logits as the seed's margin loss). `box="clip"`
puts the Gaussian over δ itself (x' = Π(x + z)), as `cw_clip` does for C&W: the arctanh
pre-image of a pixel at 0 or 1 sits at ±7.25, where σ = 0.1 moves it by ~1e-6.

Batched across samples: each step is ONE oracle call carrying every active sample's mean
point and population; a sample leaves at success or when its query budget is spent. Draws
come from (seed, sample_id, step), so a sample's search does not depend on its batch.
Strength is queries (`ScoreAttack`).
"""

from __future__ import annotations

import torch

from advbench.core import hyperparameters as hyper
from advbench.core.sample_draws import normal
from advbench.core.steps import clip, project
from advbench.robustness.attacks.attack_contract import AttackResult
from advbench.robustness.attacks.carlini_wagner import BOXES
from advbench.robustness.attacks.minimum_norm import goal_margin
from advbench.robustness.attacks.oracles import ScoreOracle
from advbench.robustness.attacks.score import WHOLE_BUDGET, ScoreAttack


class NATTACK(ScoreAttack):
    """NATTACK, ℓ∞ and ℓ2, budgeted; the seed's σ = 0.1, lr = 0.02, 100 samples a step.

    μ starts at N(0, init_std²) (the authors' 0.001). A step queries, for every active sample,
    the image of μ itself and of `samples` draws μ + σε_i (ε_i ~ N(0, I)): `samples` + 1
    queries. If any of them meets the goal (the mean first, else the first such draw) the
    sample stops with it: it is inside the budget and was paid for. Otherwise
    μ ← μ + lr/(samples·σ)·Σ_i A_i ε_i, A the standardised rewards of the draws. One first
    query checks the clean input; `first_success` is the queries spent at the succeeding call.
    Steps of `samples` draws run while they fit the budget, then one last step of fewer draws
    spends what is left (`schedule`), so a sample that survives uses all of `n_queries`; it
    returns its last queried mean point. Draws hold samples·d numbers per active sample: large
    inputs want smaller batches.
    """

    revision = WHOLE_BUDGET
    hyperparameters = {"n_queries": hyper.Whole(1), "samples": hyper.Whole(2),  # standardised rewards need two
                       "sigma": hyper.Real(0, open_low=True), "lr": hyper.Real(0, open_low=True),
                       "init_std": hyper.Real(0), "box": hyper.Choice(tuple(BOXES)), "seed": hyper.Whole(None)}

    def __init__(self, *, n_queries: int = 20000, samples: int = 100, sigma: float = 0.1, lr: float = 0.02,
                 init_std: float = 0.001, box: str = "tanh", seed: int = 0) -> None:
        self.set_hyperparameters(locals())

    def schedule(self) -> list[int]:
        """Draws of each step (they and the mean point: q + 1 queries): `samples` while they fit, then the rest's."""
        return self.step_sizes(self.samples, 1)

    def run(self, oracle: ScoreOracle, x: torch.Tensor, y: torch.Tensor, *, eps: torch.Tensor, norm: str,
            target: torch.Tensor | None, sample_id: torch.Tensor) -> AttackResult:
        n, shape = x.shape[0], tuple(x.shape[1:])
        everyone = torch.arange(n, device=x.device)
        first = torch.where(oracle.verdict(x, y, target, everyone), 1, -1)
        x_adv = x.clone()
        box = BOXES[self.box]
        pre = box.start(x, oracle.bounds)
        mu = self.init_std * normal(self.seed, sample_id, shape, 0, device=x.device, dtype=x.dtype)
        spent = 1
        active = everyone[first < 0]
        for t, q in enumerate(self.schedule()):
            if active.numel() == 0:
                break
            k, cost = active.numel(), q + 1
            ya, ta = y[active], None if target is None else target[active]
            noise = normal(self.seed, sample_id[active], (q, *shape), t + 1, device=x.device, dtype=x.dtype)
            draws = torch.cat([torch.zeros_like(noise[:, :1]), noise], dim=1)      # row 0: the mean itself
            z = (pre[active] + mu[active])[:, None] + self.sigma * draws
            xa, ea = x[active].repeat_interleave(cost, dim=0), eps[active].repeat_interleave(cost)
            images = clip(project(box.to_model(z.flatten(0, 1), xa, oracle.bounds), xa, ea, norm), oracle.bounds)
            logits = oracle.logits(images, active.repeat_interleave(cost))
            yr, tr = ya.repeat_interleave(cost), None if ta is None else ta.repeat_interleave(cost)
            hit = oracle.verdict(images, yr, tr, active.repeat_interleave(cost), logits,
                                 undated=(first[active] < 0).repeat_interleave(cost)).view(k, cost)
            images = images.view(k, cost, *shape)
            won = hit.any(dim=1)
            pick = hit.long().argmax(dim=1)  # 0, the mean itself, where nothing hit
            x_adv[active] = images[torch.arange(k, device=x.device), pick]
            spent += cost
            first[active[won & (first[active] < 0)]] = spent
            reward = -goal_margin(logits, yr, tr).view(k, cost)[:, 1:].clamp_min(0)
            spread = reward.std(dim=1, unbiased=False, keepdim=True) + 1e-7
            score = (reward - reward.mean(dim=1, keepdim=True)) / spread                  # (k, q)
            step = (score.view(k, q, *([1] * len(shape))) * noise).sum(dim=1)
            mu[active] += self.lr / (q * self.sigma) * step
            if oracle.stops_on_hit:
                active = active[~won]
        return AttackResult(x_adv=x_adv, success=first >= 0, first_success=first)
