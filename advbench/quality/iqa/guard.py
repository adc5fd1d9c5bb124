"""A cell's rows checked before they are kept: a user's metric failing mid-cell, and scores that are no numbers.

The up-front check (`advbench.quality.attacks.metric_attack.check_attackable`) sees the cell's first two
images once. A metric can still raise on another image or on an attack's iterate, or turn its
scores NaN or infinite there. Such a row is no record, and a traceback (or a table of `+nan`) is
no answer: the cell stops with one line naming the metric, the row's image (its position in the
cell's image set) and budget, and what went wrong, before the chunk is kept, so no part is written
for the cell and a rerun computes it anew. A user's own metric is named as a user's model is
(`advbench.core.errors.user_code_failed`); a failure of advbench's own metrics is a bug and
keeps its traceback.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import numpy as np
import torch

from advbench.core.errors import AdvbenchError, user_code_failed
from advbench.quality.attacks.metric_attack import NonFinite
from advbench.quality.metrics.defended import DefendedMetric
from advbench.quality.metrics.metric_contract import QualityMetric
from advbench.quality.metrics.user import UserMetric

NOT_WRITTEN = "no records are written for the cell"


def _budget(eps: float) -> str:
    return f"ε={eps * 255:.3g}/255"


def _spans(ids: list[int]) -> str:
    """Sorted whole numbers with runs shortened: 0, 1, 2, 5 -> `0–2, 5`."""
    runs: list[list[int]] = []
    for i in ids:
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ", ".join(f"{a}" if a == b else f"{a}, {b}" if b == a + 1 else f"{a}–{b}" for a, b in runs)


def rows_named(image_id: torch.Tensor, eps: torch.Tensor | None = None) -> str:
    """A batch's rows as a user reads them: `image 3 at ε=4/255`, or the images (and budgets) the batch spans."""
    images = sorted({int(i) for i in image_id.tolist()})
    shown = f"image {images[0]}" if len(images) == 1 else f"images {_spans(images)}"
    if eps is None:
        return shown
    return f"{shown} at {', '.join(_budget(e) for e in sorted({float(e) for e in eps.tolist()}))}"


def _row(image_id: torch.Tensor, eps: torch.Tensor | None, i: int) -> str:
    """Row i of a batch, named: `image 3 at ε=4/255` (`image 3` without budgets)."""
    return rows_named(image_id[i:i + 1], None if eps is None else eps[i:i + 1])


def is_user_metric(metric: QualityMetric) -> bool:
    """Whether `metric` runs a user's own code (`metric=python`, `evaluate_metric`), defended or not."""
    return isinstance(metric.metric if isinstance(metric, DefendedMetric) else metric, UserMetric)


@contextmanager
def user_metric_failures(metric: QualityMetric, name: str, doing: str) -> Iterator[None]:
    """Within: an exception (or `sys.exit`) of a user's metric is one AdvbenchError naming the metric and
    what it was `doing`, its traceback kept as the cause (`uap train`, `uap eval`, a cell's UAP)."""
    try:
        yield
    except (AdvbenchError, NonFinite, torch.OutOfMemoryError):
        raise
    except (Exception, SystemExit) as exc:
        if not is_user_metric(metric):
            raise
        raise user_code_failed(f"metric '{name}'", doing, exc) from exc


@contextmanager
def user_failures(metric: QualityMetric, name: str, attack: str, image_id: torch.Tensor,
                  eps: torch.Tensor | None = None) -> Iterator[None]:
    """Within: an exception (or `sys.exit`) of a user's metric is one AdvbenchError naming the metric, the
    attack and the batch's images and budgets, its traceback kept as the cause; scores or a gradient that
    stopped being numbers during the attack (any metric's) name the first such row."""
    try:
        with user_metric_failures(metric, name, f"{attack} on {rows_named(image_id, eps)}"):
            yield
    except NonFinite as exc:
        raise AdvbenchError(f"metric '{name}' gave a score or input gradient of {exc.value} during {attack} for "
                            f"{_row(image_id, eps, exc.rows[0])} ({len(exc.rows)} of {len(image_id)} rows of its "
                            f"batch); {NOT_WRITTEN}") from None


def check_finite(said: str, values: torch.Tensor | np.ndarray, image_id: torch.Tensor,
                 eps: torch.Tensor | None = None) -> None:
    """`values` (one row per row of the batch) all finite, else one line: `said`, the first value that is not,
    and its row."""
    rows = torch.as_tensor(values).detach().reshape(len(image_id), -1)
    bad = ~torch.isfinite(rows).all(dim=1)
    if not bad.any():
        return
    i = int(bad.nonzero()[0, 0])
    value = rows[i][~torch.isfinite(rows[i])][0].item()
    raise AdvbenchError(f"{said} {value} for {_row(image_id, eps, i)} ({int(bad.sum())} of {len(bad)} rows of its "
                        f"batch); {NOT_WRITTEN}")


def check_attacked(name: str, x_adv: torch.Tensor, trace: torch.Tensor, image_id: torch.Tensor,
                   eps: torch.Tensor) -> None:
    """An attack's images and its metric's scores along the way, all finite (a NaN gradient makes NaN images)."""
    check_finite(f"metric '{name}' gave the attacked score", trace[:, -1], image_id, eps)
    check_finite(f"metric '{name}' gave, during the attack, the score", trace, image_id, eps)
    check_finite(f"the attack on metric '{name}' (a non-finite input gradient?) made a pixel", x_adv, image_id, eps)


def check_judged(columns: Mapping[str, list], image_id: torch.Tensor, eps: torch.Tensor) -> None:
    """The judges' scores of a batch (`advbench.quality.iqa.judges.judge_columns`), all finite."""
    if not columns:
        return
    for key, what in (("judge_clean", "clean"), ("judge_attacked", "attacked")):
        scores = np.stack(columns[key])
        for j, judge in enumerate(columns["judges"][0]):
            check_finite(f"judge '{judge}' gave the {what} score", scores[:, j], image_id, eps)
