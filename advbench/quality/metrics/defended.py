"""A quality metric behind an input-transformation defense: `metric(defense(x))`.

The defenses MSU's defense benchmark puts in front of a metric (JPEG, down-up resizing, Gaussian
blur, a median filter, bit-depth reduction, a random crop and flip), on the transforms both halves
share (`advbench.core.transforms`). Attacks see a `DefendedMetric` as any other metric; how it is
differentiated is decided here, so attacks stay adaptive with no per-defense code:

- a transform without a useful gradient (`jpeg`, `bit_depth`) is BPDA by default: the real
  transform forward, and backward a differentiable stand-in. For `jpeg` that is a differentiable
  JPEG (`core.jpeg_approx`), which knows which frequencies the codec keeps: on CNNQA at quality 75
  it nearly doubled the gain of the identity backward, which lost even to the naive attack. For
  `bit_depth` the gradient is the mean of the identity backward's (the metric's gradient at the
  quantised image) and the metric's gradient at the input, at two gradients a step: the first is
  blind where the quantised image is flat (a metric of local contrast has no gradient there), the
  second to the defense. On CNNQA the mean gained more than either in every setting tried; on NIQE
  84-111 % of the identity's and 1.5-3.8x the input's; on a pure Laplacian-energy metric the input's
  gradient alone did better (docs/iqa.md). Neither default wins everywhere, so `backward=identity`
  runs the plain BPDA for comparison. `bpda=False` is the naive attack: the gradient is the
  undefended metric's, as if the attacker did not know the defense, while the score stays the
  defended one.
- a transform differentiable almost everywhere (`resize`, `blur`, `median`, whose gradient reaches
  each window's median pixel) is differentiated exactly: for the median that gradient raised a
  metric several times more than BPDA's identity did (tests/test_iqa_defense.py).
- the random `crop_flip` is EOT: a gradient (a forward with autograd on) is the mean over `eot`
  draws; a score without autograd (the records' clean and attacked scores, a score-based attack's
  queries) is the mean over `score_draws` draws, whatever `eot` is, so an adaptive and a naive run
  (`eot=1`: one draw per step) are judged by the same expectation. Draw k of an image is keyed by
  the image's own bits (`core.sample_draws.row_keys`) and k, so a score is a function of the image alone
  (reproducible, whatever its batch), and every attack iterate, a new image, meets fresh draws.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Callable, ClassVar, Mapping

import torch

from advbench.core import transforms
from advbench.core.errors import AdvbenchError
from advbench.core.jpeg_approx import differentiable_jpeg
from advbench.core.sample_draws import row_keys
from advbench.quality.metrics.metric_contract import QualityMetric


@dataclass(frozen=True)
class TransformParams:
    """The parameters of a defense's transform: each kind's are a frozen subclass (`KINDS[name].params`)
    naming its `transform`, whose parameters' valid values both halves declare once
    (`core.transforms.PARAMETERS`); `none` takes this one, with none."""

    transform: ClassVar[str | None] = None

    def check(self) -> None:
        """Each parameter of a valid type and in its range, else one line naming it (`defense.params.<name>`)."""
        if self.transform is not None:
            transforms.check_parameters(self.transform, {f.name: getattr(self, f.name) for f in fields(self)},
                                        "defense.params")


@dataclass(frozen=True)
class JpegParams(TransformParams):
    transform: ClassVar[str] = "jpeg"
    quality: int


@dataclass(frozen=True)
class BitDepthParams(TransformParams):
    transform: ClassVar[str] = "bit_depth"
    bits: int


@dataclass(frozen=True)
class MedianParams(TransformParams):
    transform: ClassVar[str] = "median"
    k: int


@dataclass(frozen=True)
class BlurParams(TransformParams):
    transform: ClassVar[str] = "blur"
    sigma: float


@dataclass(frozen=True)
class ResizeParams(TransformParams):
    transform: ClassVar[str] = "resize"
    factor: float


@dataclass(frozen=True)
class CropFlipParams(TransformParams):
    transform: ClassVar[str] = "crop_flip"
    crop: float


@dataclass(frozen=True)
class Backward:
    """A BPDA backward pass: through `approx(x, params)`, a differentiable stand-in of the transform
    (None: the identity), its gradient averaged with the undefended metric's at x when `with_input`."""

    approx: Callable[[torch.Tensor, Any], torch.Tensor] | None = None
    with_input: bool = False


IDENTITY = Backward()


@dataclass(frozen=True)
class Kind:
    """One defense: its transform of (x, params, seed, keys, draw), its parameters' class, its gradient,
    and for BPDA the backward passes `defense.backward` chooses from (the first is the default)."""

    transform: Callable[..., torch.Tensor]
    params: type[TransformParams]
    grad: str   # "exact" | "bpda" | "eot"
    backwards: Mapping[str, Backward] = field(default_factory=dict)


KINDS: dict[str, Kind] = {
    "none": Kind(lambda x, p, *_: x, TransformParams, "exact"),
    "jpeg": Kind(lambda x, p, *_: transforms.jpeg_roundtrip(x, p.quality), JpegParams, "bpda",
                 {"differentiable": Backward(lambda x, p: differentiable_jpeg(x, p.quality)), "identity": IDENTITY}),
    "bit_depth": Kind(lambda x, p, *_: transforms.bit_depth(x, p.bits), BitDepthParams, "bpda",
                      {"mean": Backward(with_input=True), "identity": IDENTITY}),
    "median": Kind(lambda x, p, *_: transforms.median_filter(x, p.k), MedianParams, "exact"),
    "blur": Kind(lambda x, p, *_: transforms.gaussian_blur(x, p.sigma), BlurParams, "exact"),
    "resize": Kind(lambda x, p, *_: transforms.resize_down_up(x, p.factor), ResizeParams, "exact"),
    "crop_flip": Kind(lambda x, p, seed, keys, k: transforms.crop_flip(x, p.crop, seed, keys, k), CropFlipParams, "eot"),
}
"""`defense.name` -> its kind; `advbench list iqa/defense` lists the options (conf/iqa/defense)."""


def kind_of(name: str) -> Kind:
    """The defense kind `name`, else one line listing them."""
    if name not in KINDS:
        raise AdvbenchError(f"defense.name is '{name}'; valid: {', '.join(KINDS)}")
    return KINDS[name]


@dataclass(frozen=True)
class MetricDefense:
    """A `defense=` option of `advbench iqa run` as plain values; checked on construction.

    A transform in front of a metric (`params`: its kind's `TransformParams`) and how attacks
    differentiate it (`bpda`, `backward`, `eot`), and how a score is judged (`score_draws`): a
    classifier's defense option (`robustness.specs.DefenseSpec`) is a training recipe and/or a wrapper
    instead, and the transforms themselves are both halves' (`core.transforms`)."""

    name: str = "none"
    params: TransformParams = field(default_factory=TransformParams)
    bpda: bool = True
    backward: str | None = None      # None: the kind's first (default) backward
    eot: int = 1
    seed: int = 0
    score_draws: int = 16

    def __post_init__(self) -> None:
        wanted = kind_of(self.name).params
        if type(self.params) is not wanted:
            raise AdvbenchError(f"defense '{self.name}' takes {wanted.__name__}, not {type(self.params).__name__}")
        self.params.check()
        if not isinstance(self.bpda, bool):
            raise AdvbenchError(f"defense.bpda must be true or false, got {self.bpda!r}")
        self._check_backward()
        for key in ("eot", "score_draws"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise AdvbenchError(f"defense.{key} must be a whole number >= 1, got {value!r}")

    def _check_backward(self) -> None:
        """`backward` names one of the kind's BPDA backward passes, and only where BPDA runs."""
        if self.backward is None:
            return
        backwards = KINDS[self.name].backwards
        if not backwards or not self.bpda:
            where = ", ".join(name for name, kind in KINDS.items() if kind.backwards)
            raise AdvbenchError(f"defense.backward applies only to BPDA (defense.bpda=true on {where}), "
                                f"not to {'bpda=false' if backwards else self.name}")
        if self.backward not in backwards:
            raise AdvbenchError(f"defense.backward is '{self.backward}'; valid for {self.name}: {', '.join(backwards)}")

    @property
    def backward_name(self) -> str:
        """The backward that runs: the kind's gradient (`exact`, `eot`) where it has no BPDA; else the chosen
        BPDA backward, the kind's default, or `undefended` for bpda=false."""
        kind = KINDS[self.name]
        if not kind.backwards:
            return kind.grad
        if not self.bpda:
            return "undefended"
        return self.backward or next(iter(kind.backwards))

    @property
    def active(self) -> bool:
        """Whether there is a defense at all (`none` keeps cell keys and records as they were)."""
        return self.name != "none"

    def metric_label(self, metric: str) -> str:
        """The defended metric's name in records and on the console: `<metric>+<defense>` (the metric without one)."""
        return f"{metric}+{self.name}" if self.active else metric

    def identity(self) -> dict[str, Any]:
        """What of the defense changes numbers: the cell key's entry (only the settings its kind uses)."""
        grad = KINDS[self.name].grad
        return {"name": self.name, "params": dict(sorted(asdict(self.params).items())),
                **({"bpda": self.bpda, "backward": self.backward_name} if grad == "bpda" else {}),
                **({"eot": self.eot, "score_draws": self.score_draws, "seed": self.seed} if grad == "eot" else {})}


class DefendedMetric(QualityMetric):
    """`metric(defense(x))`, with the wrapped metric's direction, range and code identity."""

    def __init__(self, metric: QualityMetric, defense: MetricDefense) -> None:
        super().__init__()
        self.metric = metric
        self.defense = defense
        self.kind = KINDS[defense.name]
        for attr in ("higher_better", "score_range", "differentiable", "range_known"):
            setattr(self, attr, getattr(metric, attr))

    def code_identity(self) -> dict[str, str]:
        return self.metric.code_identity()

    def transform(self, x: torch.Tensor, draw: int = 0) -> torch.Tensor:
        """One draw of the defense's transform of `x` (draw matters only to a random one)."""
        keys = row_keys(x) if self.kind.grad == "eot" else None
        return self.kind.transform(x, self.defense.params, self.defense.seed, keys, draw)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        grad = self.kind.grad
        if grad == "eot":
            draws = self.defense.eot if torch.is_grad_enabled() else self.defense.score_draws
            return transforms.eot_mean(lambda k: self.metric(self.transform(x, k)), draws)
        if grad == "exact" or not torch.is_grad_enabled():   # a score alone: the defended metric's value
            return self.metric(self.transform(x))
        if not self.defense.bpda:
            with torch.no_grad():
                defended = self.metric(self.transform(x))
            return _value_of(defended, self.metric(x))
        backward = self.kind.backwards[self.defense.backward_name]
        approx = backward.approx
        defended = self.metric(transforms.bpda(self.transform, x, approx and (lambda v: approx(v, self.defense.params))))
        if not backward.with_input:
            return defended
        return _value_of(defended, 0.5 * (defended + self.metric(x)))

def _value_of(value: torch.Tensor, gradient_path: torch.Tensor) -> torch.Tensor:
    """`value`'s numbers with `gradient_path`'s gradient."""
    return gradient_path + (value - gradient_path).detach()
