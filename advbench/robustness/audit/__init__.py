"""`advbench report`: an evaluation that checks itself.

From benchmark records: per model row and threat the worst case over every attack (the
best-known robust accuracy), each attack's optimality against it and its cost, the signs of a
failed evaluation with their evidence, and the evaluation card, written as report.json and
one self-contained report.html (`write_report`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from advbench.robustness.audit.audit import audit
from advbench.robustness.audit.card import card
from advbench.robustness.audit.figures import curves_figure
from advbench.robustness.audit.html import page

REPORT_JSON, REPORT_HTML = "report.json", "report.html"


def write_report(frame: pd.DataFrame, out_dir: Path, sources: Sequence[str] = (),
                 corruptions: pd.DataFrame | None = None) -> list[Path]:
    """Audit the benchmark records in `frame` and write report.json and report.html into `out_dir`, each
    model row with its common-corruptions aggregate where `corruptions` (corruption records) hold it."""
    models = audit(frame)
    report = card(models, [str(s) for s in sources], corruptions)
    figures = {m.row: [curves_figure(m.row, t) for t in m.threats] for m in models}
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / REPORT_JSON).write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    (out_dir / REPORT_HTML).write_text(page(report, figures), encoding="utf-8")
    return [out_dir / REPORT_JSON, out_dir / REPORT_HTML]
