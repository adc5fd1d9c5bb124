"""The one reader of the robustness half's run configs: it turns them into specs.

A run config reaches the builders here as plain, resolved data: `advbench run` and `advbench train`
turn Hydra's composition into it at their border (`run_main`, `train_main`), the Python API
assembles it from the options' YAML and its Python values (`cli.choices.api_config`). Everything
below gets frozen `advbench.robustness.specs` values built from it, with nothing left to
interpret: a substitute after the seed's fallback rule, the checkpoints a recipe trains from
(`init:`, Ens-AT's static models) as targets of their own, the options of the running command
that a printed `advbench train` line must repeat, whether the cell is one job of a sweep.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from advbench.cli.option_targets import bound_factory
from advbench.cli.options import load_option, resolved_in
from advbench.cli.validate import built_attack
from advbench.core.catalog import override_key
from advbench.core.errors import AdvbenchError
from advbench.core.keys import defense_identity, plain
from advbench.robustness.specs import (
    AttackSpec,
    CellSettings,
    CellSpec,
    DatasetSpec,
    DefenseSpec,
    ModelSpec,
    SearchSettings,
    TargetSpec,
    ThreatSpec,
    Thresholds,
)

TRAINING_THREADS = 1
"""CPU threads a model trains on unless `training_threads` says otherwise: fixed, because the
thread count changes the order of float sums and so the weights; with it fixed (and in the key)
one machine gives one set of weights whichever command trained a model first."""

Config = Mapping[str, Any]
"""A run config as plain, resolved data: `{"dataset": {...}, "seed": 0, ...}`."""


def dataset_spec(node: Config) -> DatasetSpec:
    """A `conf/dataset` option as its class and the arguments it gives, bound to the class's parameters."""
    option = plain(node)
    return DatasetSpec(name=str(option.get("name")), builder=bound_factory("dataset", option))


def defense_spec(node: Config) -> DefenseSpec:
    """A `conf/defense` option typed, its recipe checked against the schema and its wrapper against
    its class here, once; the keys it gives that decide numbers are kept as written, for the keys."""
    from advbench.robustness.defenses.recipes import Recipe  # imports torch
    from advbench.robustness.defenses.wrappers import wrapper_spec

    option = plain(node)
    recipe, wrapper, category = option.get("recipe"), option.get("wrapper"), option.get("category") or ()
    return DefenseSpec(
        name=str(option["name"]),
        written=json.dumps(defense_identity(option), sort_keys=True, default=str),
        recipe=None if recipe is None else Recipe.from_config(recipe),
        wrapper=wrapper_spec(wrapper) if wrapper else None,
        base=None if option.get("base") is None else str(option["base"]),
        category=(str(category),) if isinstance(category, str) else tuple(map(str, category)),
    )


def model_spec(node: Config) -> ModelSpec:
    """A `conf/model` option as its builder and the arguments it gives (the data set's classes and channels
    are given when it is built), whose network it is, and its image size."""
    from advbench.robustness.models import MODEL_META_KEYS  # imports torch
    from advbench.robustness.models.user_models import model_kind

    option = plain(node)
    arguments = {k: v for k, v in option.items() if k not in MODEL_META_KEYS}
    return ModelSpec(name=str(option.get("name")), kind=model_kind(option.get("_target_")),
                     builder=bound_factory("model", arguments, leaves=("num_classes", "in_channels")),
                     input_size=option.get("input_size"))


def target_spec(cfg: Config) -> TargetSpec:
    """The run's target (or, for `advbench train`, what it trains), with what it trains from."""
    target = TargetSpec(
        model=model_spec(cfg["model"]),
        defense=defense_spec(cfg["defense"]),
        dataset=dataset_spec(cfg["dataset"]),
        seed=int(cfg["seed"]),
        checkpoint=str(cfg["checkpoint"]) if cfg.get("checkpoint") else None,
        cache_dir=str(cfg["cache_dir"]),
        device=str(cfg.get("device", "cpu")),
        threads=cfg.get("threads"),
        training_threads=int(cfg.get("training_threads") or TRAINING_THREADS),
        train_overrides=tuple(training_overrides()),
    )
    return _with_sources(cfg, target)


def _with_sources(cfg: Config, target: TargetSpec) -> TargetSpec:
    """`target` with the targets its recipe starts from (`init:`) and learns against (`static_models:`)."""
    recipe = target.defense.recipe
    init = None if recipe is None else recipe.init
    statics = tuple(static_target(cfg, target, entry) for entry in (() if recipe is None else recipe.static_models))
    start = None if init is None else _trained_from_scratch(cfg, target, str(init))
    return dataclasses.replace(target, init=start, static_models=statics)


def _trained_from_scratch(cfg: Config, target: TargetSpec, defense: str, model: Any = None,
                          seed: int | None = None) -> TargetSpec:
    """`target` trained with `defense` (a conf/defense option whose recipe starts from scratch),
    optionally on another model option (its YAML and keys over it) or seed: how a recipe names the
    checkpoints it trains from."""
    option = load_option("defense", defense)
    if option is None or option.get("recipe") is None or option.recipe.get("init") is not None:
        raise AdvbenchError(f"'{defense}' is not a defense whose recipe trains from scratch, to start from")
    # resolved where the run's own options are: `${dataset.name}`, `${..recipe.x}`
    scratch = resolved_in(cfg, defense=[option], **({} if model is None else {"model": model}))
    return dataclasses.replace(target, defense=defense_spec(scratch["defense"]), checkpoint=None,
                               model=model_spec(scratch["model"]) if model is not None else target.model,
                               seed=target.seed if seed is None else int(seed), init=None, static_models=())


def static_target(cfg: Config, target: TargetSpec, entry: Mapping[str, Any]) -> TargetSpec:
    """One Ens-AT static source: `entry` names a conf/model option, a training seed and overrides
    of that model's keys; the recipe is natural's, so the source is cached (and on digits trained
    on first use) like any natural checkpoint."""
    spec = dict(plain(entry))
    option = spec.pop("model", None)
    seed = spec.pop("seed", None)
    model = load_option("model", option) if isinstance(option, str) else None
    if model is None:
        raise AdvbenchError(f"static model {plain(entry)} needs 'model:' naming a conf/model option")
    return _trained_from_scratch(cfg, target, "natural", [model, spec], seed)


def substitute_spec(cfg: Config, target: TargetSpec) -> tuple[TargetSpec | None, str]:
    """The substitute this run's target gets and its option name; a model is never its own
    substitute: when the target has the substitute's model and defense, `fallback` is used."""
    sub = cfg.get("substitute")
    if sub is None or sub.get("model") is None:
        return None, ""
    fallback = sub.get("fallback")
    if fallback is not None and sub["model"]["name"] == cfg["model"]["name"] \
            and sub["defense"]["name"] == cfg["defense"]["name"]:
        sub = fallback
    chosen = dataclasses.replace(
        target, model=model_spec(sub["model"]), defense=defense_spec(sub["defense"]),
        checkpoint=str(sub["checkpoint"]) if sub.get("checkpoint") else None,
        seed=target.seed if sub.get("seed") is None else int(sub["seed"]), init=None, static_models=())
    return _with_sources({**cfg, "model": sub["model"], "defense": sub["defense"]}, chosen), str(sub.get("name", ""))


def cell_spec(cfg: Config) -> CellSpec:
    """The cell `advbench run` measures."""
    target = target_spec(cfg)
    substitute, name = substitute_spec(cfg, target)
    threat, attack = cfg["threat"], str(cfg["attack"]["name"])
    return CellSpec(
        dataset=target.dataset,
        target=target,
        attack=AttackSpec(attack, built_attack(attack, cfg["attack"]["params"], on_metrics=False)),
        threat=ThreatSpec(norm=str(threat["norm"]), goal=str(threat["goal"]), knowledge=str(threat["knowledge"]),
                          eps=None if threat.get("eps") is None else float(threat["eps"]),
                          corruptions=None if threat.get("corruptions") is None else tuple(map(str, threat["corruptions"])),
                          released=None if threat.get("released") is None else str(threat["released"])),
        settings=cell_settings(cfg),
        substitute=substitute,
        substitute_name=name,
    )


def cell_settings(cfg: Config) -> CellSettings:
    """How the cell runs and is recorded (`advbench.robustness.specs.CellSettings`)."""
    from advbench.robustness.evaluation.measure import JUDGE_DRAWS as judge_default  # imports torch

    batch = cfg.get("batch_size", 256)
    return CellSettings(
        seed=int(cfg["seed"]),
        device=str(cfg["device"]),
        threads=cfg.get("threads"),
        batch_size=batch if batch == "auto" else int(batch),
        chunk_size=int(cfg["chunk_size"]),
        probe_pool=int(cfg.get("probe_pool", 4)),
        precision=str(cfg.get("precision", "fp32")),
        channels_last=bool(cfg.get("channels_last", False)),
        shard=(int(cfg["shard"]["index"]), int(cfg["shard"]["count"])),
        judge_draws=int((cfg.get("judge") or {}).get("draws", judge_default)),
        search=SearchSettings(**plain(cfg["search"])),
        records_dir=str(cfg["records_dir"]),
        force=bool(cfg["force"]),
        run_id=None if cfg.get("run_id") is None else str(cfg["run_id"]),
        label=None if cfg.get("label") is None else str(cfg["label"]),
        gate=gate_thresholds(cfg.get("gate")),
        in_sweep=in_sweep(),
    )


def gate_thresholds(gate: Config | None) -> Thresholds | None:
    """The `gate:` config's thresholds; None where it sets none (no cell is judged)."""
    values = plain(gate)
    return None if all(value is None for value in values.values()) else Thresholds(**values)


def in_sweep() -> bool:
    """Whether this cell is one job of a `-m` sweep (which skips cells its attack does not support)."""
    job = _hydra_job()
    return job is not None and job.mode == sys.modules["hydra.types"].RunMode.MULTIRUN


def _hydra_job() -> Any:
    """The running Hydra job's own config; None outside a job (and without importing Hydra where
    nothing did: the Python API builds its configs without it)."""
    module = sys.modules.get("hydra.core.hydra_config")
    return module.HydraConfig.get() if module is not None and module.HydraConfig.initialized() else None


_TRAINING_KEYS = ("dataset.", "model.", "defense.recipe.", "hydra.searchpath=", "cache_dir=", "training_threads=",
                  "device=")
"""Overrides of a run that an `advbench train` line for its model needs too (where the data is, ...)."""


def training_overrides() -> list[str]:
    """The running Hydra job's overrides a train line must repeat (none outside a Hydra job)."""
    job = _hydra_job()
    if job is None:
        return []
    given = job.overrides
    typed = [*OmegaConf.to_container(given.hydra), *OmegaConf.to_container(given.task)]  # as typed: not resolved
    return [o for o in typed if o.startswith(_TRAINING_KEYS)
            and not o.startswith(("model.arch=", "model.target=", "model.name="))]


def run_main(composed: DictConfig) -> Path | list[Path] | None:
    """Hydra task of `advbench run`: one cell, records to parquet (skipped if present); under
    `threat=corruptions` one cell per corruption, where an attack's options given are refused."""
    from advbench.robustness.evaluation.cell import run_cell  # imports torch
    from advbench.robustness.report.cell_report import report_cell
    from advbench.robustness.threat import CORRUPTION

    cfg = OmegaConf.to_container(composed, resolve=True)  # the border: plain data from here on
    if cfg["threat"]["norm"] != CORRUPTION:
        spec = cell_spec(cfg)
        run = run_cell(spec)
        return None if run is None else report_cell(run, spec.settings.gate, in_sweep=spec.settings.in_sweep)
    job = _hydra_job()
    typed = OmegaConf.to_container(job.overrides.task) if job is not None else []
    refuse_attack_options(typed)
    from advbench.robustness.evaluation.corruption_cell import run_corruptions  # torchvision: only for corruptions

    return run_corruptions(cell_spec(cfg))


ATTACK_ONLY = ("attack", "search", "substitute", "threat.eps", "threat.steps", "gate")
"""The options of an attack cell; none applies under `threat=corruptions`, which runs no attack."""


def refuse_attack_options(given: list[str]) -> None:
    """One line naming the first override that sets an attack's option under `threat=corruptions`."""
    for override in given:
        key = override_key(override)
        if key.split(".")[0] in ATTACK_ONLY or key in ATTACK_ONLY:
            raise AdvbenchError(f"'{override}' does not apply to threat=corruptions, which runs no attack: "
                                "it classifies corrupted copies of the clean inputs")


def train_main(cfg: DictConfig) -> Path:
    """Hydra task of `advbench train`: train the (dataset, model, defense) and cache the checkpoint."""
    from advbench.robustness.defenses.trained import train_target  # imports torch

    return train_target(target_spec(OmegaConf.to_container(cfg, resolve=True)))
