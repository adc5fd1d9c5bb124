"""The job of `advbench iqa run`: one cell (a metric under an attack, at every budget) per job.

A cell's rows are (image, budget) pairs, row id `image × len(eps) + budget index`, so one
attack call carries one image at several budgets and a cell resumes, chunk by chunk, like a
robustness cell (`advbench.core.cells`). Its key covers every input that changes a number:
the metric's content digest (weights, options), a user's metric's code and behaviour
(`advbench.quality.metrics.user.user_identity`), the attack and its hyperparameters, the
budgets, the images' content digest and their crop size, the seed, the universal
perturbation's digest for `uap` and `cumulative_uap`, and the judges' (`advbench.quality.iqa.judges`).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping, Sequence

import pandas as pd
import torch
from rich.console import Console

from advbench.core.cells import claim_cell, fill_cell
from advbench.core.digests import module_digest, tensor_digest
from advbench.core.errors import AdvbenchError
from advbench.core.keys import content_key
from advbench.core.names import safe_name
from advbench.core.version import __version__
from advbench.quality.attacks.metric_attack import MetricAttack, PrepareContext, check_attackable, check_budgets
from advbench.quality.images import as_batch, uap_images
from advbench.quality.iqa.defense_cost import cost_line, defense_columns, with_undefended
from advbench.quality.iqa.fidelity import check_measurable, fidelity
from advbench.quality.iqa.guard import check_attacked, check_finite, check_judged, user_failures
from advbench.quality.iqa.judges import checked_judges, judge_columns, judge_identity
from advbench.quality.iqa.msu_scores import clean_width, msu_scores, raw_gain
from advbench.quality.iqa.progress import CellProgress
from advbench.quality.metrics.defended import DefendedMetric, MetricDefense
from advbench.quality.metrics.metric_contract import QualityMetric
from advbench.quality.metrics.scoring import device_of
from advbench.quality.metrics.user import user_identity

console = Console(stderr=True)


@dataclass(frozen=True, eq=False)
class MetricAttackSpec:
    """An `attack=` option of `advbench iqa run`, built where the options are read: the attack, its
    hyperparameters checked by its constructor (`MetricAttack.hyperparameters`), and the names of those
    the option sets (`given`). The cell key holds these, as the option gave them (`identity`); the
    class's defaults of the others are not in it, as they were not in the option's `params`."""

    attack: MetricAttack
    given: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        undeclared = [name for name in self.given if name not in self.attack.hyperparameters]
        if undeclared:
            raise AdvbenchError(f"{type(self.attack).__name__}: its option sets {undeclared[0]}, which the class "
                                "does not declare in `hyperparameters`")

    def identity(self) -> dict[str, Any]:
        """The hyperparameters the option sets, by name: the cell key's and the records' `attack_params`."""
        return {name: getattr(self.attack, name) for name in self.given}


@dataclass(frozen=True)
class IqaSpec:
    """What one job of `advbench iqa run` runs: the plain values of its config (`conf/iqa/iqa.yaml`)."""

    metric: str                        # the metric option's name: records, file names, the UAP cache
    attack: MetricAttackSpec
    eps: Sequence[float]
    data: str | None
    n_images: int | None
    size: int
    seed: int
    device: str
    batch_size: int
    chunk_size: int
    force: bool
    run_id: str | None
    progress: bool
    records_dir: str
    defense: MetricDefense = field(default_factory=MetricDefense)   # `none`: the metric as it is

    def __post_init__(self) -> None:
        """The budgets checked, and normalised, before any metric is built."""
        object.__setattr__(self, "eps", check_budgets(self.eps))


def load_images(spec: IqaSpec) -> tuple[torch.Tensor, str]:
    """The cell's images (N, 3, size, size) and where they came from: a folder, or the photos' test crops."""
    images = as_batch(uap_images(spec.data, split="test", size=int(spec.size), limit=spec.n_images))
    source = str(Path(str(spec.data)).expanduser().resolve()) if spec.data else "sample-photos:test"
    return images, source


def iqa_cell(spec: IqaSpec, metric: QualityMetric, given: tuple[torch.Tensor, str] | None = None,
             judges: Mapping[str, QualityMetric] | None = None) -> Path:
    """Run one cell: `metric` under the spec's attack at every budget (skipped when its records exist); the part's path.

    `given`: the images and what the records call their source (the Python API's tensors),
    instead of `spec.data`'s folder or the sample photos. `judges`: metrics by name that score
    every clean and attacked image beside `metric` (`advbench.quality.iqa.judges`)."""
    budgets, attack = list(spec.eps), spec.attack.attack
    name = safe_name(spec.metric, "metric")
    device = device_of(spec.device)
    metric = metric.to(device).eval()
    defended = DefendedMetric(metric, spec.defense) if spec.defense.active else None
    metric = defended or metric
    images, source = given if given is not None else load_images(spec)
    check_measurable(images)
    check_attackable(metric, name, images[:2].to(device), needs_gradient=attack.needs_gradient)
    judges = checked_judges(judges or {}, name, metric, images[:2].to(device))
    records_dir = Path(str(spec.records_dir)).expanduser()
    extra = attack.prepare(metric, PrepareContext(cache=records_dir.parent / "uaps" / name, seed=int(spec.seed),
                                                  device=device, progress=bool(spec.progress)))
    identity = {"metric": name, "metric_digest": module_digest(metric), "attack": attack.name,
                "attack_params": spec.attack.identity(), "eps": budgets, "images": tensor_digest(images),
                "size": int(spec.size), "seed": int(spec.seed), **extra, **judge_identity(judges),
                **user_identity(defended.metric if defended else metric, images),
                **({"defense": spec.defense.identity()} if defended else {})}
    key = content_key(identity)
    cell_name = f"{name}_{spec.defense.name}" if defended else name
    part = records_dir / f"{cell_name}_{attack.name}_s{int(spec.seed)}_{key}.parquet"
    ids = list(range(len(images) * len(budgets)))
    label = f"{spec.defense.metric_label(name)}/{attack.name} ({len(images)} images × {len(budgets)} budgets)"
    with claim_cell(part, key, ids, force=bool(spec.force)) as files:
        if files is None:
            console.print(f"[dim]skip {label}: records exist at {part} (force=true to redo)[/dim]", soft_wrap=True)
            return part
        defense, undefended = defense_columns(name, defended, spec.defense, images, int(spec.batch_size), device)
        static = {**_static_columns(spec, identity, key, metric, source, device, len(ids)), **defense}
        with CellProgress(label, len(ids), console, enabled=bool(spec.progress)) as progress:

            def compute(positions: list[int]) -> pd.DataFrame:
                frame = attack_rows(metric, attack, images, budgets, positions, int(spec.batch_size), device,
                                    progress.advance, judges, name=spec.defense.metric_label(name))
                return with_undefended(frame, undefended).assign(**static)

            frame = fill_cell(files, key, __version__, ids, int(spec.chunk_size), compute)
    summarize(frame, label, part)
    return part


def attack_rows(metric: QualityMetric, attack: MetricAttack, images: torch.Tensor, budgets: list[float],
                positions: list[int], batch_size: int, device: torch.device, advance: Any = None,
                judges: Mapping[str, QualityMetric] | None = None, *, name: str) -> pd.DataFrame:
    """Records of the rows at `positions` (row = image × len(budgets) + budget index), `batch_size` rows a call,
    with the `judges`' scores of each clean and attacked image; a row that is no record (a user's metric
    failing, a score that is no number) stops the cell with one line (`advbench.quality.iqa.guard`)."""
    rows = torch.tensor(positions)
    frames = []
    for batch in rows.split(batch_size):
        image_id, budget = batch // len(budgets), batch % len(budgets)
        x = images[image_id].to(device)
        eps = torch.tensor(budgets, dtype=x.dtype, device=device)[budget.to(device)]
        where = (image_id, eps.cpu())
        with user_failures(metric, name, attack.name, *where):
            with torch.no_grad():
                clean = metric(x)
            check_finite(f"metric '{name}' gave the clean score", clean, *where)
            tic = time.perf_counter()
            result = attack.run(metric, x, eps)
            seconds = (time.perf_counter() - tic) / len(batch)
        check_attacked(name, result.x_adv, result.trace, *where)
        judged = judge_columns(judges or {}, x, result.x_adv)
        check_judged(judged, *where)
        measured = {k: v.detach().cpu().double().numpy() for k, v in fidelity(result.x_adv, x).items()}
        trace = result.trace.detach().cpu().double()
        frames.append(pd.DataFrame({
            "sample_id": batch.numpy(), "image_id": image_id.numpy(), "eps": eps.cpu().double().numpy(),
            "score_clean": clean.detach().cpu().double().numpy(), "score_attacked": trace[:, -1].numpy(),
            **measured, "iterations": trace.shape[1], "grad_evals": result.grad_evals,
            "queries": pd.array([None] * len(batch) if result.queries is None else result.queries.cpu().numpy(),
                                dtype="Int64"),
            "seconds": seconds,
            "score_trace": list(trace.numpy()), **judged,
        }))
        if advance is not None:
            advance(len(batch))
    return pd.concat(frames, ignore_index=True)


def _static_columns(spec: IqaSpec, identity: dict[str, Any], key: str, metric: QualityMetric, source: str,
                    device: torch.device, samples: int) -> dict[str, Any]:
    """The columns every record of the cell shares: provenance, names, the metric's direction and range."""
    lo, hi = metric.score_range if metric.range_known else (math.nan, math.nan)
    return {
        "run_id": str(spec.run_id or datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")),
        "cell_key": key, "advbench_version": __version__, "cell_samples": samples,
        "metric": identity["metric"], "attack": identity["attack"],
        "attack_params": json.dumps(identity["attack_params"], sort_keys=True),
        "higher_better": bool(metric.higher_better), "score_lo": float(lo), "score_hi": float(hi),
        "data": source, "size": identity["size"], "seed": identity["seed"], "device": str(device),
        "uap": str(identity.get("uap", "")),
    }


def budget_label(eps: float) -> str:
    """A budget as the docs write it: 8/255, or 2.55/255 for one that is no whole number of levels."""
    return f"{eps * 255:.3g}/255"


def summarize(frame: pd.DataFrame, label: str, part: Path) -> None:
    """One entry per budget: the mean gain in the metric's own units towards its better end (independent of
    the cell's size), the mean absolute gain of docs/iqa.md (scaled by the range of the cell's clean scores,
    what `advbench plot` draws: it grows as a cell's images get fewer or more alike) and the mean PSNR; then
    what the scaled figure was divided by."""
    scores = msu_scores(frame)
    raw = frame.assign(raw=raw_gain(frame)).groupby("eps")["raw"].mean()
    shown = ", ".join(f"ε={budget_label(eps)}: {r:+.3g} ({g:+.3g} scaled, {p:.1f} dB)"
                      for eps, r, g, p in zip(scores["eps"], raw.to_numpy(), scores["abs_gain"], scores["psnr"]))
    scale = f"scaled: ÷ {clean_width(frame):.3g}, the range of the cell's {frame['image_id'].nunique()} clean scores"
    Console().print(f"{label}: mean gain {shown}; {scale}{cost_line(frame)}; wrote {part}", soft_wrap=True)


def check_iqa_settings(eps: Any, batch_size: Any, chunk_size: Any) -> None:
    """The values a job needs before any work: budgets, whole batch sizes."""
    check_budgets(eps)
    for key, value in (("batch_size", batch_size), ("chunk_size", chunk_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise AdvbenchError(f"{key} must be a whole number >= 1, got {value!r}")


def check_metric_attack(attack: str, cls: Any) -> None:
    """That option `attack` names (`cls`: the class its params name; None where they name none) an attack
    on quality metrics."""
    if not (isinstance(cls, type) and issubclass(cls, MetricAttack)):
        raise AdvbenchError(f"attack '{attack}' is not an attack on quality metrics (see `advbench list iqa/attack`)")
