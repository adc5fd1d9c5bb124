"""Transfer between metrics: the A × B matrix of gains, from the judge columns of `iqa run` records.

Is an attacked image really better, or only better to the metric it was attacked on? For each
attack and ε, row A is the metric attacked and column B a metric judging A's clean and
attacked images (`advbench.quality.iqa.judges`). A cell is B's mean absolute gain on A's
images in B's own direction, with the gain of `advbench.quality.iqa.msu_scores`: B's scores flipped
so that higher is better and MinMax-scaled on B's clean scores of A's cell, s_a − s_c. So 1
is a change as large as the spread of B's verdicts on the clean images, whatever B's units,
and cells of different metrics compare. Positive: B also thinks the images got better; near
0: B does not notice; negative: B thinks they got worse. The diagonal is A's own gain (the
`abs_gain` of `msu_scores`), read from the records' own scores.

Written by `advbench plot` when the records have judges: `transfer.csv` (every attack, ε, A
and B: gain, 95 % t-interval, images), `transfer.md` (one matrix per attack at the largest ε
every row of it was attacked at) and `transfer.png` (the same matrices as annotated heatmaps,
a diverging colour scale centred at 0).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.colors import Normalize, SymLogNorm
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from advbench.quality.iqa.msu_scores import scaled, t_interval

KEYS = ["metric", "attack", "eps", "image_id", "cell_key"]
AS_JUDGE = {"judges": "judge", "judge_higher_better": "higher_better", "judge_clean": "score_clean",
            "judge_attacked": "score_attacked"}
"""The judge columns of `advbench.quality.iqa.judges` and what each becomes in the long form."""


def has_judges(frame: pd.DataFrame) -> bool:
    """Whether any record carries another metric's scores."""
    return "judges" in frame and bool(_judged_rows(frame).any())


def _judged_rows(frame: pd.DataFrame) -> pd.Series:
    """Rows with at least one judge (parts without judges read as NaN beside those with them)."""
    return frame["judges"].map(lambda v: isinstance(v, (list, tuple, np.ndarray)) and len(v) > 0)


def judged(frame: pd.DataFrame) -> pd.DataFrame:
    """Long form: one row per record and metric scoring it (the attacked metric itself, then every judge),
    with that metric as `judge`, its direction as `higher_better` and its scores as `score_clean`/`score_attacked`."""
    scores = list(AS_JUDGE.values())[1:]
    own = frame[KEYS + scores].assign(judge=frame["metric"])
    if not has_judges(frame):
        return own
    rows = frame.loc[_judged_rows(frame), KEYS + list(AS_JUDGE)]
    others = rows.explode(list(AS_JUDGE), ignore_index=True).rename(columns=AS_JUDGE)
    others = others.astype({"judge": str, "higher_better": bool, "score_clean": float, "score_attacked": float})
    return pd.concat([own, others[own.columns]], ignore_index=True)


def transfer_gains(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per (attack, ε, attacked metric, judge): the judge's mean scaled gain, its t-interval, the images."""
    long = judged(frame)
    # MinMax per cell *and* judge: each judge is scaled on its own clean scores of the cell's images
    gains = scaled(long.assign(cell_key=long["cell_key"].astype(str) + "/" + long["judge"]))
    gains = gains.assign(gain=gains["s_a"] - gains["s_c"])
    grouped = gains.groupby(["attack", "eps", "metric", "judge"], sort=True)["gain"]
    out = pd.DataFrame({"gain": grouped.mean(), "gain_ci": grouped.agg(t_interval), "n": grouped.size()})
    return out.reset_index()


def judge_order(gains: pd.DataFrame) -> tuple[list[str], list[str]]:
    """Rows (the attacked metrics) and columns (those, in the same order, then the judges never attacked),
    so that the diagonal is each metric's own gain."""
    rows = sorted(gains["metric"].unique())
    return rows, rows + sorted(set(gains["judge"]) - set(rows))


def largest_eps(gains: pd.DataFrame) -> float:
    """The largest ε at which every metric of the rows was attacked (the whole matrix compares like with like)."""
    shared = set.intersection(*(set(part["eps"]) for _, part in gains.groupby("metric")))
    return max(shared) if shared else float(gains["eps"].max())


def transfer_matrix(gains: pd.DataFrame, attack: str, eps: float) -> pd.DataFrame:
    """The A × B matrix of one attack at one ε: rows the attacked metrics, columns the judging ones (NaN: not judged)."""
    rows, columns = judge_order(gains)
    at = gains[(gains["attack"] == attack) & np.isclose(gains["eps"], eps)]
    return at.pivot(index="metric", columns="judge", values="gain").reindex(index=rows, columns=columns)


def matrices(gains: pd.DataFrame) -> dict[str, tuple[float, pd.DataFrame]]:
    """Each attack's matrix at its largest shared ε."""
    out = {}
    for attack, part in gains.groupby("attack", sort=True):
        eps = largest_eps(part)
        out[str(attack)] = (eps, transfer_matrix(gains, str(attack), eps))
    return out


def _markdown(attack: str, eps: float, matrix: pd.DataFrame) -> str:
    head = f"**{attack}**, ε = {eps * 255:.3g}/255 (rows: attacked metric; columns: judging metric)"
    cols = list(matrix.columns)
    lines = [head, "", "| attacked \\ judge | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    lines += [f"| {a} | " + " | ".join(f"{v:+.3f}" if np.isfinite(v) else "" for v in row) + " |"
              for a, row in zip(matrix.index, matrix.to_numpy())]
    return "\n".join(lines) + "\n"


def heatmaps(tables: dict[str, tuple[float, pd.DataFrame]], per_row: int = 3) -> Figure:
    """One annotated heatmap per attack (`per_row` a row), one diverging colour scale centred at 0 for all,
    the diagonal outlined."""
    norm = _colour_scale([m.to_numpy(dtype=float) for _, m in tables.values()])
    rows, cols = next(iter(tables.values()))[1].shape
    across, down = min(per_row, len(tables)), -(-len(tables) // per_row)
    fig = Figure(figsize=(max(1.3 * cols * across + 3.0, 6.0), (0.9 * rows + 1.4) * down + 0.6), layout="constrained")
    axes = fig.subplots(down, across, squeeze=False).ravel()
    image = None
    for ax, (attack, (eps, matrix)) in zip(axes, tables.items()):
        values = matrix.to_numpy(dtype=float)
        image = ax.imshow(np.ma.masked_invalid(values), cmap="RdBu", norm=norm, aspect="auto")
        for (i, j), v in np.ndenumerate(values):
            dark = np.isfinite(v) and abs(float(norm(v)) - 0.5) > 0.3
            ax.text(j, i, f"{v:+.2f}" if np.isfinite(v) else "—", ha="center", va="center", fontsize=8,
                    color="white" if dark else "black")
        for k in range(min(rows, cols)):
            ax.add_patch(_outline(k))
        ax.set_xticks(range(cols), list(matrix.columns), rotation=30, ha="right")
        ax.set_yticks(range(rows), list(matrix.index))
        ax.set_xlabel("judging metric B")
        ax.set_ylabel("attacked metric A")
        ax.set_title(f"{attack}, ε = {eps * 255:.3g}/255")
    for ax in axes[len(tables):]:
        ax.set_visible(False)
    fig.colorbar(image, ax=list(axes), label="B's scaled gain (> 0: B agrees)", shrink=0.9)
    fig.suptitle("Transfer between metrics: B's gain on images attacked on A")
    return fig


def _colour_scale(values: list[np.ndarray]) -> Normalize:
    """Symmetric about 0; logarithmic beyond ±1 (the clean verdicts' spread) when some gain passes ±5, so that
    one far-off cell (FGSM on NIQE) leaves the others' colours readable."""
    finite = [np.abs(v[np.isfinite(v)]) for v in values]
    limit = max((float(v.max()) for v in finite if v.size), default=1.0) or 1.0
    if limit > 5:
        return SymLogNorm(linthresh=1.0, vmin=-limit, vmax=limit, base=10)
    return Normalize(vmin=-limit, vmax=limit)


def _outline(k: int) -> Rectangle:
    return Rectangle((k - 0.5, k - 0.5), 1, 1, fill=False, edgecolor="0.2", lw=1.2)


def render_transfer(frame: pd.DataFrame, out_dir: Path) -> list[Path]:
    """Write `transfer.{csv,md,png}` of the module docstring; nothing when no record has judges."""
    if not has_judges(frame):
        return []
    gains = transfer_gains(frame)
    tables = matrices(gains)
    gains.to_csv(out_dir / "transfer.csv", index=False)
    intro = ("Transfer between metrics: each judging metric's mean absolute gain (scaled on its clean scores, "
             "higher = better) on the images attacked on the row's metric; the diagonal is the attacked metric's own "
             "gain.\n\n")
    (out_dir / "transfer.md").write_text(intro + "\n".join(_markdown(a, e, m) for a, (e, m) in tables.items()),
                                         encoding="utf-8")
    heatmaps(tables).savefig(out_dir / "transfer.png", dpi=150)
    return [out_dir / "transfer.csv", out_dir / "transfer.md", out_dir / "transfer.png"]
