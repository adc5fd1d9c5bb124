"""The Python API: benchmark a model object from a script or a notebook, on the command line's code path.

`evaluate` builds the config `advbench run` would compose from the same choices (so every option, default and
check is the CLI's, and a bad value is the same one-line `AdvbenchError`; `advbench.cli.choices` assembles it
without Hydra's composition, a call's largest fixed cost), turns it into the same cell spec, hands the model (and
data or attack objects) to the same cell runner, and returns the records the CLI writes, as a DataFrame. `plot`
draws them as `advbench plot` does, `report` audits them as `advbench report` does; `options` lists a config
group as `advbench list` does. `evaluate_preset` runs every cell of a preset sweep (`experiment=full_eval`) on a
model object, and `preset_cost` states what its cells will spend. `evaluate_metric` is the quality half's.

The functions here hold the signatures and docstrings; their bodies live in `api.calls` (`evaluate_metric`'s
in `api.metric_calls`), loaded on a call's first line, so that looking up any of them loads neither torch nor
pandas, OmegaConf, the engine or the catalogue: they load when a function runs (`scripts/bench_startup.py --imports`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from advbench.api.described import Metric as Metric  # re-exported: `advbench.Metric`
from advbench.api.described import Model

if TYPE_CHECKING:  # annotations only: the modules load with `api.calls`
    import pandas as pd
    import torch
    from torch import nn

    from advbench.robustness.attacks.attack_contract import Attack


def _calls() -> ModuleType:
    """`api.calls`, where each function's body runs; a function passes it its arguments, `**locals()`."""
    from advbench.api import calls

    return calls


def _metric_calls() -> ModuleType:
    """`api.metric_calls`, where the quality half's `evaluate_metric` runs, as `_calls` for the others."""
    from advbench.api import metric_calls

    return metric_calls


def evaluate(model: nn.Module | Model, data: Any = None, *, attack: str | Attack | None = None,
             threat: str | None = None, eps: float | None = None, attack_params: Mapping[str, Any] | None = None,
             defense: str | None = None, out_dir: str | Path | None = None, device: str = "cpu", seed: int = 0,
             overrides: Sequence[str] = ()) -> pd.DataFrame:
    """Attack `model` on `data` under `threat`; one record per sample, the CLI's schema.

    `model`: any `nn.Module` from NCHW floats in [0, 1] to logits, or a `Model` around one that
    says its normalisation, randomness, classes or name.
    `defense`: an input-transformation defense put in front of it (`"jpeg"`, `"rp"`, ...); a
    defense that trains a model is refused, since the object comes with its weights.
    `data`: a data set option name (`"cifar10"` with `overrides=["dataset.root=..."]`; default
    `"digits"`), a torch `Dataset` of (x, y), or a pair of tensors (x, y); sample ids are positions.
    `attack`: an option name (with `attack_params`; default `"bim"`) or an attack object;
    `threat`: a threat option (`"linf"`, the default, `"l2_score"`, ...); `eps`: the budget
    (default: the data set's). `out_dir`: where parts are written and resumed (None: a temporary
    folder). `overrides`: any further `advbench run` overrides (`"search.enabled=false"`,
    `"batch_size=64"`, ...); those that name what a model or data object already fixes
    (`model.*`, `checkpoint=`, and `dataset.*` with data objects) are refused: nothing would
    apply them; so are those that set what a keyword set (`attack="fgsm"` with `"attack=pgd"`).

    The model is handed back as it came: every module's `training` flag and torch's global
    random state are restored, whether the call succeeds or not.
    """
    return _calls().evaluate(**locals())


def evaluate_metric(metric: nn.Module | Metric, images: torch.Tensor | str | Path, *, attack: str | None = None,
                    eps: Sequence[float] | None = None, attack_params: Mapping[str, Any] | None = None,
                    judges: Sequence[str] = (), n_images: int | None = None, size: int = 256,
                    out_dir: str | Path | None = None, device: str = "cpu", seed: int = 0,
                    overrides: Sequence[str] = ()) -> pd.DataFrame:
    """Attack a quality metric of your own on `images`, as `advbench iqa run` does; its iqa records.

    `metric`: any `nn.Module` from NCHW images in [0, 1] to one score per image, (N,), or a
    `Metric` around one that says whether higher is better, its score range and its name.
    `images`: a float tensor (N, 3, H, W) in [0, 1], or a folder of image files (the first
    `n_images`, centre-cropped to `size`). `attack`: an `advbench list iqa/attack` option (default
    `"ifgsm"`), with `attack_params`; `eps`: the ℓ∞ budgets (default 1, 4 and 8 / 255); an override
    that sets what one of these set is refused. `out_dir`: where parts are written and resumed
    (None: a temporary folder).
    `judges`: shipped metric options (`advbench list metric`) that score every clean and
    attacked image beside `metric`, for the transfer matrix of `plot`.
    `overrides`: further `advbench iqa run` overrides (`"batch_size=4"`, ...).

    One forward and backward on the first images comes first: one finite score per image and
    an input gradient (`attack="square"` needs none), else an AdvbenchError. Later, the module
    raising or a score or gradient turning NaN or infinite is one AdvbenchError naming the image
    and the budget, and nothing is written for the cell. The code and weights of `metric` key the cell;
    it is handed back as it came (training flags, parameters' `requires_grad`, device).
    """
    return _metric_calls().evaluate_metric(**locals())


def evaluate_preset(model: nn.Module | Model, data: Any = None, preset: str = "full_eval", *,
                    defense: str | None = None, budgets: Mapping[str, float] | None = None,
                    out_dir: str | Path | None = None, device: str = "cpu", seed: int = 0,
                    overrides: Sequence[str] = ()) -> pd.DataFrame:
    """Every cell of `preset` (as `advbench run -m experiment=PRESET`) on `model`: their records, one frame.

    The arguments mean what they mean in `evaluate`; the preset chooses each cell's attack and
    threat, so `overrides` that choose them are refused, while its budgets (`full_eval.*`), the
    search, `dataset.n_samples` (with a data set name) and `substitute=...` apply to every cell.
    `budgets`: ε per norm (`{"linf": 8/255, "l2": 0.5}`) for data handed in as tensors or a
    `Dataset`, which has none of its own (a data set option has its own: `dataset.budgets.*`).
    Before any cell runs, every transfer cell's substitute is checked for weights; the declared
    cost of the cells (`preset_cost`) comes with the records as `records.attrs["cost"]`.
    """
    return _calls().evaluate_preset(**locals())


def preset_cost(preset: str = "full_eval", overrides: Sequence[str] = ()) -> pd.DataFrame:
    """The declared cost of `preset`'s cells, as `advbench run -m experiment=PRESET` prints it before it runs.

    One row per cell: the attack, knowledge, norm and goal, the runs a sample can take, gradient
    evaluations and queries per run, per sample and in total over the cell's samples
    (`advbench.robustness.cost.COST_COLUMNS`). `overrides` as on the command line
    (`["full_eval.square_queries=200", "dataset.n_samples=20"]`)."""
    return _calls().preset_cost(**locals())


def plot(records: pd.DataFrame | str | Path, out: str | Path = "plots", group_by: str = "defense") -> list[Path]:
    """`advbench plot`'s figures and tables of benchmark or iqa records (a DataFrame, or a file or folder of parts).

    `group_by` colours benchmark curves per defense or category; iqa records (of
    `evaluate_metric`) give the MSU score table, the ranking and the gain curves, and with judges the
    transfer matrix between metrics."""
    return _calls().plot(**locals())


def report(records: pd.DataFrame | str | Path | Sequence[str | Path], out_dir: str | Path = "report",
           corruptions: pd.DataFrame | None = None) -> list[Path]:
    """`advbench report`: audit benchmark records (a DataFrame, or files or folders of parts) and write
    report.json and report.html into `out_dir`; returns their paths. Corruption records among the parts, or
    `corruptions` (as `evaluate(..., threat="corruptions")` returns them), put each model row's mean accuracy
    over corruptions × severities beside its verdicts."""
    return _calls().report(**locals())


def summary(records: pd.DataFrame) -> pd.DataFrame:
    """Table 3 of the records: per cell, accuracy / attack success rate and median minimum ε at the budget."""
    return _calls().summary(**locals())


def options(group: str | None = None) -> dict[str, str]:
    """The catalogue, as `advbench list`: the groups (None), or a group's options with their descriptions."""
    return _calls().options(**locals())
