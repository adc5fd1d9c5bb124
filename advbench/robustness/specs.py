"""What a benchmark cell is, as frozen plain data: the target, its data, the attack and the settings.

The command line builds these from Hydra's composed config (`advbench.cli.spec_builder`), the Python
API from its arguments; everything below reads them and nothing else, so no layer under the
command line sees a config object, and a setting with no field here cannot reach a record.
Each spec's `identity()` is what today's cell and checkpoint keys hash: the option YAML as
resolved, minus the labels that change no number (`advbench.core.keys`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from advbench.core.construct import BoundFactory
from advbench.core.errors import AdvbenchError
from advbench.core.keys import dataset_identity, model_identity

if TYPE_CHECKING:  # these modules import torch; the specs are read before any is loaded
    from torch import nn

    from advbench.robustness.attacks.attack_contract import Attack
    from advbench.robustness.defenses.recipes.recipe_schema import Recipe

MODEL_KINDS = ("zoo", "torchvision", "python", "robustbench", "given")
"""Whose network a model is: advbench's architectures (`zoo`), torchvision's, a user's Python
class or factory, a RobustBench entry, or an object handed to the Python API."""


@dataclass(frozen=True)
class DatasetSpec:
    """A `conf/dataset` option, resolved where the options are read: the data set's class and the option's
    arguments bound to its parameters (`builder`), so that a key it does not take is refused before any
    work and each argument is read by the parameter it fills. The class is the declaration: a data set
    of one's own needs nothing here."""

    name: str
    builder: BoundFactory

    def build(self, **changed: Any) -> Any:
        """The data set (an `ImageDataset`), with `changed` arguments over the option's (training: `n_samples=None`)."""
        return self.builder.call(**changed)

    def identity(self, *, evaluation: bool) -> dict[str, Any]:
        return dataset_identity(self.builder.source, self.builder.given, evaluation=evaluation)


@dataclass(frozen=True)
class ModelSpec:
    """A `conf/model` option, resolved where the options are read: its `builder` (the option's factory and
    arguments, bound to its parameters; the data set's classes and channels come when it is built),
    `kind` (one of MODEL_KINDS: whose network it is) and `input_size`, the image size data sets resize
    to (the option's label, read by the YAML of imagenet and folder, never by the builder)."""

    name: str
    kind: str
    builder: BoundFactory
    input_size: Any = None

    def argument(self, name: str) -> Any:
        """The option's value of the builder's parameter `name` (None: not given)."""
        return self.builder.given.get(name)

    def build(self, num_classes: int, in_channels: int) -> Any:
        """The network (a `Classifier`) for a data set of `num_classes` classes and `in_channels` channels."""
        return self.builder.call(num_classes=num_classes, in_channels=in_channels)

    @property
    def user_given(self) -> bool:
        """A network advbench does not ship: its errors and checks speak of the user's code."""
        return self.kind != "zoo"

    def identity(self) -> dict[str, Any]:
        return model_identity(self.builder.source, {"input_size": self.input_size, **self.builder.given})


@dataclass(frozen=True)
class WrapperSpec:
    """A defense's `wrapper:`, checked where the option is read (`defenses.wrappers.wrapper_spec`): the
    registered `kind` (`wrapper.type`), its `transform` class (an `InputTransform`, named by its base
    here since the wrappers module imports this one) and the keyword `arguments` the class takes,
    each of the type its parameter declares, in the order written."""

    kind: str
    transform: type[nn.Module]
    arguments: tuple[tuple[str, Any], ...] = ()

    @property
    def randomized(self) -> bool:
        """A transform that draws at random: its cells are judged by a vote."""
        return bool(self.transform.randomized)

    def written(self) -> dict[str, Any]:
        """The `wrapper:` block as the option wrote it (what the keys hash)."""
        return {"type": self.kind, **dict(self.arguments)}


@dataclass(frozen=True)
class DefenseSpec:
    """A `conf/defense` option, typed where the options are read (`cli.spec_builder.defense_spec`): a
    training `recipe` (checked against `Recipe`'s schema), a `wrapper` in front of the model, or both.

    `written` is the option's keys that decide numbers (all but `DEFENSE_LABELS`) as the YAML gave them,
    as JSON: the cell key and the checkpoint key hash those, not the typed values, since `lr: 1`
    and `lr: 1.0` train alike yet were keyed apart, and records and checkpoints keyed before must stay found.
    """

    name: str
    written: str
    recipe: Recipe | None = None
    wrapper: WrapperSpec | None = None
    base: str | None = None
    category: tuple[str, ...] = ()

    @property
    def trained(self) -> str:
        """The defense whose checkpoint this one uses: a wrapper's `base:` (JPEG wraps natural's
        model, whose recipe its YAML pulls in), else the defense itself."""
        return self.base or self.name

    def identity(self) -> dict[str, Any]:
        """The option minus its labels, as written: what the cell key's `defense_config` is."""
        return dict(json.loads(self.written))

    def recipe_identity(self) -> Any:
        """The `recipe:` block as written (None: none): what the checkpoint key hashes."""
        return self.identity().get("recipe")


@dataclass(frozen=True)
class TargetSpec:
    """A model with a defense and where its weights come from: what a cell attacks, a transfer
    attack crafts on, or a recipe trains from (`init`, Ens-AT's `static_models`).

    `checkpoint`: an explicit file; None: the checkpoint cache entry under `cache_dir`, keyed by
    everything training depends on. `train_overrides`: the options of the running command a
    printed `advbench train` line must repeat (where the data is, ...).
    """

    model: ModelSpec
    defense: DefenseSpec
    dataset: DatasetSpec
    seed: int = 0
    checkpoint: str | None = None
    cache_dir: str = "~/.cache/advbench"
    device: str = "cpu"
    threads: int | None = None
    training_threads: int = 1
    init: TargetSpec | None = None
    static_models: tuple[TargetSpec, ...] = ()
    train_overrides: tuple[str, ...] = ()

    @property
    def trained_from(self) -> list[TargetSpec]:
        """The checkpoints training this target starts from or learns against."""
        return ([] if self.init is None else [self.init]) + list(self.static_models)


@dataclass(frozen=True)
class ThreatSpec:
    """`conf/threat`: norm, goal, knowledge, and ε (None: the data set's budget for the norm).

    `threat=corruptions` (norm `corruption`): `corruptions` names those measured (None: all that
    apply), `released` a folder of released files, RobustBench's or ImageNet-C's, to read them from (None: generated)."""

    norm: str
    goal: str
    knowledge: str
    eps: float | None = None
    corruptions: tuple[str, ...] | None = None
    released: str | None = None


@dataclass(frozen=True, eq=False)
class AttackSpec:
    """A `conf/attack` option: its name (a label) and the attack it builds, its hyperparameters
    checked by its constructor (`Attack.set_hyperparameters`) where the command line or the API built it.

    Two specs are equal when they name the same class with the same hyperparameters (`Attack.params`),
    as two builds of one option are: what the cell key hashes, not the objects' identity."""

    name: str
    attack: Attack

    def _compared(self) -> tuple[str, type, str]:
        return self.name, type(self.attack), repr(self.attack.params())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AttackSpec) and self._compared() == other._compared()

    def __hash__(self) -> int:
        return hash(self._compared())


SEARCH_METHODS = ("margin", "bisect")
"""How the minimum-ε search places its probes (`search.method`): see `evaluation.search.min_eps_search`."""


@dataclass(frozen=True)
class SearchSettings:
    """Minimum-ε search of budgeted attacks (`conf/config.yaml`'s `search:`, whose defaults these are not:
    the YAML's are): probes of the attack at other ε, placed by `method`.

    `resolution` is the final bracket width as a fraction of the budget; `max_factor` caps
    the upward search at that multiple of the budget (beyond it min_eps is inf). Its fields are
    the YAML's keys, so the cell key hashes `identity()` as it hashed the YAML's mapping.
    """

    enabled: bool = True
    resolution: float = 0.05
    max_factor: float = 4.0
    max_probes: int = 12
    method: str = "margin"

    def __post_init__(self) -> None:
        if self.method not in SEARCH_METHODS:
            raise AdvbenchError(f"search.method is '{self.method}'; valid: {', '.join(SEARCH_METHODS)}")

    def identity(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class Thresholds:
    """The gate on a cell (`gate.*`, `advbench gate`): lowest robust accuracy of untargeted cells,
    highest ASR of targeted cells, lowest certified accuracy of cells with an interval bound (fractions)."""

    min_accuracy: float | None = None
    max_asr: float | None = None
    min_certified: float | None = None

    def __post_init__(self) -> None:
        for field in fields(self):
            check_fraction(field.name, getattr(self, field.name))
        if all(value is None for value in self.values()):
            raise AdvbenchError("the gate needs a threshold: min_accuracy (untargeted cells), max_asr "
                                "(targeted cells) and/or min_certified (cells with a certified bound)")

    def values(self) -> list[float | None]:
        """The thresholds in field order (how a job's verdict carries them to the command)."""
        return [getattr(self, field.name) for field in fields(self)]


def check_fraction(name: str, value: object, *, nullable: bool = False) -> None:
    """A threshold is a fraction in [0, 1] (or None); 40 for 40% is the likely slip, so say so."""
    if value is None:
        return
    number = value if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan
    if not (math.isfinite(number) and 0 <= number <= 1):
        hint = f" ({number:g}% is {number / 100:g})" if math.isfinite(number) and 1 < number <= 100 else ""
        raise AdvbenchError(f"{name} must be a fraction in [0, 1]{' or null' if nullable else ''}{hint}, got {value!r}")


@dataclass(frozen=True)
class CellSettings:
    """How a cell is run and recorded; none of it but `seed`, the shard, the search, the vote
    and the execution (precision, memory format) changes a number, and those are in the key."""

    seed: int = 0
    device: str = "cpu"
    threads: int | None = None
    batch_size: int | str = 256
    chunk_size: int = 2048
    probe_pool: int = 4
    precision: str = "fp32"
    channels_last: bool = False
    shard: tuple[int, int] = (0, 1)
    judge_draws: int = 20
    search: SearchSettings = SearchSettings()
    records_dir: str = "advbench-out/records"
    force: bool = False
    run_id: str | None = None
    label: str | None = None
    gate: Thresholds | None = None  # None: no cell is judged
    in_sweep: bool = False


@dataclass(frozen=True)
class CellSpec:
    """One benchmark cell: data set × target × attack × threat × settings.

    `substitute`: the model transfer attacks craft on (after the seed's fallback rule), read
    only under a transfer threat; `substitute_name` its `conf/substitute` option name.
    """

    dataset: DatasetSpec
    target: TargetSpec
    attack: AttackSpec
    threat: ThreatSpec
    settings: CellSettings
    substitute: TargetSpec | None = None
    substitute_name: str = ""
