"""The engine behind `advbench.api`: the bodies of its functions and their helpers.

Kept apart from the package's module, which holds the signatures and docstrings, so that looking up
`advbench.evaluate` loads no more than that module: torch's model stack, pandas, OmegaConf and the
catalogue load here, on a function's first call (`api._calls`).
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from torch import nn

from advbench.api.described import Model
from advbench.cli.api_cells import ApiCell, api_cell, preset_cells
from advbench.cli.spec_builder import refuse_attack_options
from advbench.core.caller_state import caller_state_kept
from advbench.core.catalog import describe, group_options, groups, keywords_said, refuse_twice_set
from advbench.core.digests import code_digest, module_digest
from advbench.core.errors import AdvbenchError
from advbench.core.fingerprint import behaviour_digest
from advbench.core.paths import writable_folder
from advbench.core.records import KINDS_BY_NAME, RecordKind, check_frame, read_kind, read_kinds, record_kind
from advbench.core.resume import python_warnings
from advbench.robustness.attacks.attack_contract import Attack
from advbench.robustness.data.tensors import TensorData
from advbench.robustness.defenses.wrappers import wrap
from advbench.robustness.evaluation.cell import Given, run_cell
from advbench.robustness.models.classifier import Classifier, evaluation_mode
from advbench.robustness.models.given import (
    Normalisation,
    refuse_inapplicable,
)
from advbench.robustness.models.user_models import check_forward, check_randomized, check_randomness, mark_randomized
from advbench.robustness.report.cell_report import report_cell
from advbench.robustness.report.table3 import summary_table, with_categories
from advbench.robustness.specs import AttackSpec, CellSpec, WrapperSpec
from advbench.robustness.threat import CORRUPTION


def evaluate(*, model, data, attack, threat, eps, attack_params, defense, out_dir, device, seed, overrides):
    """`advbench.api.evaluate`'s body: its arguments as the caller gave them, its defaults filled."""
    if eps is not None and (isinstance(eps, bool) or not isinstance(eps, (int, float))):
        raise AdvbenchError(f"eps must be one number, the budget, got {eps!r}: records give each sample's minimum ε, "
                            "so one call draws the whole accuracy-vs-ε curve (advbench.plot)")
    refuse_twice_set(_said(data=data, attack=attack, threat=threat, eps=eps, attack_params=attack_params,
                           label=_label(model), defense=defense), overrides)
    attack_said = [f"{k}={v!r}" for k, v in (("attack", attack), ("attack_params", attack_params), ("eps", eps))
                   if v is not None]
    data, attack, threat = "digits" if data is None else data, "bim" if attack is None else attack, threat or "linf"
    subject = _subject(model, data, defense, overrides, out_dir)
    with tempfile.TemporaryDirectory(prefix="advbench-") as scratch, caller_state_kept(subject.model, device), \
            python_warnings():
        cell = api_cell(_choices(data, attack, threat, defense),
                        _values(subject, attack, eps, attack_params,
                                Path(out_dir) if out_dir is not None else Path(scratch), device, seed),
                        overrides, as_given=subject.as_given)
        if cell.spec.threat.norm == CORRUPTION:
            refuse_attack_options([*attack_said, *overrides])
        return _evaluate_cell(cell, subject, _data_object(data, subject), attack)


def evaluate_preset(*, model, data, preset, defense, budgets, out_dir, device, seed, overrides):
    """`advbench.api.evaluate_preset`'s body: its arguments as the caller gave them, its defaults filled."""
    from advbench.cli.presets import specs_cost  # Hydra composes the preset's cells

    refuse_twice_set(_said(data=data, label=_label(model), defense=defense), overrides)
    data = "digits" if data is None else data
    subject = _subject(model, data, defense, overrides, out_dir)
    with tempfile.TemporaryDirectory(prefix="advbench-") as scratch, caller_state_kept(subject.model, device), \
            python_warnings():
        values = _values(subject, "preset", None, None, Path(out_dir) if out_dir is not None else Path(scratch),
                         device, seed)
        held = _data_object(data, subject, budgets)
        if held is not None:  # the cost counts the samples handed in
            values["dataset.n_samples"] = len(held.labels)
        picked = {"model": "python", **({"dataset": data} if isinstance(data, str) else {}),
                  **({"defense": defense} if defense is not None else {})}
        cells = preset_cells(preset, picked, values, overrides, as_given=subject.as_given)
        cost = specs_cost([cell.spec for cell in cells])
        if held is not None:
            _check_budgets(budgets, [cell.spec for cell in cells])
            _refuse_cached_substitutes([cell.spec for cell in cells])
        records = pd.concat([_evaluate_cell(cell, subject, held, "preset") for cell in cells], ignore_index=True)
        records.attrs["cost"] = cost
        return records


def preset_cost(*, preset, overrides):
    """`advbench.api.preset_cost`'s body: its arguments as the caller gave them, its defaults filled."""
    from advbench.cli.presets import preset_configs, sweep_cost

    return sweep_cost(preset_configs(preset, overrides))


@dataclasses.dataclass(frozen=True)
class _Subject:
    """The model object of a call and what the call says about it: its name in the records, its
    normalisation, randomness and classes, whether it runs as given (no defense in front)."""

    model: nn.Module
    name: str
    normalisation: Normalisation
    randomness: tuple[bool, int | None]
    num_classes: int | None
    as_given: bool
    kept: bool


def _subject(model: Any, data: Any, defense: str | None, overrides: Sequence[str],
             out_dir: str | Path | None) -> _Subject:
    """The call's model and what it says about it (a bare module: `Model(net)`), once the model and
    `overrides` are checked against what a model object combines with (`given.refuse_inapplicable`)."""
    described = model if isinstance(model, Model) else Model(model)
    if not isinstance(described.net, nn.Module):
        raise AdvbenchError(f"model must be a torch.nn.Module from NCHW floats in [0, 1] to logits, or an "
                            f"advbench.Model around one, got {type(described.net).__name__}")
    check_randomness(described.randomized, described.eot_samples)
    refuse_inapplicable(overrides, data_object=not isinstance(data, str))
    as_given = defense is None and not any(str(o).lstrip("+").startswith("defense") for o in overrides)
    return _Subject(described.net, described.label or type(described.net).__name__,
                    Normalisation(described.mean, described.std), (described.randomized, described.eot_samples),
                    described.num_classes, as_given, kept=out_dir is not None)


def _label(model: Any) -> str | None:
    """The records' name a call gives its model (None: its class name)."""
    return model.label if isinstance(model, Model) else None


_KEYWORD_KEYS = {"data": "dataset", "attack": "attack", "threat": "threat", "eps": "threat.eps", "label": "label", "defense": "defense"}
"""The config key each keyword of `evaluate` sets (`attack_params` sets one per parameter)."""


def _said(attack_params: Any = None, **keywords: Any) -> dict[str, str]:
    """The config keys the keywords given set, and how the caller said each (for `refuse_twice_set`)."""
    # data held in memory names no option: `refuse_inapplicable` refuses every `dataset*` override beside it
    plain = {name: value for name, value in keywords.items()
             if not isinstance(value, Attack) and (name != "data" or isinstance(value, str))}
    said = keywords_said(_KEYWORD_KEYS, plain, dict(attack_params) if isinstance(attack_params, Mapping) else None)
    if isinstance(keywords.get("attack"), Attack):  # an object holds its parameters too
        said.update({"attack": "an Attack object", "attack.params": "an Attack object"})
    return said


def _refuse_cached_substitutes(specs: Sequence[CellSpec]) -> None:
    """On data held in memory a transfer cell's substitute needs an explicit checkpoint: a cached one
    was trained on a data set option, which the cache does not take for this data."""
    for spec in specs:
        sub = spec.substitute
        if spec.threat.knowledge == "transfer" and sub is not None and sub.checkpoint is None:
            raise AdvbenchError(f"on data held in memory the transfer cells' substitute '{spec.substitute_name}' needs "
                                f"its weights: overrides=['substitute.checkpoint=PATH'] (a state dict of its "
                                f"{sub.model.name} for this data), or another substitute=<option> with them")


def _check_budgets(budgets: Mapping[str, float] | None, specs: Sequence[CellSpec]) -> None:
    """Data held in memory has no budgets of its own: a preset on it needs a positive ε for each norm
    its cells take the data set's budget in."""
    needed = sorted({spec.threat.norm for spec in specs if spec.threat.eps is None and spec.threat.norm != CORRUPTION})
    if budgets is None or not set(needed) <= set(budgets) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in budgets.values()):
        asked = ", ".join(f"'{norm}': ..." for norm in needed)
        raise AdvbenchError(f"data held in memory has no budgets of its own: give budgets={{{asked}}}, "
                            f"a positive ε for each norm the preset sweeps, got {budgets!r}")


def _data_object(data: Any, subject: _Subject, budgets: Mapping[str, float] | None = None) -> TensorData | None:
    """The data handed in as an `ImageDataset`, with its `budgets` (ε per norm) if given; None where
    `data` names a data set option, which has its own."""
    if isinstance(data, str):
        if budgets is not None:
            raise AdvbenchError(f"budgets= are for data held in memory; data set '{data}' has its own "
                                "(change them with overrides=['dataset.budgets.linf=...'])")
        return None
    return TensorData.of(data, num_classes=subject.num_classes or _classes_of(subject.model, data), budgets=budgets)


def _evaluate_cell(cell: ApiCell, subject: _Subject, held: TensorData | None, attack: str | Attack) -> pd.DataFrame:
    """One cell on the call's model (and data held in memory, attack object): its records."""
    spec = cell.spec
    if isinstance(attack, Attack):
        spec = dataclasses.replace(spec, attack=AttackSpec(type(attack).__name__.lower(), attack))
    dataset = spec.dataset.build() if held is None else held
    given = _given(spec, subject.model, dataset, attack, subject.normalisation, subject.randomness, subject.name,
                   cell.wrapper)
    if spec.threat.norm == CORRUPTION:
        from advbench.robustness.evaluation.corruption_cell import run_corruptions  # torchvision: only for corruptions

        return read_kind(run_corruptions(spec, dataclasses.replace(given, kept=subject.kept)), kinds=("corruption",))[1]
    run = run_cell(spec, dataclasses.replace(given, kept=subject.kept))
    if run is None:  # only a sweep skips a cell, and these run one at a time
        raise AdvbenchError("the cell was skipped")
    part = report_cell(run, spec.settings.gate, in_sweep=spec.settings.in_sweep)
    return read_kind([part], kinds=("benchmark",))[1]


def _choices(data: Any, attack: str | Attack, threat: str, defense: str | None) -> dict[str, str]:
    """The options these arguments name, by config group."""
    picked = {"threat": threat, "model": "python", **({"dataset": data} if isinstance(data, str) else {}),
              **({"defense": defense} if defense is not None else {})}
    if isinstance(attack, str):
        picked["attack"] = attack
    elif not isinstance(attack, Attack):
        raise AdvbenchError(f"attack must be an attack option name or an Attack object, got {type(attack).__name__}")
    return picked


def _values(subject: _Subject, attack: str | Attack, eps: float | None, attack_params: Mapping[str, Any] | None,
            out_dir: Path, device: str, seed: int) -> dict[str, Any]:
    """The values these arguments set, by dotted key."""
    values: dict[str, Any] = {"device": device, "seed": seed, "label": subject.name, "out_dir": str(out_dir),
                              "model.randomized": bool(subject.randomness[0])}
    if isinstance(attack, str):
        values.update({f"attack.params.{k}": v for k, v in (attack_params or {}).items()})
    elif attack_params:
        raise AdvbenchError("attack_params go with an attack option name; an Attack object holds its own")
    if eps is not None:
        values["threat.eps"] = float(eps)
    return values


def _given(spec: CellSpec, model: nn.Module, dataset: Any, attack: str | Attack, normalisation: Normalisation,
           randomness: tuple[bool, int | None], name: str, wrapper: WrapperSpec | None) -> Given:
    """The objects and what stands for them in the cell key: the model's code (its files and those of the
    user's modules it imports) and behaviour (`core.fingerprint`), its weights, the data's content.

    The model is put behind the defense's `wrapper` (None: as given), as `advbench run` puts
    a zoo model behind it, so the records' defense is the one applied.
    """
    net = Classifier(model, name, dataset.input_shape[0], normalisation.mean, normalisation.std, user_code=True)
    net = evaluation_mode(mark_randomized(net, *randomness))
    identity: dict[str, Any] = {"model": "python",
                                "model_config": {"class": type(model).__qualname__, "code_sha256": code_digest(model),
                                                 "mean": list(net.mean.flatten().tolist()),
                                                 "std": list(net.std.flatten().tolist()),
                                                 "randomized": net.randomized,
                                                 **({"eot_samples": net.eot_samples} if net.randomized else {})},
                                "weights": {"module_sha256": module_digest(model)}}
    check_forward(net, dataset.input_shape, dataset.num_classes, f"'{name}'")
    check_randomized(net, dataset.input_shape, f"'{name}'")
    identity["model_config"]["behaviour_sha256"] = behaviour_digest(net, dataset.input_shape, f"model '{name}'")
    if isinstance(dataset, TensorData):
        identity.update(dataset=dataset.name, dataset_config=dataset.identity())
    return Given(model=wrap(net, wrapper, seed=spec.settings.seed), identity=identity, dataset=dataset)


def _classes_of(model: nn.Module, data: Any) -> int | None:
    """The number of classes a model's logits have, from one pass on the data's first image (None: left to the labels).

    Run in eval mode, inside `caller_state_kept`, which gives the caller's modes back."""
    images = data[0] if isinstance(data, (tuple, list)) and len(data) == 2 else None
    if not isinstance(images, torch.Tensor) or images.dim() != 4 or not len(images):
        return None
    first = images[:1]
    try:
        with torch.no_grad():
            out = model.eval()(first.float())
    except Exception:  # the model's own failure is reported by check_forward, in one line
        return None
    return int(out.shape[1]) if isinstance(out, torch.Tensor) and out.dim() == 2 else None


def plot(*, records, out, group_by):
    """`advbench.api.plot`'s body: its arguments as the caller gave them, its defaults filled."""
    kind, frame, _ = _records(records, ("benchmark", "iqa"))
    if group_by not in ("defense", "category"):
        raise AdvbenchError(f"group_by must be defense or category, got {group_by!r}")
    folder = writable_folder(out, "out")
    if kind.name == "iqa":
        from advbench.quality.iqa.iqa_report import render_iqa  # matplotlib: only when drawing

        return render_iqa(frame, folder)
    from advbench.robustness.report.plot import render_all  # matplotlib: only when drawing

    return render_all(frame, folder, group_by=group_by)


def report(*, records, out_dir, corruptions):
    """`advbench.api.report`'s body: its arguments as the caller gave them, its defaults filled."""
    if isinstance(records, pd.DataFrame):
        _, frame, sources = _records(records, ("benchmark",))
        found = {}
    else:
        sources = _paths(records)
        found = read_kinds(sources, kinds=("benchmark",), together=("benchmark", "corruption"))
        frame = found["benchmark"]
    if corruptions is not None:
        given = [found.get("corruption"), _records(corruptions, ("corruption",))[1]]
        found["corruption"] = pd.concat([f for f in given if f is not None], ignore_index=True)
    folder = writable_folder(out_dir, "out_dir")
    from advbench.robustness.audit import write_report  # matplotlib: only when drawing

    return write_report(frame, folder, sources, found.get("corruption"))


def _records(records: Any, kinds: tuple[str, ...]) -> tuple[RecordKind, pd.DataFrame, list[Any]]:
    """Records of one of `kinds` handed in as a DataFrame (checked as a part file is) or as files or
    folders of parts; with the sources a report names."""
    if isinstance(records, pd.DataFrame):
        kind = record_kind(records.columns)
        if kind is None or kind.name not in kinds:
            raise AdvbenchError(f"records must be a DataFrame of {' or '.join(KINDS_BY_NAME[k].label for k in kinds)} "
                                f"(as the API returns them), got columns {', '.join(map(str, records.columns[:6]))}")
        check_frame(records, kind)
        return kind, records, ["a DataFrame"]
    sources = _paths(records)
    return (*read_kind(sources, kinds=kinds), sources)


def _paths(records: Any) -> list[Path]:
    """Files or folders of parts, given as one or a list."""
    paths = [records] if isinstance(records, (str, Path)) else records if isinstance(records, (list, tuple)) else [None]
    if not all(isinstance(p, (str, Path)) for p in paths):
        raise AdvbenchError(f"records must be a DataFrame of records, or a file or folder of parts (or a list of "
                            f"them), got {type(records).__name__}")
    return [Path(p) for p in paths]


def summary(*, records):
    """`advbench.api.summary`'s body: its arguments as the caller gave them, its defaults filled."""
    return summary_table(with_categories(records))


def options(*, group):
    """`advbench.api.options`'s body: its arguments as the caller gave them, its defaults filled."""
    if group is None:
        return {g: ", ".join(group_options(g)) for g in groups()}
    if group not in groups():
        raise AdvbenchError(f"unknown config group '{group}'; valid: {', '.join(groups())}")
    return {option: describe(group, option) for option in group_options(group)}
