"""The ℓp norms a threat model's ball is measured in, one class each, and the registry `norm(name)`.

A norm is the only place that knows what its name means: the projection onto the ε-ball
intersected with the input box, the steepest-ascent step, the random starts, the per-sample
distance, the dual norm (a linear boundary at margin f lies |f|/‖g‖_dual away: DeepFool, FAB,
FMN) and the factor a normalised budget is scaled by. Attacks, the oracle, the records, the
minimum-ε search, the curves and the report call these methods instead of comparing names, so
a new norm is one class here plus its threat YAMLs. Every method takes a batch (N, ...) with a
per-sample budget `eps` of shape (N,).
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch

from advbench.core.box_projections import keep_pixels, l1_box_projection, pixel_sums, whole_pixels
from advbench.core.errors import AdvbenchError
from advbench.core.registry import Registry
from advbench.core.sample_draws import normal, uniform

_TINY = 1e-12


def per_sample(v: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Reshape a (N,) tensor to broadcast against `like` (N, ...)."""
    return v.reshape(-1, *([1] * (like.dim() - 1)))


NORMS: Registry[Norm] = Registry("norm", make=lambda name, cls: cls())
"""Every norm by name, one instance each, filled by `@NORMS.register(name)` beside its class."""


def _clip(x: torch.Tensor, bounds: tuple[float, float]) -> torch.Tensor:
    return x.clamp(bounds[0], bounds[1])


class Norm:
    """One ℓp norm. Instances are singletons (`norm(name)`), so they compare and hash by identity."""

    name: ClassVar[str]
    p: ClassVar[float]
    """The exponent: torch.cdist's and torch.linalg.vector_norm's `p`."""
    label: ClassVar[str]
    """How figures and tables write the norm."""
    dual_name: ClassVar[str]
    normalizable: ClassVar[bool] = False
    """Whether budgets may be given normalised by the input's size (`threat.normalized_l2`)."""
    sparse_steps: ClassVar[bool] = False
    """Whether the steepest ascent moves a single coordinate, so that gradient attacks step along the
    k largest coordinates instead and adapt k (`sparse_direction`; APGD-ℓ1's sparsity schedule)."""
    whole: ClassVar[bool] = False
    """Whether sizes and budgets are whole numbers (ℓ0 counts pixels): the minimum-ε search then brackets
    whole budgets only (`search_resolution`, `snap`) and FMN moves its radius by whole steps."""
    whole_budget: ClassVar[str] = ""
    """What a budget of a `whole` norm counts, for the one line refusing a fraction."""
    axis: ClassVar[str] = ""
    """A figure's budget axis under a `whole` norm, what its budget counts (else '<label> budget ε')."""
    search_leads: ClassVar[bool] = False
    """Whether random search beats gradients even on an undefended model (ℓ0: Croce et al. 2022, Sparse-RS
    over PGD-ℓ0), so a score attack beating the white-box ones is no sign of masked gradients (`audit.signs`)."""

    def __repr__(self) -> str:
        return f"norm('{self.name}')"

    @property
    def dual(self) -> Norm:
        """The dual norm: |⟨g, δ⟩| ≤ ‖g‖_dual·‖δ‖, so a linear boundary at f lies |f|/‖g‖_dual away."""
        return norm(self.dual_name)

    def size(self, v: torch.Tensor) -> torch.Tensor:
        """Per-sample norm of a batch (N, ...)."""
        raise NotImplementedError

    def distance(self, x_adv: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Per-sample ‖x_adv − x‖."""
        return self.size(x_adv - x)

    def check_budget(self, eps: float) -> None:
        """Refuse, in one line, a budget the norm cannot take (where the threat is built): a fraction
        under a `whole` norm."""
        if self.whole and eps != math.floor(eps):
            raise AdvbenchError(f"{self.whole_budget}, got {eps:g}")

    def search_resolution(self, width: float) -> float:
        """The narrowest bracket the minimum-ε search closes to, asked `width`: itself, or for a `whole`
        norm the whole number at or below it, at least 1 (a bracket [k − 1, k] is exact)."""
        return max(1.0, float(math.floor(width + 1e-9))) if self.whole else width

    def snap(self, eps: torch.Tensor, up: torch.Tensor | bool = False) -> torch.Tensor:
        """The budgets the norm takes next to `eps` (N,): itself, or for a `whole` norm the whole number
        above it where `up`, below it elsewhere (the search's probes)."""
        if not self.whole:
            return eps
        return torch.where(torch.as_tensor(up, device=eps.device), torch.ceil(eps - 1e-9), torch.floor(eps + 1e-9))

    def normalized_scale(self, d: int) -> float:
        """The factor from a normalised budget to the raw norm of a d-element perturbation."""
        raise AdvbenchError(f"normalised budgets apply to the l2 norm only, not {self.name}")

    def direction(self, g: torch.Tensor) -> torch.Tensor:
        """Steepest-ascent direction of unit norm for gradient g."""
        raise AdvbenchError(f"no attack takes steepest-ascent steps in {self.name} yet")

    def sparse_direction(self, g: torch.Tensor, fraction: torch.Tensor) -> torch.Tensor:
        """A unit step along the largest |g| coordinates, a share `fraction` (N,) of them (`sparse_steps`)."""
        raise AdvbenchError(f"steps in {self.name} move every coordinate; no sparse steps")

    def project_ball(self, x_adv: torch.Tensor, x: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
        """Project onto the ball of radius eps (per sample) around x, ignoring the input box."""
        raise NotImplementedError

    def project(self, x_adv: torch.Tensor, x: torch.Tensor, eps: torch.Tensor,
                bounds: tuple[float, float]) -> torch.Tensor:
        """Onto the ε-ball around x intersected with the box `bounds`."""
        return _clip(self.project_ball(x_adv, x, eps), bounds)

    def random_start(self, x: torch.Tensor, eps: torch.Tensor, bounds: tuple[float, float], *, seed: int,
                     sample_id: torch.Tensor, stream: int = 0) -> torch.Tensor:
        """A point drawn uniformly from the ε-ball, clipped to bounds, from (seed, sample_id, stream) only."""
        raise AdvbenchError(f"no attack starts at random in the {self.name} ball yet")

    def sphere_start(self, x: torch.Tensor, eps: torch.Tensor, bounds: tuple[float, float], *, seed: int,
                     sample_id: torch.Tensor, stream: int = 0) -> torch.Tensor:
        """A point on the ε-sphere (APGD's and FAB's start), clipped to bounds."""
        raise AdvbenchError(f"no attack starts on the {self.name} sphere yet")


@NORMS.register("linf")
class Linf(Norm):
    name, p, label, dual_name = "linf", math.inf, "ℓ∞", "l1"

    def size(self, v: torch.Tensor) -> torch.Tensor:
        return v.flatten(1).abs().amax(dim=1)

    def direction(self, g: torch.Tensor) -> torch.Tensor:
        return g.sign()

    def project_ball(self, x_adv: torch.Tensor, x: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
        """Clamp each coordinate of δ to [−ε, ε]; with the box clip after it, the exact projection."""
        delta = x_adv - x
        e = per_sample(eps, delta)
        return x + torch.maximum(torch.minimum(delta, e), -e)

    def random_start(self, x: torch.Tensor, eps: torch.Tensor, bounds: tuple[float, float], *, seed: int,
                     sample_id: torch.Tensor, stream: int = 0) -> torch.Tensor:
        u = uniform(seed, sample_id, tuple(x.shape[1:]), stream, device=x.device, dtype=x.dtype) * 2 - 1
        return _clip(x + u * per_sample(eps, x), bounds)

    def sphere_start(self, x: torch.Tensor, eps: torch.Tensor, bounds: tuple[float, float], *, seed: int,
                     sample_id: torch.Tensor, stream: int = 0) -> torch.Tensor:
        """u ~ U[−1, 1]^d rescaled so that max|u_i| = 1, times ε."""
        u = uniform(seed, sample_id, tuple(x.shape[1:]), stream, device=x.device, dtype=x.dtype) * 2 - 1
        direction = u / per_sample(self.size(u).clamp_min(_TINY), u)
        return _clip(x + direction * per_sample(eps, x), bounds)


@NORMS.register("l2")
class L2(Norm):
    name, p, label, dual_name = "l2", 2.0, "ℓ₂", "l2"
    normalizable = True

    def size(self, v: torch.Tensor) -> torch.Tensor:
        return v.flatten(1).norm(p=2, dim=1)

    def normalized_scale(self, d: int) -> float:
        """‖δ‖₂/√d is the normalised ℓ2 budget."""
        return math.sqrt(d)

    def direction(self, g: torch.Tensor) -> torch.Tensor:
        return g / per_sample(self.size(g).clamp_min(_TINY), g)

    def project_ball(self, x_adv: torch.Tensor, x: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
        """Rescale δ onto the sphere where it lies outside; `project` clips to the box after it (not the
        exact projection onto the intersection, which the published ℓ2 attacks do not take either)."""
        delta = x_adv - x
        n = self.size(delta)
        factor = torch.where(n > eps, eps / n.clamp_min(_TINY), torch.ones_like(n))
        return x + delta * per_sample(factor, delta)

    def random_start(self, x: torch.Tensor, eps: torch.Tensor, bounds: tuple[float, float], *, seed: int,
                     sample_id: torch.Tensor, stream: int = 0) -> torch.Tensor:
        """A Gaussian direction at radius ε·u^(1/d): uniform in the ball."""
        g = normal(seed, sample_id, tuple(x.shape[1:]), stream, device=x.device, dtype=x.dtype)
        u = uniform(seed, sample_id, (1,), stream, device=x.device, dtype=torch.float64).squeeze(1)
        radius = (u ** (1.0 / x[0].numel())).to(x.dtype)
        return _clip(x + self.direction(g) * per_sample(radius * eps, x), bounds)

    def sphere_start(self, x: torch.Tensor, eps: torch.Tensor, bounds: tuple[float, float], *, seed: int,
                     sample_id: torch.Tensor, stream: int = 0) -> torch.Tensor:
        """A Gaussian direction of length ε (Croce & Hein's published start)."""
        g = normal(seed, sample_id, tuple(x.shape[1:]), stream, device=x.device, dtype=x.dtype)
        return _clip(x + self.direction(g) * per_sample(eps, x), bounds)


@NORMS.register("l1")
class L1(Norm):
    name, p, label, dual_name = "l1", 1.0, "ℓ₁", "linf"
    sparse_steps = True

    def size(self, v: torch.Tensor) -> torch.Tensor:
        return v.flatten(1).abs().sum(dim=1)

    def direction(self, g: torch.Tensor) -> torch.Tensor:
        """The steepest ascent: the sign of g at its largest |g_i| (shared equally where tied)."""
        return self.sparse_direction(g, torch.zeros(g.shape[0], dtype=g.dtype, device=g.device))

    def sparse_direction(self, g: torch.Tensor, fraction: torch.Tensor) -> torch.Tensor:
        """sign(g) on the coordinates with |g_i| at or above the (1 − fraction) quantile of |g|, divided
        by their count (Croce & Hein 2021's step, as the original's `autopgd_base.py` takes it:
        the quantile is the sorted |g| at index ⌊(1 − fraction)·d⌋, clamped to [0, d − 1])."""
        flat = g.flatten(1)
        d = flat.shape[1]
        at = ((1 - fraction) * d).clamp(0, d - 1).long()
        cut = flat.abs().sort(dim=1).values.gather(1, at.to(flat.device)[:, None])
        signs = torch.where(flat.abs() >= cut, flat.sign(), torch.zeros_like(flat))
        return (signs / (signs.abs().sum(dim=1, keepdim=True) + 1e-10)).reshape(g.shape)

    def project_ball(self, x_adv: torch.Tensor, x: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
        inf = torch.full_like(x, math.inf)
        return x + l1_box_projection(x_adv - x, eps, -inf, inf)

    def project(self, x_adv: torch.Tensor, x: torch.Tensor, eps: torch.Tensor,
                bounds: tuple[float, float]) -> torch.Tensor:
        """The exact Euclidean projection onto {‖δ‖₁ ≤ ε} ∩ {x + δ ∈ bounds} (Croce & Hein 2021, arXiv
        2103.01208): clipping after an ℓ1 projection would leave budget unused on saturated pixels."""
        return x + l1_box_projection(x_adv - x, eps, bounds[0] - x, bounds[1] - x)

    def random_start(self, x: torch.Tensor, eps: torch.Tensor, bounds: tuple[float, float], *, seed: int,
                     sample_id: torch.Tensor, stream: int = 0) -> torch.Tensor:
        """Uniform in the ε-ball: with E_0 … E_d i.i.d. exponential and random signs s_i,
        δ_i = ε·s_i·E_i / Σ_j E_j (the simplex in d + 1 dimensions, one coordinate dropped); then
        clipped to bounds, which only shrinks |δ_i|. A function of the draw scaled by ε."""
        d = x[0].numel()
        u = uniform(seed, sample_id, (d + 1,), stream, device=x.device, dtype=torch.float64)
        e = -torch.log1p(-u)                                       # u < 1: finite
        signs = normal(seed, sample_id, (d,), stream, device=x.device, dtype=x.dtype).sign()
        delta = (e[:, 1:] / e.sum(dim=1, keepdim=True)).to(x.dtype) * signs
        return _clip(x + delta.reshape(x.shape) * per_sample(eps, x), bounds)

    def sphere_start(self, x: torch.Tensor, eps: torch.Tensor, bounds: tuple[float, float], *, seed: int,
                     sample_id: torch.Tensor, stream: int = 0) -> torch.Tensor:
        """The original's ℓ1 start: x plus a standard Gaussian, projected onto the ε-ball within the box
        (on its sphere unless the box leaves less room than ε)."""
        g = normal(seed, sample_id, tuple(x.shape[1:]), stream, device=x.device, dtype=x.dtype)
        return self.project(x + g, x, eps, bounds)


@NORMS.register("l0")
class L0(Norm):
    """ℓ0: how many pixels changed, a pixel being every channel at one place (`pixel_sums`), as in Croce &
    Hein's sparse attacks (ICCV 2019, arXiv 1909.05040). A budget ε allows ⌊ε⌋ pixels. Not a norm: it has
    no ℓp exponent (torch's ord=0 counts channels, not pixels), no dual norm (no linearised boundary lies
    a number of pixels away) and no steepest step of unit size (one pixel moved without bound); those
    are refused in one line rather than computed."""

    name, label, dual_name, axis = "l0", "ℓ₀", "l0", "ℓ₀ pixels k"
    whole, whole_budget, search_leads = True, "an l0 budget is a whole number of pixels", True

    @property
    def p(self) -> float:  # type: ignore[override]
        raise AdvbenchError("l0 counts pixels, every channel at one place: it has no lp exponent")

    @property
    def dual(self) -> Norm:
        raise AdvbenchError("l0 has no dual norm: no linearised boundary lies a number of pixels away")

    def direction(self, g: torch.Tensor) -> torch.Tensor:
        raise AdvbenchError("l0 has no steepest-ascent step of unit size; PGD-l0 steps along the gradient and projects")

    def sparse_direction(self, g: torch.Tensor, fraction: torch.Tensor) -> torch.Tensor:
        raise AdvbenchError("l0 takes no top-k coordinate steps; its projection keeps the k largest changes")

    def size(self, v: torch.Tensor) -> torch.Tensor:
        return (pixel_sums((v != 0).to(torch.int32)) > 0).sum(dim=1).to(v.dtype if v.is_floating_point() else torch.float32)

    def project_ball(self, x_adv: torch.Tensor, x: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
        """Keep the ⌊ε⌋ pixels of largest squared change summed over their channels; reset the others."""
        return keep_pixels(x, x_adv, pixel_sums((x_adv - x).square()), whole_pixels(eps))

    def project(self, x_adv: torch.Tensor, x: torch.Tensor, eps: torch.Tensor,
                bounds: tuple[float, float]) -> torch.Tensor:
        """The exact Euclidean projection onto {‖δ‖₀ ≤ k} ∩ box, Croce & Hein 2019's (`project_L0_box`): a
        kept pixel's nearest value is x_adv clipped, a reset one's x, so the k kept are those whose
        clipping saves the most, Σ_c (x_adv − x)² − (x_adv − clip(x_adv))²; the box binds inside the
        choice, where clipping after it could keep a pixel the box then returns to x."""
        kept = _clip(x_adv, bounds)
        gain = pixel_sums((x_adv - x).square() - (x_adv - kept).square())
        return keep_pixels(x, kept, gain, whole_pixels(eps))

    def random_start(self, x: torch.Tensor, eps: torch.Tensor, bounds: tuple[float, float], *, seed: int,
                     sample_id: torch.Tensor, stream: int = 0) -> torch.Tensor:
        """Uniform in the ball within the box: ⌊ε⌋ pixels drawn uniformly, each set to a uniform point of
        the box (the faces of ⌊ε⌋ pixels hold all of the ball's volume)."""
        keys = uniform(seed, sample_id, (pixel_sums(x).shape[1],), stream + 1, device=x.device, dtype=torch.float64)
        return keep_pixels(x, self._box_point(x, bounds, seed, sample_id, stream), keys, whole_pixels(eps))

    def sphere_start(self, x: torch.Tensor, eps: torch.Tensor, bounds: tuple[float, float], *, seed: int,
                     sample_id: torch.Tensor, stream: int = 0) -> torch.Tensor:
        """PGD-ℓ0's start (Croce & Hein 2019): a uniform point of the box projected onto the ball, the
        ⌊ε⌋ pixels it changes most."""
        return self.project(self._box_point(x, bounds, seed, sample_id, stream), x, eps, bounds)

    @staticmethod
    def _box_point(x: torch.Tensor, bounds: tuple[float, float], seed: int, sample_id: torch.Tensor, stream: int) -> torch.Tensor:
        return bounds[0] + (bounds[1] - bounds[0]) * uniform(seed, sample_id, tuple(x.shape[1:]), stream, device=x.device, dtype=x.dtype)


LINF, L2_NORM, L1_NORM, L0_NORM = NORMS["linf"], NORMS["l2"], NORMS["l1"], NORMS["l0"]


def norm(name: str | Norm) -> Norm:
    """The norm called `name` (a norm passes through); an unknown name is refused in one line."""
    if isinstance(name, Norm):
        return name
    return NORMS.lookup(name)


def label(name: str) -> str:
    """How figures and tables write the norm called `name` (the name itself when none is registered)."""
    return NORMS[name].label if name in NORMS else name


def names() -> tuple[str, ...]:
    """Every registered norm's name."""
    return tuple(NORMS)


@NORMS.register("patch")
class Patch(Norm):
    """A square patch anywhere in the image, its pixels free in the box (Sparse-RS's patches, Croce et al.
    2022, arXiv 2006.12834). A perturbation's size is the side of the smallest square holding every
    pixel it changes (a pixel: every channel at one place; the last two dimensions are the image's
    rows and columns), a whole number; a budget ε allows a side of ⌊ε⌋. There is no exponent, no dual
    norm and no steepest-ascent step of such a set: they are refused rather than computed."""

    name, label, dual_name, axis = "patch", "patch side", "patch", "patch side k (pixels)"
    whole, whole_budget = True, "a patch budget is a whole side in pixels"

    @property
    def p(self) -> float:  # type: ignore[override]
        raise AdvbenchError("a patch is not an ℓp ball: it has no exponent")

    @property
    def dual(self) -> Norm:
        raise AdvbenchError("a patch is not an ℓp ball: it has no dual norm")

    def direction(self, g: torch.Tensor) -> torch.Tensor:
        raise AdvbenchError("a patch has no steepest-ascent step: its pixels are free within one square")

    def size(self, v: torch.Tensor) -> torch.Tensor:
        changed = _plane(v != 0).any(dim=1)

        def extent(hit: torch.Tensor) -> torch.Tensor:
            at = torch.arange(hit.shape[1], device=v.device)
            first = torch.where(hit, at, hit.shape[1]).amin(dim=1)
            return (torch.where(hit, at, -1).amax(dim=1) - first + 1).clamp_min(0)

        return torch.maximum(extent(changed.any(dim=2)), extent(changed.any(dim=1))).to(v.dtype)

    def project_ball(self, x_adv: torch.Tensor, x: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
        return self.project(x_adv, x, eps, (-math.inf, math.inf))

    def project(self, x_adv: torch.Tensor, x: torch.Tensor, eps: torch.Tensor,
                bounds: tuple[float, float]) -> torch.Tensor:
        """The nearest point (Euclidean) whose change fits one ⌊ε⌋-sided square, within the box: inside a
        square the nearest values are x_adv clipped, outside x itself, so the square is the one whose
        clipping keeps the most of ‖x_adv − x‖₂² (every placement's share by one integral image)."""
        kept = _clip(x_adv, bounds)
        gain = ((x_adv - x).square() - (x_adv - kept).square())
        gain = _plane(gain).sum(dim=1)
        n, h, w = gain.shape
        side = whole_pixels(eps).clamp(max=max(h, w)).to(x.device)
        total = torch.nn.functional.pad(gain.double().cumsum(1).cumsum(2), (1, 0, 1, 0))
        top, left = torch.arange(h, device=x.device), torch.arange(w, device=x.device)
        bottom = (top[None] + side[:, None]).clamp(max=h)[:, :, None]                     # (N, H, 1)
        right = (left[None] + side[:, None]).clamp(max=w)[:, None, :]                     # (N, 1, W)
        rows, cols = top[None, :, None], left[None, None, :]
        at = lambda r, c: total[torch.arange(n, device=x.device)[:, None, None], r, c]   # noqa: E731
        share = at(bottom, right) - at(rows, right) - at(bottom, cols) + at(rows, cols)
        fits = (rows <= (h - side).clamp_min(0)[:, None, None]) & (cols <= (w - side).clamp_min(0)[:, None, None])
        best = torch.where(fits, share, -math.inf).flatten(1).argmax(dim=1)
        r0, c0 = (best // w)[:, None, None], (best % w)[:, None, None]
        square = (rows >= r0) & (rows < r0 + side[:, None, None]) & (cols >= c0) & (cols < c0 + side[:, None, None])
        return torch.where(square.reshape(n, *([1] * (x.dim() - 3)), h, w) if x.dim() > 2 else square.flatten(1),
                           kept, x)


def _plane(v: torch.Tensor) -> torch.Tensor:
    """(N, C, H, W): a batch's last two dimensions as the image plane, those between as its channels; a
    batch of vectors (N, d) is one row of d pixels."""
    return v.reshape(v.shape[0], -1, *(v.shape[-2:] if v.dim() > 2 else (1, v.shape[-1])))


PATCH = NORMS["patch"]
