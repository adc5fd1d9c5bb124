"""Transferability tricks on the shared iterative loop: diverse inputs (DIM) and TI smoothing.

Both are hooks on `IterativeGradientAttack`, not loops of their own: DIM changes where the
gradient is taken (a random resize-and-pad of the iterate, differentiated back to the iterate),
TI filters the gradient before momentum and the sign step. Everything else (momentum, step,
projection, per-sample early stopping on the target's labels under a transfer oracle) is the
loop FGSM/BIM/MIM use.

Randomness is per sample: the resize and pad of sample i at iteration t are a function of
(seed, sample_id[i], t) only, so a sample's trajectory does not depend on its batch.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from advbench.core import hyperparameters as hyper
from advbench.core.sample_draws import uniform
from advbench.robustness.attacks.gradient import IterativeGradientAttack
from advbench.robustness.attacks.oracles import WhiteBoxOracle


def diverse_inputs(x: torch.Tensor, *, prob: float, resize_rate: float, seed: int, sample_id: torch.Tensor,
                   stream: int) -> torch.Tensor:
    """With probability `prob` per sample: shrink to rnd×rnd, rnd ∈ [⌊rate·s⌋, s], zero-pad back to s×s.

    The seed's DIM (appendix B). Sizes and pad offsets are uniform integers over the closed
    ranges, drawn per sample; the resize is bilinear with align_corners=False, i.e. exactly
    `F.interpolate` then `F.pad`. Bilinear resizing is separable, so each sample's resize and
    pad is one matrix per axis, out = R_y · x · R_xᵀ, batched with `einsum`: every sample has its
    own size in one call, and forward and backward are plain matrix products (deterministic on
    GPUs too, unlike `grid_sample`'s backward). Samples not drawn are returned unchanged.
    """
    _, _, h, w = x.shape
    u = uniform(seed, sample_id, (4,), stream, device=x.device, dtype=torch.float64)
    apply = u[:, 0] < prob
    if not bool(apply.any()):
        return x
    rows = _resize_and_pad(h, resize_rate, u[:, 1], u[:, 2]).to(x.dtype)
    cols = _resize_and_pad(w, resize_rate, u[:, 1], u[:, 3]).to(x.dtype)
    out = torch.einsum("nij,ncjk,nlk->ncil", rows, x, cols)
    return torch.where(apply.reshape(-1, 1, 1, 1), out, x)


def _resize_and_pad(size: int, resize_rate: float, frac: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """(n, size, size) matrices: row r of sample i interpolates the input at (r − start + ½)·size/rnd − ½.

    rnd = ⌊rate·size⌋ + ⌊frac·(size − ⌊rate·size⌋ + 1)⌋ and start = ⌊offset·(size − rnd + 1)⌋, so
    both are uniform over their closed ranges; rows outside [start, start + rnd) are zero (the pad).
    """
    lo = int(resize_rate * size)
    rnd = lo + torch.floor(frac * (size - lo + 1)).clamp(max=size - lo)            # (n,)
    start = torch.floor(offset * (size - rnd + 1)).clamp(max=size - rnd)            # (n,)
    pos = torch.arange(size, device=frac.device, dtype=torch.float64)[None, :] - start[:, None]
    src = ((pos + 0.5) * size / rnd[:, None] - 0.5).clamp(0, size - 1)              # (n, size)
    i0 = src.floor()
    i1 = (i0 + 1).clamp(max=size - 1)
    t = src - i0
    j = torch.arange(size, device=frac.device, dtype=torch.float64)[None, None, :]
    weights = (1 - t)[..., None] * (j == i0[..., None]) + t[..., None] * (j == i1[..., None])
    inside = (pos >= 0) & (pos < rnd[:, None])
    return weights * inside[..., None]


def gaussian_kernel(size: int, nsig: float) -> torch.Tensor:
    """The TI paper's kernel: N(0, 1) density on `size` points over [−nsig, nsig], outer product, sum 1."""
    t = torch.linspace(-nsig, nsig, size, dtype=torch.float64)
    k1 = torch.exp(-0.5 * t * t)
    k2 = torch.outer(k1, k1)
    return k2 / k2.sum()


def smooth(grad: torch.Tensor, kernel: torch.Tensor) -> torch.Tensor:
    """Each channel convolved with `kernel` (odd size), zero padding, output the input's size."""
    c = grad.shape[1]
    weight = kernel.to(grad).expand(c, 1, *kernel.shape).contiguous()
    return F.conv2d(grad, weight, padding=kernel.shape[-1] // 2, groups=c)


class DIM(IterativeGradientAttack):
    """Diverse-inputs method with MIM's momentum; the seed's settings: 10 steps, α = 0.15·ε, μ = 1.

    The gradient at each step is that of the loss at a random resize-and-pad of the iterate
    (probability `prob`), taken back through the transform to the iterate.
    """

    hyperparameters = {**IterativeGradientAttack.hyperparameters, "resize_rate": hyper.Real(0, 1, open_low=True),
                       "prob": hyper.Real(0, 1), "early_stop": hyper.Flag()}

    def __init__(self, *, steps: int = 10, rel_stepsize: float = 0.15, decay: float = 1.0, resize_rate: float = 0.9,
                 prob: float = 0.5, early_stop: bool = True, seed: int = 0) -> None:
        self.set_hyperparameters(locals())
        super().__init__(steps=steps, rel_stepsize=rel_stepsize, decay=decay, seed=seed)

    def _gradient(self, oracle: WhiteBoxOracle, x: torch.Tensor, labels: torch.Tensor, targeted: bool,
                  idx: torch.Tensor, sample_id: torch.Tensor, t: int) -> tuple[torch.Tensor | None, torch.Tensor]:
        """Gradient through the transform; no logits, since the model saw the transformed input."""
        if self.prob == 0.0:
            return super()._gradient(oracle, x, labels, targeted, idx, sample_id, t)
        x = x.detach().requires_grad_(True)
        with torch.enable_grad():
            moved = diverse_inputs(x, prob=self.prob, resize_rate=self.resize_rate, seed=self.seed,
                                   sample_id=sample_id, stream=t)
            _, grad_moved = oracle.loss_grad(moved.detach(), labels, targeted, idx)
            grad, = torch.autograd.grad(moved, x, grad_moved)
        return None, grad


class TI(DIM):
    """Translation-invariant method: the gradient is smoothed by a Gaussian kernel before momentum and the sign step.

    `kernel_size=None` picks the odd size nearest to side/20 (15 at 299 pixels as in the TI
    paper; 3 on CIFAR-10 and digits). Diverse inputs are off by default (`prob=0`); set `prob`
    for TI-DIM.
    """

    hyperparameters = {**DIM.hyperparameters, "kernel_size": hyper.Whole(1, odd=True, optional=True),
                       "nsig": hyper.Real(0, open_low=True)}

    def __init__(self, *, steps: int = 10, rel_stepsize: float = 0.15, decay: float = 1.0,
                 kernel_size: int | None = None, nsig: float = 3.0, resize_rate: float = 0.9, prob: float = 0.0,
                 early_stop: bool = True, seed: int = 0) -> None:
        self.set_hyperparameters(locals())
        super().__init__(steps=steps, rel_stepsize=rel_stepsize, decay=decay, resize_rate=resize_rate, prob=prob,
                         early_stop=early_stop, seed=seed)

    def _kernel(self, side: int) -> torch.Tensor:
        size = self.kernel_size
        if size is None:
            size = max(3, 2 * math.floor(side / 40) + 1)
        return gaussian_kernel(size, self.nsig)

    def _direction(self, grad: torch.Tensor, momentum: torch.Tensor | None,
                   norm: str) -> tuple[torch.Tensor, torch.Tensor | None]:
        return super()._direction(smooth(grad, self._kernel(min(grad.shape[-2:]))), momentum, norm)
