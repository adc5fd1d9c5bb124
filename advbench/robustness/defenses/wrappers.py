"""Input-transformation defenses: a transform in front of any classifier, set by `wrapper:`.

A wrapped model is deployed as is: the transform runs on every forward pass, and the engine
judges success on that. What a white-box oracle differentiates is decided here, at the model
boundary, so attacks and the engine need no per-defense code (seed 4.2, adaptive attacks):

- `grad_mode = "bpda"`: the transform has no useful gradient (JPEG's quantisation, rounding);
  the forward value is the transformed input, the backward pass is the identity (BPDA with
  the identity as the approximation, Athalye et al. 2018).
- `grad_mode = "eot"`: the transform is random; `eot_samples` tells the white-box oracle how
  many passes to average its gradient over (EOT).
- `grad_mode = "bpda+eot"`: both (RandMix: random noise, then a rounding to centroids).

`straight_through = False` on a BPDA module turns the approximation off (the plain autograd
gradient, zero through a rounding): `advbench.robustness.defenses.masking` looks at that gradient.

Random draws come from `advbench.core.sample_draws`, keyed per row. In the engine each
pass is told its rows' keys, (sample id, how many passes that sample has been through)
(`model_draws.RowCalls`, `model_draws.Drawing`), so a sample's draws, and its records, do not depend on its
batch, its chunk, or on whether the run was killed and resumed. A direct call outside the engine
keys a row by a hash of its values and the wrapper's pass counter: still independent of the
batch, and reproducible within a process, but it restarts with the process.
"""

from __future__ import annotations

import math
import typing
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import nn

from advbench.core import sample_draws as rng
from advbench.core.errors import AdvbenchError
from advbench.core.keys import plain
from advbench.core.registry import Registry
from advbench.core.sample_draws import member_keys, row_keys
from advbench.core.transforms import bit_depth, bpda, check_parameters, jpeg_roundtrip
from advbench.robustness.attacks import model_draws
from advbench.robustness.attacks.transfer import diverse_inputs
from advbench.robustness.defenses.noise_layers import conv_noise, inner_convolutions
from advbench.robustness.specs import WrapperSpec


class InputTransform(nn.Module):
    """`model(transform(x))`, with the wrapped model's bounds and the transform's grad mode."""

    grad_mode: ClassVar[str] = "exact"
    randomized: ClassVar[bool] = False
    keyed_draws: ClassVar[bool] = True
    """A randomized wrapper draws from the engine's row keys (`pass_keys`), not torch's generator."""
    eot_samples: int = 1
    passes: int = 0

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.bounds: tuple[float, float] = tuple(getattr(model, "bounds", (0.0, 1.0)))  # type: ignore[assignment]

    def transform(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(self.transform(x))

    def pass_keys(self, x: torch.Tensor, streams: int) -> tuple[torch.Tensor, int]:
        """Row keys of this pass and its first stream (a pass uses `streams` of them).

        In the engine: the keys it set for the pass (`model_draws.draw_keys`), stream 0. A direct call:
        each row's `row_keys` with the pass counter's streams, the counter moved on.
        """
        keys = model_draws.draw_keys()
        if keys is not None:
            if keys.shape[0] != x.shape[0]:
                raise ValueError(f"{type(self).__name__} got {x.shape[0]} rows for {keys.shape[0]} row keys")
            return keys.to(x.device), 0
        stream, self.passes = self.passes * streams, self.passes + 1
        return row_keys(x), stream


WRAPPERS: Registry[type[InputTransform]] = Registry("input-transform wrapper")
"""`defense.wrapper.type` -> wrapper class (`@WRAPPERS.register` on each); the other wrapper keys are its arguments."""


class _BPDA(InputTransform):
    """A non-differentiable transform whose backward pass is the identity."""

    grad_mode = "bpda"
    straight_through = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.straight_through:
            return self.model(self.transform(x))
        return self.model(bpda(self.transform, x))


@WRAPPERS.register("jpeg")
class JPEG(_BPDA):
    """JPEG compression at `quality` (Dziugaite et al. 2016; Guo et al. 2018): libjpeg encode
    and decode through torchvision.io, one batched call each (lists of images).

    Inputs are quantised to uint8 first, as any JPEG file is; CUDA inputs round-trip through
    the CPU codec so that results match on every device.
    """

    def __init__(self, model: nn.Module, quality: int = 75) -> None:
        super().__init__(model)
        self.quality = int(check_parameters("jpeg", {"quality": quality}, "defense.wrapper")["quality"])

    def transform(self, x: torch.Tensor) -> torch.Tensor:
        return jpeg_roundtrip(x, self.quality)


@WRAPPERS.register("bit_depth")
class BitDepth(_BPDA):
    """Bit-depth reduction (Xu et al. 2018, feature squeezing): each value rounded to the
    nearest of 2**bits evenly spaced levels in [0, 1]."""

    def __init__(self, model: nn.Module, bits: int = 4) -> None:
        super().__init__(model)
        self.bits = int(check_parameters("bit_depth", {"bits": bits}, "defense.wrapper")["bits"])

    def transform(self, x: torch.Tensor) -> torch.Tensor:
        return bit_depth(x, self.bits)


@WRAPPERS.register("random_resize_pad")
class RandomResizePad(InputTransform):
    """Random resizing and padding (Xie et al. 2018), at the input's own size so that any
    classifier takes it: shrink to rnd×rnd, rnd uniform in [⌊rate·s⌋, s], zero-pad at a
    uniform offset back to s×s. Xie et al. enlarge 299 to [299, 331) and pad to 331; that
    image resized back to 299 is this transform at rate 299/331 (the default).

    Differentiable but random: white-box gradients are EOT means over `eot_samples` passes.
    Each forward pass is a fresh draw (the call index or pass counter is part of every key).
    """

    grad_mode = "eot"
    randomized = True

    def __init__(self, model: nn.Module, rate: float = 299 / 331, eot_samples: int = 10, seed: int = 0) -> None:
        super().__init__(model)
        if not 0.0 < rate <= 1.0:
            raise AdvbenchError(f"defense.wrapper.rate must be in (0, 1], got {rate}")
        if eot_samples < 1:
            raise AdvbenchError(f"defense.wrapper.eot_samples must be a whole number >= 1, got {eot_samples}")
        self.rate = float(rate)
        self.eot_samples = int(eot_samples)
        self.seed = int(seed)

    def transform(self, x: torch.Tensor) -> torch.Tensor:
        keys, stream = self.pass_keys(x, 1)
        return diverse_inputs(x, prob=1.0, resize_rate=self.rate, seed=self.seed, sample_id=keys, stream=stream)


ENSEMBLE_ELEMENTS = 1 << 20
"""Input elements (rows x members x pixels) one noisy-ensemble call of the model may carry."""


class _Ensemble(InputTransform):
    """A randomized defense deployed as the mean logits of `ensemble` noisy passes, batched as
    one call of the model on every row repeated `ensemble` times. Each (row, member) draws with
    its own key (`core.sample_draws.member_keys` of the pass's row keys)."""

    grad_mode = "eot"
    randomized = True
    streams_per_pass: int = 1

    def __init__(self, model: nn.Module, ensemble: int, eot_samples: int, seed: int) -> None:
        super().__init__(model)
        for key, value in (("ensemble", ensemble), ("eot_samples", eot_samples)):
            if value < 1:
                raise AdvbenchError(f"defense.wrapper.{key} must be a whole number >= 1, got {value}")
        self.ensemble = int(ensemble)
        self.eot_samples = int(eot_samples)
        self.seed = int(seed)

    def noisy_logits(self, x: torch.Tensor, keys: torch.Tensor, stream: int) -> torch.Tensor:
        """Logits of one noisy pass of each row of `x` (rows already repeated per member)."""
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows, stream = self.pass_keys(x, self.streams_per_pass)
        keys = member_keys(rows, self.ensemble).view(x.shape[0], self.ensemble)
        # Rows go through in slices so that rows x members stays bounded (decision attacks send
        # thousands of probes in one call); draws are keyed per row, so slicing changes nothing.
        rows = max(1, ENSEMBLE_ELEMENTS // (self.ensemble * max(1, x[0].numel())))
        logits = [self.noisy_logits(part.repeat_interleave(self.ensemble, dim=0), key.reshape(-1), stream)
                  for part, key in zip(x.split(rows), keys.split(rows))]
        return torch.cat(logits).view(x.shape[0], self.ensemble, -1).mean(dim=1)

    def normal(self, keys: torch.Tensor, like: torch.Tensor, stream: int) -> torch.Tensor:
        """N(0, 1) noise shaped like `like`, row i from (seed, keys[i], stream)."""
        return rng.normal(self.seed, keys, tuple(like.shape[1:]), stream, device=like.device, dtype=like.dtype)


@WRAPPERS.register("rse")
class RandomSelfEnsemble(_Ensemble):
    """RSE at inference (Liu et al. 2018): a model trained with recipe `rse`, run with the same
    noise (σ_init on the image, σ_inner before every later convolution: `defenses.noise_layers`), logits
    averaged over `ensemble` noisy passes. The noise is differentiable: white-box gradients are
    EOT means over `eot_samples` calls, each itself an ensemble."""

    def __init__(self, model: nn.Module, init_noise: float = 0.2, inner_noise: float = 0.1, ensemble: int = 10,
                 eot_samples: int = 10, seed: int = 0) -> None:
        super().__init__(model, ensemble, eot_samples, seed)
        if init_noise < 0 or inner_noise < 0:
            raise AdvbenchError(f"RSE noise levels must be >= 0, got init {init_noise}, inner {inner_noise}")
        self.init_noise = float(init_noise)
        self.inner_noise = float(inner_noise)
        self.streams_per_pass = 1 + len(inner_convolutions(model))

    def noisy_logits(self, x: torch.Tensor, keys: torch.Tensor, stream: int) -> torch.Tensor:
        def draw(a: torch.Tensor, layer: int) -> torch.Tensor:
            return self.inner_noise * self.normal(keys, a, stream + 1 + layer)

        with conv_noise(self.model, draw):
            return self.model(x + self.init_noise * self.normal(keys, x, stream))


@WRAPPERS.register("randmix")
class RandomDiscretization(_Ensemble):
    """RandMix (Zhang & Liang 2019, randomized discretization): Gaussian noise of std `noise`,
    then every pixel replaced by the nearest (in colour) of `clusters` centroids, logits averaged
    over `ensemble` noisy passes. Centroids are per image and pass: pixels of another noisy copy
    at uniform positions, as the seed's code draws them (its k-means++ seeding keeps uniform
    weights). The rounding has no useful gradient, the noise is random: BPDA (identity backward)
    inside EOT means over `eot_samples` calls."""

    grad_mode = "bpda+eot"
    straight_through = True
    streams_per_pass = 3

    def __init__(self, model: nn.Module, noise: float = 16 / 255, clusters: int = 5, ensemble: int = 10,
                 eot_samples: int = 10, seed: int = 0) -> None:
        super().__init__(model, ensemble, eot_samples, seed)
        if noise < 0 or clusters < 1:
            raise AdvbenchError(f"RandMix needs noise >= 0 and clusters >= 1, got {noise}, {clusters}")
        self.noise = float(noise)
        self.clusters = int(clusters)

    def discretize(self, x: torch.Tensor, keys: torch.Tensor, stream: int) -> torch.Tensor:
        """Each pixel of x + noise set to its nearest centroid, clipped to the bounds."""
        m, c = x.shape[:2]
        seeds = (x + self.noise * self.normal(keys, x, stream)).flatten(2)            # (m, c, pixels)
        where = (rng.uniform(self.seed, keys, (self.clusters,), stream + 1, device=x.device)
                 * seeds.shape[2]).long()
        centroids = seeds.gather(2, where[:, None, :].expand(m, c, -1))               # (m, c, k)
        noisy = (x + self.noise * self.normal(keys, x, stream + 2)).flatten(2)
        nearest = ((noisy[:, :, :, None] - centroids[:, :, None, :]) ** 2).sum(dim=1).argmin(dim=2)
        out = centroids.gather(2, nearest[:, None, :].expand(m, c, -1))
        return out.view_as(x).clamp(*self.bounds)

    def noisy_logits(self, x: torch.Tensor, keys: torch.Tensor, stream: int) -> torch.Tensor:
        if not self.straight_through:
            return self.model(self.discretize(x, keys, stream))
        return self.model(bpda(lambda v: self.discretize(v, keys, stream), x))


def check_wrapper(spec: Mapping[str, Any]) -> type[InputTransform]:
    """The wrapper class `spec` names, once each of its keys has the type the class's argument takes.

    A constructor's own range checks would otherwise meet `quality=high` as "'<=' not supported
    between 'int' and 'str'", naming no key; NaN passes every range check, so it is refused here.
    """
    kind = spec.get("type")
    if kind not in WRAPPERS:
        raise AdvbenchError(f"defense.wrapper.type is '{kind}'; valid: {', '.join(WRAPPERS)}")
    cls = WRAPPERS[kind]
    hints = {k: v for k, v in typing.get_type_hints(cls.__init__).items() if k not in ("model", "return")}
    for key, value in spec.items():
        if key == "type":
            continue
        if key not in hints:
            raise AdvbenchError(f"bad defense.wrapper for '{kind}': defense.wrapper.{key} is not one of its "
                                f"arguments; valid: {', '.join(hints)}")
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if hints[key] is int and not (number and isinstance(value, int)):
            raise AdvbenchError(f"defense.wrapper.{key} must be a whole number, got {value!r}")
        if hints[key] is float and not (number and not math.isnan(value)):
            raise AdvbenchError(f"defense.wrapper.{key} must be a number, got {value!r}")
    return cls


def wrapper_spec(spec: Mapping[str, Any]) -> WrapperSpec:
    """A `defense.wrapper` block (plain values) as the typed wrapper it names, checked (`check_wrapper`)."""
    if not isinstance(spec, Mapping):
        raise AdvbenchError(f"defense.wrapper must be a mapping with a type: key, got {spec!r}")
    given = plain(spec)
    transform = check_wrapper(given)
    return WrapperSpec(kind=str(given["type"]), transform=transform,
                       arguments=tuple((k, v) for k, v in given.items() if k != "type"))


def wrap(model: nn.Module, spec: WrapperSpec | None, *, seed: int) -> nn.Module:
    """`model` behind the wrapper `spec` (None: unwrapped); a randomized one draws from `seed` unless its arguments say."""
    if spec is None:
        return model
    if getattr(model, "randomized", False):
        raise AdvbenchError(f"a randomized model behind the wrapper '{spec.kind}' is not supported: the wrapper "
                            "would judge and differentiate it as a deterministic one; attack it unwrapped")
    arguments = dict(spec.arguments)
    if spec.randomized:
        arguments.setdefault("seed", seed)
    return spec.transform(model, **arguments).eval()
