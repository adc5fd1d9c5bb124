"""The substitute model of transfer attacks: which one, its identity, and loading it.

A `conf/substitute` option names a model config, a defense config, an optional explicit
`checkpoint` and an optional training `seed`; it is loaded exactly like a target (explicit
checkpoint, else the cache entry, trained on first use for digits) by treating it as the
target of a copy of the run config. `fallback` is the seed's rule that a model is never its
own substitute: when the target has the substitute's model and defense, the fallback is used
instead (on CIFAR-10: TRADES attacks everything but TRADES, which PGD-AT attacks).

Only `threat.knowledge=transfer` reads the substitute; other threats ignore it, so their cell
keys do not change when a substitute is configured.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from omegaconf import DictConfig, open_dict

from advbench.core.catalog import group_options
from advbench.core.errors import AdvbenchError
from advbench.core.keys import defense_identity, model_identity
from advbench.robustness.defenses.zoo import load_defended_model, weights_identity
from advbench.robustness.threat import ThreatModel


def substitute_config(cfg: DictConfig) -> DictConfig | None:
    """The substitute this run's target gets (after the fallback rule), or None when none is set."""
    sub = cfg.get("substitute")
    if sub is None or sub.get("model") is None:
        return None
    fallback = sub.get("fallback")
    if fallback is not None and sub.model.name == cfg.model.name and sub.defense.name == cfg.defense.name:
        return fallback
    return sub


def _required(cfg: DictConfig, threat: ThreatModel) -> DictConfig | None:
    """The substitute config under a transfer threat (an error without one), None otherwise."""
    if threat.knowledge != "transfer":
        return None
    sub = substitute_config(cfg)
    if sub is None:
        options = ", ".join(o for o in group_options("substitute") if o != "none")
        raise AdvbenchError(f"threat knowledge 'transfer' needs a substitute model; set substitute=... (one of: {options})")
    return sub


def as_target(cfg: DictConfig, sub: DictConfig) -> DictConfig:
    """A copy of the run config whose target is the substitute, for the target's loading code."""
    out = copy.deepcopy(cfg)
    with open_dict(out):
        out.model = sub.model
        out.defense = sub.defense
        out.checkpoint = sub.get("checkpoint")
        if sub.get("seed") is not None:
            out.seed = int(sub.seed)
    return out


def substitute_identity(cfg: DictConfig, threat: ThreatModel) -> dict[str, Any]:
    """`{"substitute": ...}` for a transfer cell's key (configs and weights), `{}` otherwise."""

    sub = _required(cfg, threat)
    if sub is None:
        return {}
    weights = _as_substitute_error(weights_identity, as_target(cfg, sub))
    if model_identity(sub.model) == model_identity(cfg.model) and weights == weights_identity(cfg):
        raise AdvbenchError(f"substitute '{sub.get('name', '')}' is the target itself (same model and weights), "
                            "so the attack would be white-box; set substitute.seed=..., another substitute or threat.knowledge=white")
    return {"substitute": {
        "name": str(sub.get("name", "")),
        "model": str(sub.model.name),
        "model_config": model_identity(sub.model),
        "defense": str(sub.defense.name),
        "defense_config": defense_identity(sub.defense),
        "weights": weights,
    }}


def load_substitute(cfg: DictConfig, dataset: Any, threat: ThreatModel) -> torch.nn.Module | None:
    """The substitute model (eval mode, frozen, on the CPU) for a transfer threat, else None."""

    sub = _required(cfg, threat)
    if sub is None:
        return None
    return _as_substitute_error(load_defended_model, as_target(cfg, sub), dataset)


def _as_substitute_error(fn: Callable[..., Any], *args: Any) -> Any:
    """Run target-loading code for the substitute; its errors say they are about the substitute."""
    try:
        return fn(*args)
    except AdvbenchError as exc:
        raise AdvbenchError(f"substitute: {exc} (or point substitute.checkpoint=... at its weights)") from None
