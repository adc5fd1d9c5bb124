"""The Hydra tasks of `advbench uap train | eval | stability` and `advbench iqa run`: a composed config in.

The command line is the one reader of Hydra's configs: each task turns its composed DictConfig
into the job's plain spec (`TrainSpec`, `Table1Spec`, `StabilitySpec`, `IqaSpec`), reads the
metric option's name from Hydra, builds the metric (`advbench.cli.metrics.build_metric`) and
the attack (`advbench.cli.option_targets.construct`), and hands them to the quality half. The
quality modules import torch, so they are imported inside the tasks: `advbench --help`
imports neither torch nor pandas.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from omegaconf import DictConfig, OmegaConf

from advbench.cli.metrics import build_metric
from advbench.cli.option_targets import construct, target_of
from advbench.cli.spec_values import settings, spec_fields
from advbench.core.catalog import group_options


def metric_name(cfg: Mapping[str, Any]) -> str:
    """The records' metric name: a user's metric's `metric.label`, else the option the user
    chose (`metric=...`), outside Hydra the config's `name`."""
    from hydra.core.hydra_config import HydraConfig

    if cfg["metric"].get("label") is not None:
        return str(cfg["metric"]["label"])
    if HydraConfig.initialized():
        return str(HydraConfig.get().runtime.choices["metric"])
    return str(cfg["metric"].get("name", "metric"))


def resolved(value: Any) -> Any:
    """A config value as plain data, its interpolations resolved."""
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


def job_spec(spec_type: type, cfg: Mapping[str, Any], **given: Any) -> Any:
    """`spec_type` (a frozen dataclass) filled with the config's resolved values of its fields, a group of
    settings built as its field's dataclass (`cli.spec_values`), `given` on top."""
    values = {f.name: resolved(cfg[f.name]) for f in fields(spec_type) if f.name not in given}
    return spec_type(**spec_fields(spec_type, values), **given)


def train_main(cfg: DictConfig) -> Any:
    """`advbench uap train`: train, save and record one UAP; the .pt path."""
    from advbench.quality.uap.training import TrainSpec, train_job

    return train_job(job_spec(TrainSpec, cfg, metric=metric_name(cfg)), build_metric(cfg["metric"]))


def eval_main(cfg: DictConfig) -> Any:
    """`advbench uap eval`: the seed's Table 1 (UAP vs MADC); the table."""
    from advbench.quality.uap.evaluation import Table1Spec, table1_job

    return table1_job(job_spec(Table1Spec, cfg, metric=metric_name(cfg)), build_metric(cfg["metric"]))


def stability_main(cfg: DictConfig) -> Any:
    """`advbench uap stability`: RD records of a UAP's videos; the run's summary."""
    from advbench.quality.stability.uap_rd import StabilitySpec, stability_job

    return stability_job(job_spec(StabilitySpec, cfg, metric=metric_name(cfg)), build_metric(cfg["metric"]))


def iqa_main(cfg: DictConfig) -> Any:
    """`advbench iqa run`: one cell, a metric under an attack at every budget; the part's path."""
    return iqa_job(cfg, build_metric(cfg["metric"]), metric_name(cfg))


def iqa_job(cfg: Mapping[str, Any], metric: Any, name: str, given: Any = None) -> Any:
    """One `iqa run` cell of a run config (Hydra's composition, or the Python API's plain data) and a built
    metric (the Python API's object, or the option's); `given` are the API's images and their source. The
    part's path."""
    from advbench.core.runtime import set_threads
    from advbench.quality.iqa.run import IqaSpec, iqa_cell

    set_threads(cfg.get("threads"))
    spec = job_spec(IqaSpec, cfg, metric=name, attack=attack_spec(cfg), defense=defense_spec(cfg))
    judges = {judge: build_metric(judge) for judge in judge_names(cfg)}
    return iqa_cell(spec, metric, given, judges)


def attack_spec(cfg: Mapping[str, Any]) -> Any:
    """The job's `attack=` option built and checked (its constructor's hyperparameter checks), with the names
    of the hyperparameters its `params` set: a `MetricAttackSpec`."""
    from advbench.quality.iqa.run import MetricAttackSpec

    params = resolved(cfg["attack"]["params"])
    return MetricAttackSpec(construct(params), tuple(key for key in params if key != "_target_"))


def judge_names(cfg: Mapping[str, Any]) -> list[str]:
    """The metric options named by `judges` (`advbench.quality.iqa.judges.check_judge_names`)."""
    from advbench.quality.iqa.judges import check_judge_names

    return check_judge_names(resolved(cfg.get("judges")), group_options("metric"))


def defense_spec(cfg: Mapping[str, Any]) -> Any:
    """The job's `defense=` option as a checked `MetricDefense` (`none` where the config has no defense), its
    `params` its kind's `TransformParams`."""
    from advbench.quality.metrics.defended import MetricDefense, kind_of

    defense = resolved(cfg.get("defense")) or {}
    given = {key: defense[key] for key in ("bpda", "backward", "eot", "score_draws") if key in defense}
    name = str(defense.get("name", "none"))
    params = settings(kind_of(name).params, defense.get("params") or {}, "defense.params", f"defense '{name}'")
    return MetricDefense(name=name, params=params, seed=int(cfg.get("seed", 0)), **given)


def check_iqa(cfg: Mapping[str, Any]) -> None:
    """The values an `iqa run` job needs before any work (`advbench.quality.iqa.run.check_iqa_settings`)."""
    from advbench.quality.iqa.run import check_iqa_settings, check_metric_attack

    check_iqa_settings(resolved(cfg.get("eps")), cfg.get("batch_size"), cfg.get("chunk_size"))
    attack = cfg.get("attack") or {}
    target = str((attack.get("params") or {}).get("_target_") or "")
    check_metric_attack(str(attack.get("name")), target_of(target) if target else None)
    judge_names(cfg)
    defense_spec(cfg)
