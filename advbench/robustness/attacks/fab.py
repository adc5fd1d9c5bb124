"""FAB, the Fast Adaptive Boundary attack (Croce and Hein, ICML 2020), and FAB-T, its targeted runs.

FAB minimises the ℓ∞, ℓ2 or ℓ1 norm of an adversarial perturbation without a step size: each
iteration linearises the model at the iterate, picks the nearest linearised boundary (as
DeepFool), and projects both the iterate and the clean input onto that hyperplane within the
box (`attacks.hyperplane`). It steps to a convex combination of the two projections, weighted
towards the clean input's by how far the iterate's projection is (at most `alpha_max`),
overshooting by `eta`; an iterate that is adversarial is pulled back towards the clean input by
`beta`, so the iterates track the boundary from both sides and close in on the input. As the
other minimum-norm attacks (`minimum_norm`), it returns per sample the smallest adversarial
example it saw, the input itself where it saw none.

FAB-T (`n_target_classes` > 0, AutoAttack's standard member) replaces the nearest of all
boundaries by the one against a single class, the 2nd, 3rd, … most likely clean class in turn:
one gradient an iteration instead of one per class. Success stays untargeted.
"""

from __future__ import annotations

import torch

from advbench.core import hyperparameters as hyper
from advbench.core.errors import AdvbenchError
from advbench.core.norms import norm as norm_of
from advbench.core.steps import clip, lp_norm, per_sample
from advbench.robustness.attacks.attack_contract import Attack, AttackResult, Cost
from advbench.robustness.attacks.hyperplane import PROJECTIONS
from advbench.robustness.attacks.minimum_norm import (
    SmallestAdversarial,
    boundary_gradients,
    goal_margin,
    runner_up_classes,
)
from advbench.robustness.attacks.oracles import Oracle
from advbench.robustness.attacks.starts import fab_start


class FAB(Attack):
    """FAB ℓ∞ / ℓ2 / ℓ1 (untargeted over every class, or FAB-T over the top runner-up classes), with the
    paper's and AutoAttack's defaults: 100 iterations, α_max = 0.1, η = 1.05, β = 0.9. Under ℓ1 it is
    the original's `norm='L1'`: the nearest boundary by |f|/‖g‖∞, the ℓ1 projection, its restarts.

    A run starts at the clean input (a restart after the first: on the sphere of radius
    min(smallest norm found, ε)/2 around it, ε the threat's, drawn as the original, `fab_start`) and takes `n_iter`
    iterations; `final_search` secant steps between the clean input and the run's best example
    follow (the paper's final search; 0: none, as AutoAttack's FAB). Runs go target-major (each
    runner-up class, then each restart), each on the samples with no adversarial example within ε
    yet (AutoAttack's protocol), so a sample's result is the smallest over the runs it took: exact
    above ε, at most as small as the runs that broke it below ε.

    Cost per sample and iteration: one gradient evaluation per candidate class (K − 1 untargeted,
    1 for FAB-T and for a targeted threat) and one query; `final_search` + 1 queries a run per sample
    with an adversarial example. `strength_budget` counts iterations over all runs; an example
    from iteration i of run r is dated r·n_iter + i + 1, one from a run's final search (r + 1)·n_iter.

    Under a targeted threat every run attacks the given target (the boundary
    Z_t − max_{j≠t} Z_j, success meaning the target), so `n_target_classes` only counts runs.
    Under transfer knowledge it linearises the substitute; success is the target's top-1 label.
    """

    kind = "minimizing"
    knowledge = ("white", "transfer")
    norms = ("linf", "l2", "l1")

    hyperparameters = {"n_iter": hyper.Whole(1), "n_restarts": hyper.Whole(1), "n_target_classes": hyper.Whole(0),
                       "alpha_max": hyper.Real(0, 1), "eta": hyper.Real(1), "beta": hyper.Real(0, 1, open_low=True),
                       "final_search": hyper.Whole(0), "seed": hyper.Whole(None)}

    def __init__(self, *, n_iter: int = 100, n_restarts: int = 1, n_target_classes: int = 0, alpha_max: float = 0.1,
                 eta: float = 1.05, beta: float = 0.9, final_search: int = 3, seed: int = 0) -> None:
        self.set_hyperparameters(locals())

    @property
    def strength_budget(self) -> int:
        """Iterations over all runs: n_iter · n_restarts · max(n_target_classes, 1)."""
        return self.n_iter * self.n_restarts * max(self.n_target_classes, 1)

    def declared_cost(self, knowledge: str, goal: str, num_classes: int) -> Cost:
        """One gradient per candidate class an iteration: K − 1 untargeted, 1 for FAB-T or a targeted threat."""
        per_iteration = 1 if goal == "targeted" or self.n_target_classes else num_classes - 1
        return super().declared_cost(knowledge, goal, num_classes) * per_iteration

    def run(self, oracle: Oracle, x: torch.Tensor, y: torch.Tensor, *, eps: torch.Tensor, norm: str,
            target: torch.Tensor | None, sample_id: torch.Tensor) -> AttackResult:
        everyone = torch.arange(x.shape[0], device=x.device)
        best = SmallestAdversarial(x, eps, norm)
        clean = oracle.logits(x, everyone)
        best.offer(everyone, x, oracle.verdict(x, y, target, everyone, clean), 0)
        runs = [(classes, restart) for classes in self._classes(clean, y, target) for restart in range(self.n_restarts)]
        for run, (classes, restart) in enumerate(runs):
            rows = everyone[best.first < 0]  # still robust at ε
            if rows.numel() == 0:
                break
            tgt = None if target is None else target[rows]
            start = x[rows]
            if restart:
                radius = 0.5 * torch.minimum(best.best[rows], eps[rows])
                start = fab_start(x[rows], radius, norm, oracle.bounds, seed=self.seed,
                                  sample_id=sample_id[rows], stream=run)
            self._iterate(oracle, x, start, y[rows], tgt, classes[rows], rows, norm, best, run * self.n_iter)
            self._final_search(oracle, x, clean, y, target, rows, best, (run + 1) * self.n_iter)
        return best.result()

    def _classes(self, clean: torch.Tensor, y: torch.Tensor, target: torch.Tensor | None) -> list[torch.Tensor]:
        """Each run's candidate classes (n, k): the target; FAB-T's runner-up classes one at a time; or
        every other class at once."""
        k = clean.shape[1]
        if target is not None:
            return [target[:, None]]
        if self.n_target_classes > k - 1:
            raise AdvbenchError(f"FAB-T n_target_classes={self.n_target_classes} exceeds the {k - 1} other classes")
        if self.n_target_classes:
            ranked = runner_up_classes(clean, y, self.n_target_classes)
            return [ranked[:, j:j + 1] for j in range(self.n_target_classes)]
        return [runner_up_classes(clean, y, k - 1)]

    def _iterate(self, oracle: Oracle, x: torch.Tensor, start: torch.Tensor, y: torch.Tensor,
                 target: torch.Tensor | None, classes: torch.Tensor, rows: torch.Tensor, norm: str,
                 best: SmallestAdversarial, offset: int) -> None:
        """`n_iter` FAB iterations of samples `rows` from `start`, every adversarial iterate offered to `best`."""
        x0, cur = x[rows], start
        for i in range(self.n_iter):
            f, grad = boundary_gradients(oracle, cur, y, classes, target, rows, x.shape[0])
            cur = self._step(cur, x0, f, grad, norm, oracle.bounds)
            hit = oracle.verdict(cur, y, target, rows, oracle.logits(cur, rows))
            best.offer(rows, cur, hit, offset + i + 1)
            cur = torch.where(per_sample(hit, cur), x0 + self.beta * (cur - x0), cur)

    def _step(self, cur: torch.Tensor, x0: torch.Tensor, f: torch.Tensor, grad: torch.Tensor, norm: str,
              bounds: tuple[float, float]) -> torch.Tensor:
        """One FAB step: project the iterate and the clean input onto the nearest linearised boundary
        f_k + w_k·(z − cur) = 0 within the box, and combine the two overshot projections."""
        m, k = f.shape
        dist = f.abs() / (lp_norm(grad.flatten(0, 1), norm_of(norm).dual).reshape(m, k) + 1e-12)
        nearest = dist.argmin(dim=1)
        w = grad[torch.arange(m, device=f.device), nearest].flatten(1)
        b = (w * cur.flatten(1)).sum(dim=1) - f.gather(1, nearest[:, None]).squeeze(1)
        both = PROJECTIONS[norm_of(norm)](torch.cat([cur.flatten(1), x0.flatten(1)]), torch.cat([w, w]), torch.cat([b, b]), bounds)
        size = lp_norm(both, norm).clamp_min(1e-8)
        alpha = per_sample((size[:m] / (size[:m] + size[m:])).clamp(0, self.alpha_max), cur)
        d_cur, d_x0 = both[:m].view_as(cur), both[m:].view_as(cur)
        return clip((cur + self.eta * d_cur) * (1 - alpha) + (x0 + self.eta * d_x0) * alpha, bounds)

    def _final_search(self, oracle: Oracle, x: torch.Tensor, clean: torch.Tensor, y: torch.Tensor,
                      target: torch.Tensor | None, rows: torch.Tensor, best: SmallestAdversarial, strength: int) -> None:
        """The paper's final search: `final_search` steps on the segment from the clean input (on the
        sample's side of the boundary) to the best example (past it), each to where the secant of the
        goal margin crosses zero, keeping the side that point falls on; adversarial points go to `best`."""
        found = rows[torch.isfinite(best.best[rows])]
        if self.final_search == 0 or found.numel() == 0:
            return
        tgt = None if target is None else target[found]
        near, far = x[found], best.x_adv[found].clone()
        m_near = goal_margin(clean[found], y[found], tgt)
        m_far = goal_margin(oracle.logits(far, found), y[found], tgt)
        for _ in range(self.final_search):
            s = m_near / (m_near - m_far).clamp_min(1e-12)
            s = torch.where((s >= 0) & (s <= 1), s, torch.ones_like(s))  # no crossing on the segment: stay
            mid = near + per_sample(s, near) * (far - near)
            logits = oracle.logits(mid, found)
            hit = oracle.verdict(mid, y[found], tgt, found, logits)
            best.offer(found, mid, hit, strength)
            margin, side = goal_margin(logits, y[found], tgt), per_sample(hit, mid)
            near, far = torch.where(side, near, mid), torch.where(side, mid, far)
            m_near, m_far = torch.where(hit, m_near, margin), torch.where(hit, margin, m_far)
