"""Value checks of a composed config that Hydra cannot do: types, ranges, lists, file-name safety.

`CHECKS` maps dotted keys to checks and is applied to the keys a config holds, so one table
serves `advbench run`, `train` and the `uap` jobs; the attack is built once so its own argument
checks run before any work starts.

This module imports no torch: `advbench run` loads it (through `cli.config`) before it composes
the config, and a wrong option name (`attack=nope`) must be answered in a fraction of a second,
not after torch's import (33 s on a loaded machine). The checks that need the model stack
(`core.runtime`, `robustness.threat`, the defense wrappers, user models, the search) or pandas
(the gate) import them inside themselves, once a config has been composed.
"""

from __future__ import annotations

import math
import re
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, Callable

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from yaml import YAMLError

import advbench.cli.options  # noqa: F401  (registers the ${advbench:cache|data|weights} resolver the YAML uses)
from advbench.cli.option_targets import construct, target_of
from advbench.core.catalog import CONFIG_ROOTS, invalid_yaml, option_data
from advbench.core.errors import AdvbenchError, user_error
from advbench.core.keys import plain, plain_value
from advbench.core.names import safe_name
from advbench.robustness.specs import SEARCH_METHODS, check_fraction


def one_line(exc: BaseException) -> str:
    """An exception as the one line an AdvbenchError says: its message's lines joined, or its type."""
    if isinstance(exc, YAMLError):  # the parser's message names the file and line in a block of its own
        return str(invalid_yaml(exc))
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return "; ".join(lines) if lines else type(exc).__name__


Check = Callable[[str, Any], None]


_MAX_BUDGET = 1e6  # no two images in [0, 1] with fewer than 1e12 values are further apart
_MAX_KBPS = 1e6  # libx264 refuses a rate its VBV arithmetic overflows (1e12 kbps: "avcodec_open2 ... returned 22")


def _whole(low: int, nullable: bool = False, high: int | None = None) -> Check:
    def check(key: str, value: Any) -> None:
        if value is None and nullable:
            return
        if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
            span = f">= {low}" if high is None else f"in [{low}, {high}]"
            raise AdvbenchError(f"{key} must be a whole number {span}{' or null' if nullable else ''}, "
                                f"got {value!r}")
    return check


_MAX_SEED = 2**63 - 1
"""torch's generators take seeds up to a signed 64-bit integer."""
_DEVICE = re.compile(r"(cpu|auto|cuda(:\d+)?)")


def _device(key: str, value: Any) -> None:
    """cpu, cuda, cuda:N or auto (torch's own message for others lists every backend it was built with)."""
    if not isinstance(value, str) or not _DEVICE.fullmatch(value):
        raise AdvbenchError(f"{key} must be cpu, cuda, cuda:N or auto, got {value!r}")


def _real(low: float, high: float, *, open_low: bool = True, nullable: bool = False, why: str = "") -> Check:
    def check(key: str, value: Any) -> None:
        if value is None and nullable:
            return
        number = value if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan
        inside = (low < number if open_low else low <= number) and number <= high
        if not (math.isfinite(number) and inside):
            span = f"{'(' if open_low else '['}{low:g}, {high:g}]"
            raise AdvbenchError(f"{key} must be a number in {span}{' or null' if nullable else ''}{why}, "
                                f"got {value!r}")
    return check


def _flag(key: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise AdvbenchError(f"{key} must be true or false, got {value!r}")


def _amplitudes(key: str, value: Any) -> None:
    """A non-empty list of pixel amplitudes in (0, 1] (0, the unperturbed level, is allowed too)."""
    from advbench.quality.uap.perturbation import check_amplitude  # the quality half loads only for its own commands

    levels = list(value) if isinstance(value, (list, ListConfig)) else []
    if not levels:
        raise AdvbenchError(f"{key} must be a non-empty list of amplitudes in (0, 1], e.g. {key}=[0.02,0.04]; "
                            f"got {plain_value(value)!r}")
    for level in levels:
        check_amplitude(level, f"{key}: amplitude", baseline=True)
    if max(levels) == 0:
        raise AdvbenchError(f"{key} needs an amplitude above 0 (0 is the unperturbed level), got {plain_value(value)!r}")


def _batch_size(key: str, value: Any) -> None:
    """A whole number >= 1, or `auto` (`advbench.core.runtime.batch_size`)."""
    if value != "auto" and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise AdvbenchError(f"{key} must be a whole number >= 1 or auto, got {value!r}")



def _perturbation(key: str, value: Any) -> None:
    """A UAP file given on the command line must load (shape, range) before metrics are built."""
    from advbench.quality.uap.perturbation import load_uap

    if value is not None:
        load_uap(value)


def _bitrates(key: str, value: Any) -> None:
    """Target bitrates x264 can aim at: from 1 kbps up to 1e6 kbps (1 Gbit/s, far above lossless HD)."""
    items = list(value) if isinstance(value, (list, ListConfig)) else []
    check = _real(1, _MAX_KBPS, open_low=False)
    if not items:
        raise AdvbenchError(f"{key} must be a non-empty list of bitrates in kbps, got {plain_value(value)!r}")
    for item in items:
        check(f"{key}: bitrate (kbps)", item)


def _preset(key: str, value: Any) -> None:
    """An x264 preset name (PyAV, the video half, loads only for the commands that encode)."""
    from advbench.quality.stability.video import X264_PRESETS

    _one_of(*X264_PRESETS)(key, value)


def _wrapper(key: str, value: Any) -> None:
    """Each wrapper key with the type its constructor takes, before any model is trained or loaded."""
    from advbench.robustness.defenses.wrappers import check_wrapper  # imports torch: only once composed

    if value is not None:
        check_wrapper(plain_value(value))


def _gate_threshold(key: str, value: Any) -> None:
    """The same check as `advbench check` applies to its options, so both say the same."""
    check_fraction(key, value, nullable=True)


DEFENSE_CATEGORIES = ("natural training", "robust training", "input transformation", "randomization", "ensemble",
                      "certified")
"""The seed's defense categories (Table 1); a defense YAML's `category:` lists one or more."""


def _categories(key: str, value: Any) -> None:
    values = list(value) if isinstance(value, (list, ListConfig)) else [value]
    bad = [str(v) for v in values if v not in DEFENSE_CATEGORIES]
    if bad or not values:
        raise AdvbenchError(f"{key} must list categories of {', '.join(DEFENSE_CATEGORIES)}; got {plain_value(value)!r}")


def _name(key: str, value: Any) -> None:
    safe_name(value, key)


def _one_of(*valid: str) -> Check:
    def check(key: str, value: Any) -> None:
        if value not in valid:
            raise AdvbenchError(f"unknown {key} '{value}'; valid: {', '.join(valid)}")
    return check


def _name_or_null(key: str, value: Any) -> None:
    if value is not None:
        safe_name(value, key)


def _label(key: str, value: Any) -> None:
    """Text (a number is taken as its text), or null."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, (str, int, float))):
        raise AdvbenchError(f"{key} must be text or null, got {plain_value(value)!r}")


def _search_method(key: str, value: Any) -> None:
    _one_of(*SEARCH_METHODS)(key, value)


def _precision(key: str, value: Any) -> None:
    from advbench.core.runtime import PRECISIONS  # imports torch: only once composed

    _one_of(*PRECISIONS)(key, value)


def _threat(name: str) -> Check:
    """`threat.norm|goal|knowledge` against `robustness.threat`'s CONFIG_NORMS, GOALS or KNOWLEDGE."""
    def check(key: str, value: Any) -> None:
        from advbench.robustness import threat  # imports torch: only once composed

        _one_of(*getattr(threat, name))(key, value)
    return check


_SIMPLE = {int: "a whole number", float: "a number", bool: "true or false", str: "text", type(None): "null"}


def _accepts(kind: type, value: Any) -> bool:
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def _check_arguments(key: str, node: Any) -> None:
    """Values handed to a `_target_` must have the simple types its signature annotates.

    A wrong type would otherwise surface as a TypeError deep inside the constructor
    ("'<' not supported between 'str' and 'int'"); annotations that are not plain
    int/float/bool/str (or Optional of them) are left to the constructor. NaN is refused for
    every key: it passes each range check (`nan < 0` is false) and breaks only after the work ran.
    """
    if not isinstance(node, Mapping) or not isinstance(node.get("_target_"), str):
        return
    try:
        target = target_of(node["_target_"])
        hints = typing.get_type_hints(target.__init__ if isinstance(target, type) else target)
    except (Exception, SystemExit):  # an unknown target, an unresolvable annotation, a module of one's own
        return  # that exits on import: Hydra and the constructor report it (`_check_attack` for an attack)
    for name, value in node.items():
        if isinstance(value, float) and math.isnan(value):  # passes every `<` check, fails after the work ran
            raise AdvbenchError(f"{key}.{name} must be a number, got nan")
        hint = hints.get(str(name))
        kinds = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
        nested = isinstance(value, (Mapping, Sequence)) and not isinstance(value, str)
        if hint is None or not all(k in _SIMPLE for k in kinds) or nested:
            continue
        if not any(_accepts(k, value) for k in kinds):
            expected = " or ".join(_SIMPLE[k] for k in kinds)
            raise AdvbenchError(f"{key}.{name} must be {expected}, got {value!r}")


CHECKS: dict[str, Check] = {
    # names that become file or folder names
    "dataset.name": _name, "model.name": _name, "defense.name": _name, "attack.name": _name, "metric.name": _name,
    "metric.label": _name_or_null,  # a user's metric: its records' name
    "defense.category": _categories,
    "defense.wrapper": _wrapper,
    "substitute.model.name": _name, "substitute.defense.name": _name,  # a substitute's cached checkpoint
    "substitute.fallback.model.name": _name, "substitute.fallback.defense.name": _name,
    "substitute.seed": _whole(0, nullable=True), "substitute.fallback.seed": _whole(0, nullable=True),
    # advbench run / train
    "seed": _whole(0, high=_MAX_SEED),
    "device": _device,
    "defense.recipe.lr": _real(0, math.inf),
    "defense.recipe.epochs": _whole(1),
    "defense.recipe.batch_size": _whole(1),
    "batch_size": _batch_size,
    "precision": _precision,
    "channels_last": _flag,
    "chunk_size": _whole(1),
    "probe_pool": _whole(1),
    "threads": _whole(1, nullable=True),
    "training_threads": _whole(1),
    "threat.norm": _threat("CONFIG_NORMS"), "threat.goal": _threat("GOALS"), "threat.knowledge": _threat("KNOWLEDGE"),
    "threat.steps": _whole(1, nullable=True),  # iterations of BIM/MIM/DIM/TI under transfer threats
    "shard.index": _whole(0),
    "shard.count": _whole(1),
    "force": _flag,
    "state_cost": _flag,
    "full_eval.apgd_iterations": _whole(1), "full_eval.apgd_target_classes": _whole(1), "full_eval.fmn_steps": _whole(1),
    "full_eval.transfer_steps": _whole(1), "full_eval.square_queries": _whole(1), "full_eval.hsj_queries": _whole(1),
    "label": _label,
    "model.randomized": _flag,
    "model.eot_samples": _whole(1, nullable=True),
    "dataset.n_samples": _whole(1, nullable=True),
    "threat.eps": _real(0, _MAX_BUDGET, nullable=True,
                        why=" (null: the data set's budget)"),
    "judge.draws": _whole(1),
    "search.enabled": _flag,
    "search.resolution": _real(0, 1, why=" (a fraction of the budget)"),
    "search.max_factor": _real(1, _MAX_BUDGET, open_low=False, why=" (a multiple of the budget)"),
    "search.max_probes": _whole(0),
    "search.method": _search_method,
    "gate.min_accuracy": _gate_threshold, "gate.max_asr": _gate_threshold, "gate.min_certified": _gate_threshold,
    # advbench uap train | eval | stability
    "subset": _whole(1, nullable=True),
    "n_images": _whole(1, nullable=True),
    "size": _whole(1),
    "max_frames": _whole(1, nullable=True),
    "progress": _flag,
    "csf": _flag,
    "amplitudes": _amplitudes,
    "perturbation": _perturbation,
    "bitrates_kbps": _bitrates,
    "preset": _preset,
    "validate.amplitudes": _amplitudes,
    "validate.n_images": _whole(1, nullable=True),
    "uap.size": _whole(1),
    "uap.epochs": _whole(1),
    "uap.batch_size": _whole(1),
    "uap.lr": _real(0, math.inf),
    "uap.clamp": _real(0, 1),
    "madc.steps": _whole(1),
    "madc.lr": _real(0, math.inf),
}
"""Checks of the keys a composed config may hold, applied to those it does hold."""


_ABSENT = object()


def _select(cfg: Mapping[str, Any], key: str) -> Any:
    """The value at dotted `key` of a resolved config; `_ABSENT` where it has none."""
    for part in key.split("."):
        if not isinstance(cfg, Mapping) or part not in cfg:
            return _ABSENT
        cfg = cfg[part]
    return cfg


def validate(cfg: Mapping[str, Any]) -> None:
    """Value checks Hydra cannot do (types, ranges, file-name safety), before any work starts: on a resolved
    config, Hydra's composition or the Python API's plain data alike."""
    for key, check in CHECKS.items():
        value = _select(cfg, key)
        if value is not _ABSENT:
            check(key, value)
    if cfg.get("task") == "iqa":
        from advbench.cli.quality_tasks import check_iqa

        check_iqa(cfg)
    if cfg.get("batch_size") == "auto" and "attack" not in cfg:
        raise AdvbenchError("batch_size=auto applies to advbench run only; give a whole number >= 1")
    shard = cfg.get("shard")
    if shard is not None and not shard["index"] < shard["count"]:
        raise AdvbenchError(f"shard.index must be below shard.count (0..{shard['count'] - 1}), got {shard['index']}")
    model = cfg.get("model")
    if isinstance(model, Mapping):
        from advbench.robustness.models.user_models import check_config as check_model_config  # imports torch

        check_model_config(model.get("_target_"), model)
    for key in ("dataset", "attack.params", "metric"):
        _check_arguments(key, _select(cfg, key))
    params = _select(cfg, "attack.params")
    if params not in (None, _ABSENT):
        built_attack(cfg["attack"].get("name", "attack"), params, on_metrics=cfg.get("task") == "iqa")


def built_attack(name: str, params: Mapping[str, Any], *, on_metrics: bool) -> Any:
    """The attack option `name`'s attack, built (cheap, no model) with its own argument checks; a `_target_`
    building no attack is refused. Only the half that runs is imported: a robustness run loads none of the
    quality half (tests/test_single_compose.py)."""
    if on_metrics:
        from advbench.quality.attacks.metric_attack import MetricAttack as kind
    else:
        from advbench.robustness.attacks.attack_contract import Attack as kind

    try:  # a module of one's own that raises or exits is one line of `construct`, named below
        built = construct(plain(params))
    except Exception as exc:  # the constructor's own check, or an error it did not expect
        cause = user_error(exc)
        if cause is not None:  # the attack's own check: named by the keys the user typed
            raise AdvbenchError(f"bad attack.params for '{name}': {cause}") from None
        root = exc
        while root.__cause__ is not None:
            root = root.__cause__
        raise AdvbenchError(f"bad attack.params for '{name}': {one_line(root)}") from None
    if not isinstance(built, kind):
        raise AdvbenchError(f"attack '{name}': attack.params._target_ {params.get('_target_')} builds an "
                            f"object of type {type(built).__name__}, not an attack ({kind.__module__}.{kind.__name__})")
    return built


def check_composed(cfg: DictConfig) -> None:
    """Every value set, every interpolation resolvable (resolved in place), every value valid."""
    try:
        OmegaConf.resolve(cfg)
    except (OmegaConfBaseException, ValueError) as exc:
        raise AdvbenchError(one_line(exc)) from None
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise AdvbenchError(f"missing required value(s): {', '.join(missing)}; set them on the command line, "
                            f"e.g. {missing[0]}=...")
    validate(cfg)


def check_sweep_presets(config_name: str, overrides: Sequence[str], prog: str, *, launches_one: bool) -> None:
    """Without -m, a preset that sweeps (its `hydra.sweeper.params`) would run one default cell and drop
    its sweep without a word: say that it needs -m instead (`launches_one`: a single run, not a printout)."""
    if not launches_one:
        return
    group = "/".join(filter(None, (CONFIG_ROOTS.get(config_name), "experiment")))
    for override in overrides:
        key, _, value = override.partition("=")
        if key.lstrip("+~") != "experiment" or "," in value:
            continue
        data = option_data(group, value) or {}
        if (data.get("hydra") or {}).get("sweeper", {}).get("params"):
            raise AdvbenchError(f"experiment={value} is a sweep (it sets hydra.sweeper.params), so it needs -m: "
                                f"{prog} -m experiment={value}")
