"""The quality half's record schema: RD points of `advbench uap stability`, in one place.

The kinds themselves (marker and required columns) are listed with the record store in
`advbench.core.records`; this module builds the rows and names the columns the readers group by.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pandas as pd

from advbench.core.errors import AdvbenchError
from advbench.core.records import KINDS_BY_NAME
from advbench.quality.metrics.metric_contract import QualityMetric

RD_KIND = KINDS_BY_NAME["rd"]
RD_MARKER_COLUMN = next(iter(RD_KIND.marker))
"""The column that tells RD records from robustness records."""
CURVE_KEYS = ["metric", "video", "amplitude"]
"""One RD curve per (metric, video, amplitude)."""
RD_COLUMNS = list(RD_KIND.columns)
"""The columns the stability score reads."""


def rd_record(
    point: Any, run_id: str, metric_name: str, metric: QualityMetric, video: str, amplitude: float,
    psnr_kind: str, settings: dict[str, Any], key: str,
) -> pd.DataFrame:
    """One RD point as its record row; `point` holds bitrate, codec stats, frame PSNRs, score and metric time."""
    psnrs = np.concatenate(point.psnrs)
    if not math.isfinite(point.score):
        raise AdvbenchError(f"metric {metric_name} returned a non-finite score on {video} a={amplitude:g}")
    return pd.DataFrame(
        {
            "run_id": [run_id],
            "metric": metric_name,
            "higher_better": bool(metric.higher_better),
            "video": video,
            "amplitude": amplitude,
            "target_bitrate_kbps": point.bitrate_kbps,
            "real_bitrate_kbps": point.codec.real_bitrate_kbps,
            "metric_score": point.score,
            "metric_scoring": "video" if metric.is_video else "frame mean",
            "psnr": float(psnrs.mean()),
            "psnr_kind": psnr_kind,
            "n_frames": len(psnrs),
            "codec_seconds": point.codec.seconds,
            "metric_seconds": point.metric_seconds,
            "settings": json.dumps(settings, sort_keys=True),
            "settings_key": key,
            "created_at": pd.Timestamp.now(tz="UTC"),
        }
    )
