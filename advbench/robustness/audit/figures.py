"""The report's figures as inline PNG (base64 data URIs), drawn with matplotlib's Agg canvas.

One figure per model row and threat: each attack's curve vs ε, the worst case over them (thick,
black) and the budget, the same step functions `advbench plot` draws from `min_eps`: robust
accuracy for an untargeted threat, the targeted ASR (rising) for a targeted one. Inline PNG
keeps report.html one file that opens anywhere without network or script.
"""

from __future__ import annotations

import base64
import io

import numpy as np
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator, PercentFormatter

from advbench.robustness.audit.audit import ThreatAudit
from advbench.robustness.audit.best_known import curve_grid, measure, robust_accuracy, shown
from advbench.robustness.report.curves import budget_axis, whole_norm

DPI = 110
STYLES = {"white": "-", "transfer": "-.", "score": "--", "decision": ":"}
"""Line style by the adversary's knowledge, as a reader tells white-box from black-box curves."""


def png_uri(figure: Figure) -> str:
    """The figure as a `data:image/png;base64,...` URI."""
    FigureCanvasAgg(figure)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def drawn_curve(goal: str, breaks: np.ndarray, eps: np.ndarray) -> np.ndarray:
    """The curve drawn for per-sample break ε at each ε: what `advbench plot`'s budget curve gives for the
    cell, robust accuracy untargeted and the targeted ASR (the share that reached its target) targeted."""
    return shown(goal, robust_accuracy(breaks, eps))


def curves_figure(row: str, threat: ThreatAudit) -> str:
    """The threat's number (robust accuracy, or targeted ASR) vs ε for every attack and the worst case, with
    the budget marked."""
    g = threat.group
    eps = curve_grid(g)
    figure = Figure(figsize=(6.4, 3.8), layout="constrained")
    ax = figure.add_subplot()
    colours = colormaps["tab10"]
    for i, attack in enumerate(g.attacks):
        ax.step(eps, drawn_curve(g.goal, g.breaks[i], eps), where="post", lw=1.3, color=colours(i % 10),
                ls=STYLES.get(attack.knowledge, "-"), label=f"{attack.name} ({attack.knowledge})")
    ax.step(eps, drawn_curve(g.goal, threat.case.breaks, eps), where="post", lw=2.6, color="black",
            label="worst case")
    ax.axvline(g.eps_budget, color="grey", lw=0.8, ls="--")
    ax.annotate(f"budget {g.eps_budget:g}", (g.eps_budget, 1.0), xytext=(3, -12), textcoords="offset points",
                fontsize=8, color="grey")
    ax.set_xlim(0, float(eps.max()))
    ax.set_ylim(0, 1.02)
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_xlabel(budget_axis(g.norm))
    if whole_norm(g.norm):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(measure(g.goal))
    ax.set_title(f"{row} · {g.threat}", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper right" if g.untargeted else "lower right")
    return png_uri(figure)
