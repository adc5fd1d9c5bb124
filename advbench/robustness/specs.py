"""What a benchmark cell is, as frozen plain data: the target, its data, the attack and the settings.

The command line builds these from Hydra's composed config (`advbench.cli.spec_builder`), the Python
API from its arguments; everything below reads them and nothing else, so no layer under the
command line sees a config object, and a setting with no field here cannot reach a record.
Each spec's `identity()` is what today's cell and checkpoint keys hash: the option YAML as
resolved, minus the labels that change no number (`advbench.core.keys`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from advbench.core.keys import dataset_identity, defense_identity, model_identity

MODEL_KINDS = ("zoo", "torchvision", "python", "robustbench", "given")
"""Whose network a model is: advbench's architectures (`zoo`), torchvision's, a user's Python
class or factory, a RobustBench entry, or an object handed to the Python API."""


@dataclass(frozen=True)
class DatasetSpec:
    """A `conf/dataset` option, resolved: its `_target_` class and that class's arguments."""

    config: Mapping[str, Any]

    @property
    def name(self) -> str:
        return str(self.config["name"])

    def identity(self, *, evaluation: bool) -> dict[str, Any]:
        return dataset_identity(self.config, evaluation=evaluation)


@dataclass(frozen=True)
class ModelSpec:
    """A `conf/model` option, resolved; `kind` (one of MODEL_KINDS) says whose network it is."""

    config: Mapping[str, Any]
    kind: str

    @property
    def name(self) -> str:
        return str(self.config["name"])

    def get(self, key: str, default: Any = None) -> Any:
        return self.config.get(key, default)

    @property
    def user_given(self) -> bool:
        """A network advbench does not ship: its errors and checks speak of the user's code."""
        return self.kind != "zoo"

    def identity(self) -> dict[str, Any]:
        return model_identity(self.config)


@dataclass(frozen=True)
class DefenseSpec:
    """A `conf/defense` option, resolved: a training `recipe`, a `wrapper` in front of the model, or both."""

    config: Mapping[str, Any]

    @property
    def name(self) -> str:
        return str(self.config["name"])

    @property
    def recipe(self) -> Mapping[str, Any] | None:
        return self.config.get("recipe")

    @property
    def wrapper(self) -> Mapping[str, Any] | None:
        return self.config.get("wrapper")

    @property
    def trained(self) -> str:
        """The defense whose checkpoint this one uses: a wrapper's `base:` (JPEG wraps natural's
        model, whose recipe its YAML pulls in), else the defense itself."""
        return str(self.config.get("base") or self.name)

    def identity(self) -> dict[str, Any]:
        return defense_identity(self.config)


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


@dataclass(frozen=True)
class AttackSpec:
    """A `conf/attack` option: its name (a label) and its `params` (the class and its arguments)."""

    name: str
    params: Mapping[str, Any]


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
    search: Mapping[str, Any] = field(default_factory=dict)
    records_dir: str = "advbench-out/records"
    force: bool = False
    run_id: str | None = None
    label: str | None = None
    gate: Mapping[str, Any] | None = None
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
