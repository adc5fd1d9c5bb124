"""The quality half's Python API: attack a quality metric of your own, on `advbench iqa run`'s code path.

`evaluate_metric` hands its choices and values, as Python objects, to `cli.api_metric_cells`, which
builds the config `advbench iqa run metric=python` would compose (so its options, defaults and checks
are the CLI's) and runs the same cell on the caller's module and images; the iqa records come back as
a DataFrame, which `advbench.plot` draws.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from torch import nn

from advbench.api.described import Metric
from advbench.cli.api_metric_cells import metric_part
from advbench.core.caller_state import caller_state_kept
from advbench.core.catalog import keywords_said, override_key, refuse_twice_set
from advbench.core.errors import AdvbenchError
from advbench.core.names import safe_name
from advbench.core.records import read_kind
from advbench.core.resume import python_warnings
from advbench.quality.attacks.metric_attack import check_budgets
from advbench.quality.images import given_images
from advbench.quality.metrics.user import UserMetric


def evaluate_metric(*, metric, images, attack, eps, attack_params, judges, n_images, size, out_dir, device, seed,
                    overrides):
    """`advbench.api.evaluate_metric`'s body: its arguments as the caller gave them, its defaults filled."""
    described = metric if isinstance(metric, Metric) else Metric(metric)
    metric = described.net
    if not isinstance(metric, nn.Module):
        raise AdvbenchError(f"metric must be a torch.nn.Module from NCHW images in [0, 1] to one score per image, "
                            f"or an advbench.Metric around one, got {type(metric).__name__}")
    refuse_twice_set(keywords_said({"attack": "attack", "eps": "eps"}, {"attack": attack, "eps": eps},
                                   dict(attack_params) if isinstance(attack_params, Mapping) else None), overrides)
    attack, eps = "ifgsm" if attack is None else attack, (1 / 255, 4 / 255, 8 / 255) if eps is None else eps
    name = safe_name(described.label or type(metric).__name__, "label")
    if not isinstance(images, (torch.Tensor, str, Path)):
        raise AdvbenchError(f"images must be a float tensor (N, 3, H, W) in [0, 1] or a folder of image files, "
                            f"got {type(images).__name__}")
    if not isinstance(attack, str):
        raise AdvbenchError(f"attack must be an option name of `advbench list iqa/attack`, got {type(attack).__name__}")
    if not isinstance(judges, (list, tuple, str)):
        raise AdvbenchError(f"judges must be a list of metric names, e.g. ['niqe', 'cnnqa'], got {type(judges).__name__}")
    given = given_images(images) if isinstance(images, torch.Tensor) else None
    _refuse_fixed(overrides, tensor_images=given is not None)
    with tempfile.TemporaryDirectory(prefix="advbench-") as scratch, caller_state_kept(metric, device), \
            python_warnings():
        values = {"eps": check_budgets(eps), "seed": seed, "device": device,
                  "out_dir": str(out_dir if out_dir is not None else scratch), "progress": False,
                  "n_images": n_images, "size": size if given is None else min(given[0].shape[-2:]),
                  "data": None if given is not None else str(images), "judges": judges,
                  **{f"attack.params.{k}": v for k, v in (attack_params or {}).items()}}
        part = metric_part({"metric": "python", "attack": attack}, values, overrides,
                           metric=UserMetric(metric, name, described.higher_better, described.score_range), name=name,
                           given=given)
        return read_kind([part], kinds=("iqa",))[1]


def _refuse_fixed(overrides: Sequence[str], *, tensor_images: bool) -> None:
    """An AdvbenchError for an override the objects leave nothing to apply to: `metric.*` (the module
    fixes the metric) and, with a tensor of images, `data`, `n_images` and `size`."""
    fixed = ("metric", *(("data", "n_images", "size") if tensor_images else ()))
    for override in [overrides] if isinstance(overrides, str) else overrides:
        group = override_key(override).split(".")[0]
        if group in fixed:
            what = "a metric object: it fixes the metric" if group == "metric" else "a tensor of images: pass the images you want"
            raise AdvbenchError(f"override '{override}' cannot apply to {what}")
