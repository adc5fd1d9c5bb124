"""What a defense in front of a metric costs on clean images, before any attack.

A defense that raises a metric's robustness by rewriting its scores is no defense of the metric:
the cell records each image's undefended clean score beside the defended one, and its console line
says how far the defense moves clean scores, as the Spearman rank correlation between defended and
undefended clean scores (1: the ranking of images is kept) and the mean shift (defended minus
undefended, in the metric's own units).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import torch
from scipy.stats import spearmanr

from advbench.quality.iqa.guard import check_finite, user_failures
from advbench.quality.metrics.defended import DefendedMetric, MetricDefense
from advbench.quality.metrics.scoring import score


def defense_columns(name: str, defended: DefendedMetric | None, defense: MetricDefense, images: torch.Tensor,
                    batch_size: int, device: torch.device) -> tuple[dict[str, str], np.ndarray | None]:
    """The cell's defense columns and each image's undefended clean score (None without a defense:
    the undefended score is then the clean score itself).

    A defended cell's `metric` is `<metric>+<defense>`: the defended metric is another metric, and
    the scores, tables and figures, which group rows by metric and attack, must not pool it with
    the undefended one."""
    columns = {"defense": defense.name, "defense_params": json.dumps(defense.identity(), sort_keys=True)}
    if defended is None:
        return columns, None
    columns["metric"] = defense.metric_label(name)
    every = torch.arange(len(images))
    with torch.no_grad(), user_failures(defended.metric, name, "scoring the clean images without the defense", every):
        undefended = score(defended.metric, images, batch_size, device)
    check_finite(f"metric '{name}' gave the undefended clean score", undefended, every)
    return columns, undefended.double().numpy()


def with_undefended(frame: pd.DataFrame, undefended: np.ndarray | None) -> pd.DataFrame:
    """`frame` with the column `clean_score_undefended` (each row's image's undefended clean score)."""
    values = frame["score_clean"].to_numpy() if undefended is None else undefended[frame["image_id"].to_numpy()]
    return frame.assign(clean_score_undefended=values)


def clean_cost(frame: pd.DataFrame) -> tuple[float, float]:
    """(Spearman correlation, mean shift) of defended vs undefended clean scores, one pair per image."""
    per_image = frame.drop_duplicates("image_id")
    defended = per_image["score_clean"].to_numpy(dtype=float)
    undefended = per_image["clean_score_undefended"].to_numpy(dtype=float)
    shift = float(np.mean(defended - undefended))
    if len(per_image) < 2 or np.ptp(defended) == 0 or np.ptp(undefended) == 0:
        return (1.0 if np.array_equal(defended, undefended) and len(per_image) >= 2 else math.nan), shift
    return float(spearmanr(defended, undefended).statistic), shift


def cost_line(frame: pd.DataFrame) -> str:
    """The console's words for a defended cell's clean cost; empty without a defense."""
    if "defense" not in frame or frame["defense"].iloc[0] == "none":
        return ""
    rho, shift = clean_cost(frame)
    return f"; defense {frame['defense'].iloc[0]} on clean images: Spearman {rho:.3f}, mean shift {shift:+.3g}"
