"""The substitute model of transfer attacks: its identity, and loading it.

A `conf/substitute` option names a model, a defense, an optional explicit `checkpoint` and an
optional training `seed`; the command line makes it a `TargetSpec` (after the seed's rule that
a model is never its own substitute: see `advbench.cli.spec_builder`), loaded exactly like a target
(explicit checkpoint, else the cache entry, trained on first use for digits).

Only `threat.knowledge=transfer` reads the substitute; other threats ignore it, so their cell
keys do not change when a substitute is configured.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from advbench.core.catalog import group_options
from advbench.core.errors import AdvbenchError
from advbench.robustness.defenses.trained import has_weights
from advbench.robustness.models.user_models import built_code
from advbench.robustness.specs import CellSpec, TargetSpec
from advbench.robustness.targets import load_target, weights_identity
from advbench.robustness.threat import ThreatModel


def _required(spec: CellSpec, threat: ThreatModel) -> TargetSpec | None:
    """The substitute under a transfer threat (an error without one), None otherwise."""
    if threat.knowledge != "transfer":
        return None
    if spec.substitute is None:
        options = ", ".join(o for o in group_options("substitute") if o != "none")
        raise AdvbenchError(f"threat knowledge 'transfer' needs a substitute model; set substitute=... (one of: {options})")
    return spec.substitute


def substitute_identity(spec: CellSpec, threat: ThreatModel) -> dict[str, Any]:
    """`{"substitute": ...}` for a transfer cell's key (configs and weights), `{}` otherwise."""
    sub = _required(spec, threat)
    if sub is None:
        return {}
    weights = _as_substitute_error(weights_identity, sub)
    if sub.model.identity() == spec.target.model.identity() and weights == weights_identity(spec.target):
        raise AdvbenchError(f"substitute '{spec.substitute_name}' is the target itself (same model and weights), "
                            "so the attack would be white-box; set substitute.seed=..., another substitute or threat.knowledge=white")
    return {"substitute": {
        "name": spec.substitute_name,
        "model": sub.model.name,
        "model_config": sub.model.identity(),
        "defense": sub.defense.name,
        "defense_config": sub.defense.identity(),
        "weights": weights,
    }}


def check_substitute_weights(spec: CellSpec) -> None:
    """Refuse a transfer cell whose substitute has no weights for the cell's data set, before any
    cell runs: a preset's transfer cells would otherwise fail after its other cells spent their time."""
    sub = spec.substitute if spec.threat.knowledge == "transfer" else None
    if sub is None or has_weights(sub):
        return
    options = ", ".join(o for o in group_options("substitute") if o != "none")
    raise AdvbenchError(f"transfer cells craft on substitute '{spec.substitute_name}' ({sub.model.name}/{sub.defense.name}), "
                        f"which has no weights for {spec.dataset.name}: name a substitute trained on it with its weights, "
                        f"substitute=<option> substitute.checkpoint=PATH (options: {options})")


def built_substitute(spec: CellSpec, dataset: Any, threat: ThreatModel) -> tuple[torch.nn.Module | None, dict[str, Any]]:
    """A Python substitute (`model@substitute.model=python`) of a transfer threat, built before its cell is
    claimed, and what of it keys the cell beyond `substitute_identity`'s configs and files: its code,
    weights and behaviour, as a Python target's (`user_models.built_code`), since the file its target
    names sees neither a helper module edited nor a flag set at run time; (None, {}) for every other
    substitute, whose code is a package's and which `load_substitute` loads once the cell is claimed.
    """
    sub = _required(spec, threat)
    if sub is None or sub.model.kind != "python":
        return None, {}
    model = _as_substitute_error(load_target, sub, dataset)
    what = f"substitute.model.target '{sub.model.argument('target')}'"
    return model, {"substitute_code": built_code(model, dataset.input_shape, what)}


def load_substitute(spec: CellSpec, dataset: Any, threat: ThreatModel) -> torch.nn.Module | None:
    """The substitute model (eval mode, frozen, on the CPU) for a transfer threat, else None."""
    sub = _required(spec, threat)
    if sub is None:
        return None
    return _as_substitute_error(load_target, sub, dataset)


def _as_substitute_error(fn: Callable[..., Any], *args: Any) -> Any:
    """Run target-loading code for the substitute; its errors say they are about the substitute."""
    try:
        return fn(*args)
    except AdvbenchError as exc:
        raise AdvbenchError(f"substitute: {exc} (or point substitute.checkpoint=... at its weights)") from None
