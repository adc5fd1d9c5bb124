"""Models users bring: any torchvision classifier by name, or their own `nn.Module` from Python.

Why a module of its own: the registry (`models/__init__.py`) lists advbench's architectures
with their builders and data-set statistics; a user's model has neither, only a name to
resolve (torchvision's model list, an import path) and a contract to meet. Both end as a plain
`Classifier` (bounds (0, 1), `randomized`, normalisation in front of the network), so that
`checkpoint=` loads a state dict into the network by `checkpoint.load_checkpoint`'s rules and
the oracles, the engine, the masking flags and the cache treat them like any other model.

`model=torchvision model.arch=<name>` (`conf/model/torchvision.yaml`) builds
`torchvision.models.get_model(name, weights=None, num_classes=<the data set's>)` with ImageNet
normalisation; `model=python model.target=<module>:<attr>` (or `<file.py>:<attr>`,
`conf/model/python.yaml`) calls the user's class or factory with `model.kwargs`, imported by
`advbench.core.user_code` as a `metric=python` is. Everything a user can get wrong is a
one-line `AdvbenchError`.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from advbench.core.digests import code_digest, module_digest
from advbench.core.errors import AdvbenchError, failure_said
from advbench.core.fingerprint import behaviour_digest
from advbench.core.keys import plain_value
from advbench.core.user_code import build_user_module, source_digest, split_target
from advbench.robustness.models import IMAGENET_MEAN, IMAGENET_STD, robustbench_zoo
from advbench.robustness.models.classifier import Classifier
from advbench.robustness.models.torchvision_nets import torchvision_net
from advbench.robustness.specs import ModelSpec

TORCHVISION_TARGET = "advbench.robustness.models.user_models.torchvision_model"
PYTHON_TARGET = "advbench.robustness.models.user_models.python_model"
# torchvision's Inception-v3 and GoogLeNet weights expect (x - 0.5) / 0.5 (their `transform_input`).
_HALF_NORMALISED = ("inception_v3", "googlenet")


# ---------------------------------------------------------------- model=torchvision


def torchvision_archs() -> list[str]:
    """torchvision's classification architectures (detection, video, ... models live in submodules)."""
    from torchvision import models as tv_models  # here: torchvision.models pulls in torch._dynamo (~2 s)

    return list(tv_models.list_models(module=tv_models))


def check_torchvision_arch(arch: Any) -> str:
    """`arch` when torchvision has it, else an error listing close names."""
    names = torchvision_archs()
    if arch is None:
        raise AdvbenchError("model=torchvision needs model.arch: one of torchvision's classification models, "
                            "e.g. model.arch=resnet18")
    if not isinstance(arch, str) or arch not in names:
        close = difflib.get_close_matches(str(arch), names, n=5, cutoff=0.5)
        listed = f"close matches: {', '.join(close)}" if close else f"valid: {', '.join(names)}"
        raise AdvbenchError(f"unknown torchvision architecture '{arch}'; {listed}")
    return arch


def torchvision_model(num_classes: int, in_channels: int, arch: str | None = None, weights_path: str | None = None,
                      normalization: str = "outside", mean: Sequence[float] | None = None,
                      std: Sequence[float] | None = None, **meta: Any) -> Classifier:
    """torchvision's `arch` for the data set's classes, normalised with ImageNet's statistics by default.

    Weights come from `checkpoint=` (loaded by the caller) or a local `weights_path`, never
    downloaded. `meta` are the option's labels (`name`, `input_size`), which the builder ignores.
    """
    arch = check_torchvision_arch(arch)
    half = arch in _HALF_NORMALISED
    net = torchvision_net(arch, num_classes, in_channels, weights_path=weights_path)
    return Classifier(net, arch, in_channels, (0.5,) if half and mean is None else (mean or IMAGENET_MEAN),
                      (0.5,) if half and std is None else (std or IMAGENET_STD), normalization)


# ---------------------------------------------------------------- model=python


def python_model(num_classes: int, in_channels: int, target: str | None = None, kwargs: Mapping[str, Any] | None = None,
                 mean: Sequence[float] | None = None, std: Sequence[float] | None = None, randomized: bool = False,
                 eot_samples: int | None = None, **meta: Any) -> Classifier:
    """The user's network (NCHW floats in [0, 1] to logits) in advbench's model contract.

    `mean`/`std` (null: none) normalise in front of it; `randomized` marks a stochastic
    model, judged by a vote over `judge.draws` passes, its dropout kept active and its
    gradients EOT means over `eot_samples` passes. The network's own weights are used
    unless `checkpoint=` loads a state dict into it. `num_classes` is checked against the
    network's output by `check_forward`; `meta` are the option's labels (`name`, `input_size`).
    """
    if target is None:
        raise AdvbenchError("model=python needs model.target=<module>:<attr> or <path/to/file.py>:<attr>")
    options = plain_value(kwargs) or {}
    if not isinstance(options, dict):
        raise AdvbenchError(f"model.kwargs must be a mapping of keyword arguments, got {options!r}")
    net = build_user_module(target, options, "model")
    model = Classifier(net, str(target), in_channels, (0.0,) if mean is None else mean, (1.0,) if std is None else std,
                       user_code=True)
    return mark_randomized(model, randomized, eot_samples, "model.")


DEFAULT_EOT_SAMPLES = 10
"""Passes a randomized user model's white-box gradient averages, as the zoo's randomized defenses."""


def mark_randomized(model: Classifier, randomized: Any, eot_samples: Any, prefix: str = "") -> Classifier:
    """`model` marked stochastic or not, with the EOT passes of its gradients (`eot_samples`,
    default DEFAULT_EOT_SAMPLES for a randomized model): a deterministic model refuses them,
    since averaging equal passes would only multiply the cost."""
    check_randomness(randomized, eot_samples, prefix)
    model.randomized = randomized
    model.eot_samples = (eot_samples or DEFAULT_EOT_SAMPLES) if randomized else 1
    model.grad_mode = "eot" if model.eot_samples > 1 else "exact"  # the records' `grad_mode`, as the wrappers'
    return model


def check_randomness(randomized: Any, eot_samples: Any, prefix: str = "") -> None:
    """`randomized` a bool; `eot_samples` None, or a whole number >= 1 for a randomized model."""
    if not isinstance(randomized, bool):
        raise AdvbenchError(f"{prefix}randomized must be true or false, got {randomized!r}")
    if eot_samples is not None:
        if isinstance(eot_samples, bool) or not isinstance(eot_samples, int) or eot_samples < 1:
            raise AdvbenchError(f"{prefix}eot_samples must be a whole number >= 1, got {eot_samples!r}")
        if not randomized:
            raise AdvbenchError(f"{prefix}eot_samples applies to a randomized model ({prefix}randomized=true): "
                                "a deterministic model's passes are all equal")


# ---------------------------------------------------------------- what the rest of advbench asks


def model_kind(builder: str | None) -> str:
    """Whose network a `conf/model` entry's builder (its dotted path) builds (`specs.MODEL_KINDS`):
    `torchvision`, `python`, `robustbench` (`models.robustbench_zoo`) for users' models, `zoo` for advbench's own."""
    kinds = {TORCHVISION_TARGET: "torchvision", PYTHON_TARGET: "python", robustbench_zoo.TARGET: "robustbench"}
    return kinds.get(str(builder), "zoo")


def own_weights(model: ModelSpec) -> bool:
    """A Python model comes with its weights (its factory's), a RobustBench one with its zoo
    file; neither needs a cache entry."""
    return model.kind in ("python", "robustbench")


def default_label(model: ModelSpec, defense: str) -> str:
    """The records' `model_label` when `label=` is null: `model.arch` / `model.target` for
    users' models, else the defense's name."""
    key = {"torchvision": "arch", "python": "target", "robustbench": "model_name"}.get(model.kind)
    return str(model.argument(key)) if key is not None and model.argument(key) else defense


def source_identity(model: ModelSpec) -> dict[str, Any]:
    """sha256 of the file a Python model's code is in (`core.user_code.source_digest`), known
    from the config alone, so that editing the factory keys its cells anew (the built network's
    code, weights and behaviour join the key in `evaluation.cell.built_identity`); for a
    RobustBench model, its zoo entry and the sha256 of its file (an error if it is absent)."""
    if model.kind == "robustbench":
        return robustbench_zoo.identity(model.builder.given)
    return source_digest(model.argument("target")) if model.kind == "python" else {}


def built_code(model: nn.Module, input_shape: Sequence[int], what: str) -> dict[str, str]:
    """What of a built Python model keys its cells, as the target's and a substitute's alike: the files of
    its classes and of the user's modules they import, its weights and its outputs on a probe batch
    (`core.fingerprint`), which see a helper edited, a flag set at run time or a weights file read."""
    return {"code_sha256": code_digest(model), "module_sha256": module_digest(model),
            "behaviour_sha256": behaviour_digest(model, input_shape, what)}


def check_forward(model: nn.Module, input_shape: Sequence[int], num_classes: int, what: str) -> None:
    """One pass on two mid-grey images of the data set's shape: logits (2, num_classes) or an error."""
    shape = "x".join(str(int(s)) for s in input_shape)
    try:
        with torch.no_grad():
            out = model(torch.full((2, *input_shape), 0.5))
    except (Exception, SystemExit) as exc:  # the user's network on this input: its message (or exit) is the diagnosis
        exc = exc.__cause__ if isinstance(exc, AdvbenchError) and exc.__cause__ is not None else exc
        raise AdvbenchError(f"model {what} fails on the data set's {shape} input: {failure_said(exc)}") from None
    got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
    if got != (2, num_classes):
        raise AdvbenchError(f"model {what} must return logits (N, {num_classes}) for the data set's {num_classes} "
                            f"classes; on a batch of 2 {shape} images it returned {got}")
    if num_classes < 2:  # every attack would be meaningless (no other class), and FAB or DeepFool divide by zero
        raise AdvbenchError(f"model {what} returns one logit per image, a single class: no attack can change its "
                            "prediction, so there is nothing to measure; a classifier needs at least two classes")


def check_randomized(model: nn.Module, input_shape: Sequence[int], what: str) -> None:
    """A model marked `randomized` must draw: two passes on the same input must differ.

    Otherwise its records would carry a vote over passes that all agree, and EOT passes that
    cost without averaging anything. torch's global RNG is left as it was.
    """
    if not getattr(model, "randomized", False):
        return
    x = torch.full((2, *input_shape), 0.5)
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        first, second = model(x), model(x)
    if torch.equal(first, second):
        raise AdvbenchError(f"model {what} is marked randomized, but two passes on the same input agree: nothing in "
                            "it draws at random in eval mode (dropout layers are kept active; a module of your own "
                            "must draw whatever its `training` flag); drop randomized=true for a deterministic model")


def check_config(builder: str | None, model_cfg: Mapping[str, Any]) -> None:
    """The user-model keys of a composed config's model option, built by `builder` (`cli.validate`), before any work starts."""
    kind = model_kind(builder)
    if kind == "torchvision" and model_cfg.get("arch") is not None:
        check_torchvision_arch(model_cfg.get("arch"))
    if kind == "robustbench" and model_cfg.get("model_name") not in (None, robustbench_zoo.PLACEHOLDER):
        robustbench_zoo.zoo_entry(model_cfg.get("model_name"), model_cfg.get("dataset"), model_cfg.get("threat"))
    if kind == "python":
        check_randomness(model_cfg.get("randomized"), model_cfg.get("eot_samples"), "model.")
        if model_cfg.get("target") is not None:
            split_target(model_cfg.get("target"))
        if not isinstance(model_cfg.get("kwargs"), (Mapping, type(None))):
            raise AdvbenchError(f"model.kwargs must be a mapping, e.g. model.kwargs={{width:32}}; "
                                f"got {plain_value(model_cfg.get('kwargs'))!r}")
        for key in ("mean", "std"):
            value = model_cfg.get(key)
            if value is not None and (isinstance(value, str) or not isinstance(value, Sequence)):
                raise AdvbenchError(f"model.{key} must be a list of numbers or null, got {value!r}")
