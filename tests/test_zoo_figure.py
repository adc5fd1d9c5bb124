"""Defense-zoo figures (`plot --group-by category`): fourteen defenses in seven categories must read
apart, the legend must leave the panels their width and miss the title, and the query checkpoints
must lie on the query curve they mark, randomized defenses included."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from matplotlib.colors import to_hex

from advbench.robustness.report.curves import budget_curve, checkpoint_curve, query_curve
from advbench.robustness.report.plot import budget_figure, defense_categories, defense_styles, strength_figure

ZOO = {
    "natural": "natural training", "pgd_at": "robust training", "trades": "robust training", "alp": "robust training",
    "fd": "robust training", "ens_at": "robust training", "deepdefense": "robust training",
    "convex": "certified, robust training", "adp": "ensemble", "rse": "randomization, ensemble",
    "jpeg": "input transformation", "bit_red": "input transformation",
    "rp": "input transformation, randomization", "randmix": "input transformation, randomization",
}
RANDOMIZED = {"rse", "rp", "randmix"}
BUDGET, QUERIES = 0.2, 500
BUDGET_LINE = to_hex("0.35")


def zoo_records(attack: str, knowledge: str, n: int = 60, seed: int = 0) -> pd.DataFrame:
    """One cell per defense. Decision cells carry `norm_at_<q>` checkpoints; on a randomized defense
    the attack's own passes call some examples adversarial that the vote then rejects
    (`success_at_budget` false with a checkpoint within the budget), as on R&P."""
    rng = np.random.default_rng(seed)
    frames = []
    for defense, category in ZOO.items():
        min_eps = rng.uniform(0.02, 0.5, n)
        columns = {"min_eps_lo": min_eps - 0.02}
        first = np.where(min_eps <= BUDGET, 0, -1)
        if knowledge == "decision":
            first = np.where(min_eps <= BUDGET, rng.integers(1, QUERIES + 1, n), -1)
            norms = {q: np.where((first >= 1) & (first <= q), min_eps, BUDGET + 0.1) for q in (50, 100, 200, QUERIES)}
            if defense in RANDOMIZED:  # lucky single passes: within the budget by the attack's count, rejected by the vote
                lucky = rng.random(n) < 0.4
                norms = {q: np.where(lucky, BUDGET / 2, v) for q, v in norms.items()}
                first = np.where(lucky, -1, first)
            columns = {f"norm_at_{q}": v for q, v in norms.items()}
        success = first >= 0
        frames.append(pd.DataFrame({
            "dataset": "digits", "defense": defense, "defense_category": category, "attack": attack, "norm": "linf",
            "goal": "untargeted", "knowledge": knowledge, "sample_id": np.arange(n), "label": 1, "clean_correct": True,
            "min_eps": np.where(success, np.minimum(min_eps, BUDGET), np.inf), "eps_budget": BUDGET,
            "success_at_budget": success, "adv_pred": np.where(success, 2, 1), "first_success_strength": first,
            "strength_budget": QUERIES, **columns,
        }))
    return pd.concat(frames, ignore_index=True)


def figures():
    """The white-box budget figure (two panels) and the decision-based query figure (one panel)."""
    white = pd.concat([zoo_records("bim", "white"), zoo_records("pgd", "white", seed=1)], ignore_index=True)
    hsj = zoo_records("hsj", "decision", seed=2)
    categories = defense_categories(white)
    styles = defense_styles(ZOO, categories)
    return {"white": budget_figure(budget_curve(white), styles, categories),
            "decision": strength_figure(query_curve(hsj), styles, checkpoint_curve(hsj), categories)}


@pytest.fixture(scope="module")
def drawn():
    out = figures()
    for fig in out.values():
        fig.canvas.draw()
    return out


def test_every_defense_has_its_own_colour(drawn):
    for fig in drawn.values():
        for ax in fig.axes:
            curves = [line for line in ax.get_lines() if line.get_linestyle() != "None" and to_hex(line.get_color()) != BUDGET_LINE]
            assert len(curves) == len(ZOO)
            assert len({to_hex(line.get_color()) for line in curves}) == len(ZOO)


@pytest.mark.parametrize("kind", ["white", "decision"])
def test_legend_sits_below_the_panels_and_misses_the_title(drawn, kind):
    fig = drawn[kind]
    renderer = fig.canvas.get_renderer()
    legend = fig.legends[0].get_window_extent(renderer)
    title = fig._suptitle.get_window_extent(renderer)
    panels = [ax.get_tightbbox(renderer) for ax in fig.axes]
    width, height = fig.bbox.width, fig.bbox.height
    assert not legend.overlaps(title)
    assert all(not legend.overlaps(p) for p in panels)
    assert legend.y1 <= min(p.y0 for p in panels), "below the panels"
    assert legend.x0 >= 0 and legend.x1 <= width and legend.y0 >= 0 and title.y1 <= height, "inside the figure"
    span = max(p.x1 for p in panels) - min(p.x0 for p in panels)
    assert span >= 0.75 * width, "the legend takes at most a quarter of the width from the panels"
    assert legend.height <= 1.05 * max(p.y1 for p in panels) - min(p.y0 for p in panels)
    labels = [t.get_text() for t in fig.legends[0].get_texts() if t.get_text()]
    assert set(ZOO) <= set(labels) and set(ZOO.values()) <= set(labels)


def test_query_checkpoints_lie_on_the_step_curve(drawn):
    ax = drawn["decision"].axes[0]
    steps = {to_hex(line.get_color()): line for line in ax.get_lines() if line.get_linestyle() != "None"}
    dots = [line for line in ax.get_lines() if line.get_linestyle() == "None"]
    assert len(dots) == len(ZOO)
    for dot in dots:
        curve = steps[to_hex(dot.get_color())]
        x, y = np.asarray(curve.get_xdata(), float), np.asarray(curve.get_ydata(), float)
        for q, value in zip(dot.get_xdata(), dot.get_ydata()):
            assert value == pytest.approx(y[np.searchsorted(x, q, side="right") - 1]), f"checkpoint at {q} queries"
