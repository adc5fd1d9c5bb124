"""What a model object handed to the Python API can be combined with, and how it is handed back.

A model object comes with its code and weights: a checkpoint, a model option, its keys or a
defense that trains a model cannot apply to it, and data handed in as objects leaves nothing
for `dataset.*` to change. Such a setting would be recorded without being done, so it is
refused before any work. An input-transformation defense applies to any classifier, so it is
put in front of the object as `advbench run` puts it in front of a zoo model.

The caller's object is used in place and given back as it came
(`advbench.core.caller_state.caller_state_kept`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from advbench.core.catalog import group_options, option_data, override_key
from advbench.core.errors import AdvbenchError
from advbench.robustness.specs import DefenseSpec, WrapperSpec

_FIXED_BY_MODEL = ("model", "checkpoint")
_FIXED_BY_DATA = ("dataset",)


@dataclass(frozen=True)
class Normalisation:
    """Per-channel statistics put in front of a network that expects normalised input (None: none)."""

    mean: Sequence[float] | None = None
    std: Sequence[float] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "mean", (0.0,) if self.mean is None else tuple(self.mean))
        object.__setattr__(self, "std", (1.0,) if self.std is None else tuple(self.std))


def refuse_inapplicable(overrides: Sequence[str], *, data_object: bool) -> None:
    """An AdvbenchError for the first override that names what a model (or data) object fixes."""
    if isinstance(overrides, str):
        raise AdvbenchError(f"overrides must be a list of strings, e.g. [{overrides!r}]")
    fixed = _FIXED_BY_MODEL + (_FIXED_BY_DATA if data_object else ())
    for override in overrides:
        if not isinstance(override, str):
            raise AdvbenchError(f"overrides must be strings like 'search.enabled=false', got {override!r}")
        group = override_key(override).split(".")[0]
        if group in fixed:
            raise AdvbenchError(f"override '{override}' cannot apply to a {_object_of(group)} object: "
                                f"{_instead(group)}")


def _object_of(group: str) -> str:
    return "data" if group == "dataset" else "model"


def _instead(group: str) -> str:
    return {"model": "it fixes the network; use evaluate's mean=, std=, randomized= and eot_samples= arguments",
            "checkpoint": "it comes with its weights; load them into it (load_state_dict) before calling evaluate",
            "dataset": "it fixes the images; pass the subset you want to attack (e.g. (x[:4], y[:4]))"}[group]


def applicable_wrapper(defense: DefenseSpec) -> WrapperSpec | None:
    """The wrapper a defense puts in front of a model object (None: the model as given).

    A defense whose recipe trains a model (anything but natural training) is refused: the
    object's weights are its own, and the records would name a training it never had.
    """
    recipe = None if defense.recipe is None else defense.recipe.type
    if recipe not in (None, "natural"):
        raise AdvbenchError(f"defense '{defense.name}' trains a model ({recipe}); a model object comes with its "
                            "own weights: train it yourself, or choose an input-transformation defense "
                            f"({', '.join(transformation_defenses())})")
    return defense.wrapper


AS_GIVEN = "none"
"""The records' defense of a model object evaluated without one: its own training, whatever it
was, not advbench's natural recipe (a PGD-AT model of the user's is not `pgd_at+natural`)."""


AS_GIVEN_DEFENSE = {"name": AS_GIVEN, "description": "the model object as given, no defense added by advbench",
                    "category": ["as given"], "threat_model": "none", "wrapper": None, "recipe": None}
"""The defense config of a model object evaluated without one: no recipe, no wrapper."""


def transformation_defenses() -> list[str]:
    """The defense options that only put a transform in front of a naturally trained model."""
    options = {name: option_data("defense", name) or {} for name in group_options("defense")}
    return [name for name, spec in options.items()
            if spec.get("wrapper") and (spec.get("recipe") or {}).get("type") in (None, "natural")]
