"""Minimum-norm white-box attacks: DeepFool (ℓ2, ℓ∞), and what the minimum-norm attacks share.

Minimum-norm attacks do not take a budget: each returns, per sample, the smallest adversarial example it found (the
input itself where it found none), so one run gives every sample's minimum ε and no ε search is needed. The benchmark
budget `eps` only dates `first_success`: the first iteration at which the best example so far was within it.

They are batched over samples (DeepFool over candidate classes too), keep per-sample state in tensors, and drop a
sample from the active set once nothing more is to be gained for it, so a sample's result never depends on its
batch. Under transfer knowledge they optimise on the substitute and an example counts once the target's top-1
label (a counted query) meets the goal, as for the transfer versions of FGSM/BIM/MIM.

`SmallestAdversarial`, `goal_margin`, `rows_of` and `unit_l2` serve C&W and EAD (`carlini_wagner`, `ead`), DDN (`ddn`),
FMN (`fmn`) and the others.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from advbench.core import hyperparameters as hyper
from advbench.core.norms import L2_NORM
from advbench.core.norms import norm as norm_of
from advbench.core.runtime import grad_rows, pieces
from advbench.core.sample_draws import normal
from advbench.core.steps import clip, lp_norm, per_sample, unit_direction
from advbench.robustness.attacks.attack_contract import Attack, AttackResult, Cost
from advbench.robustness.attacks.oracles import Objective, Oracle

CPU_GRAD_ELEMENTS = 1 << 18
"""On the CPU, the most input elements one forward of DeepFool's and FAB's class gradients takes
(85 CIFAR-size rows, 4,096 digits; each of its backwards the same rows). A backward holds the
model's activations for every row, and they grow with the input (ResNet-56: ~5 MB a CIFAR-size
row): when each sample went through once per candidate, under `grad_rows` alone a batch of 64
went through 198-row backwards and peaked at 1.65 GB resident, 1.55× Foolbox's DeepFool; under
this cap 0.97 GB (scripts/bench_probes.py --peer). The cost per row does not rise at a few dozen rows."""


def max_other(logits: torch.Tensor, cls: torch.Tensor) -> torch.Tensor:
    """Largest logit of any class but `cls`, per row.

    Masks with −inf: multiplying by a zero mask (a known peer bug) returns 0 instead of the
    true maximum whenever all other logits are negative. A scatter, not a one-hot mask: Square
    takes this every query, and `one_hot` scans its indices for their range first.
    """
    return logits.scatter(1, cls[:, None], -math.inf).amax(dim=1)


def goal_margin(logits: torch.Tensor, y: torch.Tensor, target: torch.Tensor | None) -> torch.Tensor:
    """How far each row is from the goal in logits; negative once the goal is met.

    Untargeted: Z_y − max_{j≠y} Z_j. Targeted: max_{j≠t} Z_j − Z_t.
    """
    if target is None:
        return logits.gather(1, y[:, None]).squeeze(1) - max_other(logits, y)
    return max_other(logits, target) - logits.gather(1, target[:, None]).squeeze(1)


ZERO_GRAD_SEED = 0
"""Seed of the random directions that stand in for a vanishing gradient (as in Foolbox and adv-lib,
which draw a Gaussian there): keyed by sample id and iteration, so a sample's numbers do not depend
on its batch, and fixed, since they are drawn so rarely that a seed in the cell key would only
recompute cells to the same numbers."""


def unit_l2(grad: torch.Tensor, i: int, sample_id: torch.Tensor) -> torch.Tensor:
    """The gradients at unit ℓ2 norm; a zero one (a saturated loss, a flat region of the model) is
    replaced by a Gaussian direction keyed by sample and iteration, so the iterate still moves."""
    norms = L2_NORM.size(grad)
    zero = (norms == 0).nonzero().squeeze(1)
    if zero.numel():
        grad = grad.clone()
        grad[zero] = normal(ZERO_GRAD_SEED, sample_id[zero], tuple(grad.shape[1:]), i, device=grad.device, dtype=grad.dtype)
        norms = L2_NORM.size(grad)
    return grad / per_sample(norms.clamp_min(1e-12), grad)


def rows_of(v: torch.Tensor | None, idx: torch.Tensor) -> torch.Tensor | None:
    """Rows `idx` of an optional per-sample tensor (a targeted attack's targets)."""
    return None if v is None else v[idx]


class SmallestAdversarial:
    """Per-sample record of the smallest adversarial example seen so far.

    `measure` ranks candidates (a perturbation batch to one size each; by default the threat's
    norm): EAD's elastic-net decision rule keeps its smallest β‖δ‖₁ + ‖δ‖₂² instead. `first_success`
    is the strength (iteration) at which the kept example first lay within the benchmark budget
    eps; ranked by the norm, the kept norm never grows, so that is the first time any adversarial
    example within eps was seen. One kept outside eps (another measure) is undated again.
    """

    def __init__(self, x: torch.Tensor, eps: torch.Tensor, norm: str,
                 measure: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
        self.x, self.eps, self.norm, self.measure = x, eps, norm, measure
        self.x_adv = x.clone()
        self.best = torch.full((x.shape[0],), math.inf, device=x.device, dtype=x.dtype)
        self.first = torch.full((x.shape[0],), -1, dtype=torch.long, device=x.device)

    def offer(self, idx: torch.Tensor, x_cand: torch.Tensor, adversarial: torch.Tensor,
              strength: torch.Tensor | int) -> None:
        """Keep candidates (rows `idx` of the batch) that are adversarial and smaller than the best."""
        delta = x_cand - self.x[idx]
        size = lp_norm(delta, self.norm)
        d = size if self.measure is None else self.measure(delta)
        better = adversarial & (d < self.best[idx])
        rows = idx[better]
        self.x_adv[rows] = x_cand[better]
        self.best[rows] = d[better]
        within = better & (size <= self.eps[idx])
        self.first[idx[better & ~within]] = -1
        reached = within & (self.first[idx] < 0)
        s = strength if isinstance(strength, int) else strength[reached]
        self.first[idx[reached]] = s

    def result(self) -> AttackResult:
        return AttackResult(x_adv=self.x_adv, success=torch.isfinite(self.best), first_success=self.first)


class DeepFool(Attack):
    """DeepFool (Moosavi-Dezfooli et al.): step to the nearest linearised decision boundary.

    Per iteration and sample, every candidate class k gets f_k = Z_k − Z_y and its gradient w_k, one gradient evaluation each
    (one forward of the samples and one backward of it per candidate, in memory-bounded groups of whole samples: `boundary_gradients`);
    the step goes to the closest linearised boundary, |f_k|/‖w_k‖_dual away, along the norm's steepest direction. Steps
    accumulate and are overshot by (1 + overshoot), as in the original. Candidates are the `candidates` most likely classes
    at the clean input, label excluded. Targeted: the one candidate is the target and f = Z_t − max_{j≠t} Z_j.

    A sample leaves the active set at its first adversarial iterate, so the first t
    iterations of a run are exactly a run with `steps=t`: the strength curve needs no reruns.
    """

    kind = "minimizing"
    knowledge = ("white", "transfer")
    norms = ("l2", "linf")

    hyperparameters = {"steps": hyper.Whole(1), "overshoot": hyper.Real(0), "candidates": hyper.Whole(2)}  # the label and another

    def __init__(self, *, steps: int = 100, overshoot: float = 0.02, candidates: int = 10) -> None:
        self.set_hyperparameters(locals())

    @property
    def strength_budget(self) -> int:
        """Iterations: `steps`."""
        return self.steps

    def declared_cost(self, knowledge: str, goal: str, num_classes: int) -> Cost:
        """One gradient per candidate an iteration: the target alone, else the likeliest classes but the label."""
        return super().declared_cost(knowledge, goal, num_classes) * (1 if goal == "targeted" else min(self.candidates, num_classes) - 1)

    def run(self, oracle: Oracle, x: torch.Tensor, y: torch.Tensor, *, eps: torch.Tensor, norm: str,
            target: torch.Tensor | None, sample_id: torch.Tensor) -> AttackResult:
        n = x.shape[0]
        best = SmallestAdversarial(x, eps, norm)
        x_t = x.clone()
        r_total = torch.zeros_like(x)
        active = torch.arange(n, device=x.device)
        classes: torch.Tensor | None = None
        for t in range(self.steps + 1):
            xa = x_t[active]
            logits = oracle.logits(xa, active)
            if classes is None:
                classes = self._classes(logits, y, target)
            hit = oracle.verdict(xa, y[active], rows_of(target, active), active, logits)
            best.offer(active, xa, hit, t)
            active = active[~hit]
            if t == self.steps or active.numel() == 0:
                break
            r_total[active] += self._step(oracle, x_t[active], y[active], classes[active],
                                          rows_of(target, active), active, norm, n)
            x_t[active] = clip(x[active] + (1 + self.overshoot) * r_total[active], oracle.bounds)
        return best.result()

    def _classes(self, logits: torch.Tensor, y: torch.Tensor, target: torch.Tensor | None) -> torch.Tensor:
        """(n, k) candidate classes: the target, or the most likely classes other than y."""
        if target is not None:
            return target[:, None]
        return runner_up_classes(logits, y, min(self.candidates, logits.shape[1]) - 1)

    def _step(self, oracle: Oracle, xa: torch.Tensor, y: torch.Tensor, classes: torch.Tensor,
              target: torch.Tensor | None, active: torch.Tensor, norm: str, batch: int) -> torch.Tensor:
        """The step of each active sample to its nearest linearised boundary."""
        return nearest_boundary_step(*boundary_gradients(oracle, xa, y, classes, target, active, batch), norm)


def runner_up_classes(logits: torch.Tensor, y: torch.Tensor, k: int) -> torch.Tensor:
    """(n, k): the k most likely classes other than y, most likely first."""
    return logits.scatter(1, y[:, None], -math.inf).topk(k, dim=1).indices


def boundary_gradients(oracle: Oracle, xa: torch.Tensor, y: torch.Tensor, classes: torch.Tensor,
                       target: torch.Tensor | None, active: torch.Tensor,
                       batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each sample's boundary functions against its candidate classes (m, k) and their input gradients
    (m, k, ...), one gradient evaluation per candidate: DeepFool's and FAB's linearisations.

    Untargeted, f_k = Z_k − Z_y; targeted (`target`, one candidate), f = Z_t − max_{j≠t} Z_j; so f < 0
    on the sample's side of the boundary and 0 on it. One forward of the samples and one backward of
    it per candidate (`value_and_grads`), as torchattacks' FAB, where replicating each sample once per
    candidate cost k forwards; in near-equal groups of at most `_backward_rows` samples, so a forward's
    activations stay bounded. A randomized model's candidates share the pass: one draw linearised.
    """
    m, k = classes.shape

    def boundary(sl: slice) -> Objective:
        """f of rows `sl`, (rows, k)."""
        if target is not None:
            return lambda z: -goal_margin(z, y[sl], classes[sl, 0])[:, None]
        return lambda z: z.gather(1, classes[sl]) - z.gather(1, y[sl, None])

    parts = [oracle.value_and_grads(xa[sl], boundary(sl), active[sl]) for sl in pieces(m, _backward_rows(batch, xa))]
    logits, grad = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
    return boundary(slice(None))(logits), grad


def _backward_rows(batch: int, xa: torch.Tensor) -> int:
    """The most samples one forward of `boundary_gradients` takes: `grad_rows`, on the CPU at most
    `CPU_GRAD_ELEMENTS` input elements too (on CUDA `grad_rows` is what `batch_size=auto` found to fit)."""
    rows = grad_rows(batch, xa.device)
    return rows if xa.device.type == "cuda" else min(rows, max(1, CPU_GRAD_ELEMENTS // max(1, xa[0].numel())))


def nearest_boundary_step(f: torch.Tensor, grad: torch.Tensor, norm: str) -> torch.Tensor:
    """DeepFool's step: to the nearest of k linearised boundaries f_k + w_k·r = 0 per sample.

    `f` is (m, k), `grad` (m, k, ...) their input gradients w_k. Differentiable in both, so
    DeepDefense's training regulariser unrolls the same step with second-order gradients.
    """
    m, k = f.shape
    dist = f.abs() / lp_norm(grad.flatten(0, 1), norm_of(norm).dual).reshape(m, k).clamp_min(1e-8)
    nearest = dist.argmin(dim=1)
    rows = torch.arange(m, device=f.device)
    w = grad[rows, nearest]
    return per_sample(dist[rows, nearest] + 1e-4, w) * unit_direction(w, norm)
