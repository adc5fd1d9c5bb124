"""Judges: the other metrics of a run, scoring every image a cell attacked (transfer between metrics).

An attack raises the verdict of the metric it follows; whether the image got better, or only
better to that metric, is a question for the other metrics. An `iqa run` cell with
`judges=[niqe,cnnqa]` scores each row's clean and attacked image with every judge and records
the scores beside the attacked metric's own, as list columns aligned by position:

* `judges`: the judges' names; `judge_higher_better`: each one's direction;
* `judge_clean`, `judge_attacked`: each judge's raw score of the clean and the attacked image.

A judge that is the attacked metric itself (the same name and the same content digest) is left
out: its scores are the record's own `score_clean` and `score_attacked`. Every judge joins the
cell key with its name, content digest and direction, so other judges are another cell.
`advbench.quality.iqa.metric_transfer` turns the columns into the matrix of gains.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

import numpy as np
import torch

from advbench.core.digests import module_digest
from advbench.core.errors import AdvbenchError
from advbench.quality.attacks.metric_attack import checked_scores
from advbench.quality.metrics.metric_contract import QualityMetric

UNBUILDABLE = ("python",)
"""Metric options that need settings a judge's name cannot carry (a user's network needs its `metric.target`)."""


def check_judge_names(value: Any, known: Collection[str]) -> list[str]:
    """`judges` (a list, or one name) as a list of distinct metric option names, else one line naming the
    first bad entry."""
    if value is None:
        return []
    if isinstance(value, str):  # judges=niqe: one judge
        value = [value]
    if not isinstance(value, (list, tuple)):
        raise AdvbenchError(f"judges must be a list of metric names, e.g. judges=[niqe,cnnqa]; got {value!r}")
    names = [str(v) for v in value]
    for name in names:
        if name not in known:
            raise AdvbenchError(f"unknown judge '{name}'; valid: {', '.join(n for n in known if n not in UNBUILDABLE)}")
        if name in UNBUILDABLE:
            raise AdvbenchError(f"judge '{name}' cannot be built from its name; judges are shipped metrics "
                                "(`advbench list metric`)")
    if len(set(names)) != len(names):
        raise AdvbenchError(f"judges repeats a metric: {names}")
    return names


def checked_judges(judges: Mapping[str, QualityMetric], name: str, metric: QualityMetric,
                   x: torch.Tensor) -> dict[str, QualityMetric]:
    """The judges other than the attacked metric, on `x`'s device in eval mode, each checked on the real
    images `x` (one finite score per image). A judge named as the attacked metric must be it."""
    own = module_digest(metric)
    others = {}
    for judge_name, judge in judges.items():
        judge = judge.to(x.device).eval()
        if judge_name == name:
            if module_digest(judge) != own:
                raise AdvbenchError(f"judge '{judge_name}' has the attacked metric's name but other weights or "
                                    "options; give the attacked metric another label")
            continue
        with torch.no_grad():
            checked_scores(judge, judge_name, x)
        others[judge_name] = judge
    return others


def judge_identity(judges: Mapping[str, QualityMetric]) -> dict[str, Any]:
    """The judges' entry of the cell key; none without judges, so cells without them keep their keys."""
    if not judges:
        return {}
    return {"judges": {name: {"digest": module_digest(judge), "higher_better": bool(judge.higher_better),
                              **judge.code_identity()} for name, judge in judges.items()}}


@torch.no_grad()
def judge_columns(judges: Mapping[str, QualityMetric], x: torch.Tensor, x_adv: torch.Tensor) -> dict[str, list]:
    """The judge columns of the module docstring for one batch of clean and attacked images; none without judges."""
    if not judges:
        return {}
    clean = torch.stack([judge(x) for judge in judges.values()], dim=1).detach().cpu().double().numpy()
    attacked = torch.stack([judge(x_adv) for judge in judges.values()], dim=1).detach().cpu().double().numpy()
    names = np.array(list(judges), dtype=object)
    directions = np.array([bool(j.higher_better) for j in judges.values()])
    return {"judges": [names] * len(x), "judge_higher_better": [directions] * len(x),
            "judge_clean": list(clean), "judge_attacked": list(attacked)}
