"""The budget curve's band: each sample's minimum ε lies in (min_eps_lo, min_eps], so the curves
from the two ends enclose the true one, and the step the search leaves at the budget is inside."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from matplotlib.collections import PolyCollection
from matplotlib.colors import to_hex

from advbench.robustness.report.curves import budget_curve
from advbench.robustness.report.plot import budget_figure

BUDGET = 0.2
RESOLUTION = 0.05 * BUDGET


def searched(true_eps: np.ndarray, defense: str = "natural") -> pd.DataFrame:
    """Records as the search leaves them: brackets one resolution wide on a grid of a quarter of
    it, except that a sample broken at the budget whose root lies within the resolution below it is
    closed by a failing probe at budget − resolution, so its min_eps is the budget itself."""
    step = RESOLUTION / 4
    hi = np.ceil(true_eps / step - 1e-9) * step
    at_budget = (true_eps > BUDGET - RESOLUTION) & (true_eps <= BUDGET)
    hi = np.where(at_budget, BUDGET, hi)
    n = true_eps.size
    return pd.DataFrame({
        "dataset": "digits", "defense": defense, "attack": "bim", "norm": "linf", "goal": "untargeted",
        "knowledge": "white", "sample_id": np.arange(n), "label": 1, "clean_correct": True,
        "min_eps": hi, "min_eps_lo": hi - RESOLUTION, "eps_budget": BUDGET,
        "success_at_budget": hi <= BUDGET, "adv_pred": np.where(hi <= BUDGET, 2, 1),
    })


def test_band_contains_the_true_curve_and_the_step_at_the_budget():
    true_eps = np.random.default_rng(0).uniform(0.0, 2 * BUDGET, 2000)
    grid = np.union1d(np.linspace(0, 2 * BUDGET, 401), [BUDGET - RESOLUTION / 2])
    curve = budget_curve(searched(true_eps), grid).set_index("eps")
    truth = (true_eps[None, :] > curve.index.to_numpy()[:, None]).mean(axis=1)
    assert np.all(curve["accuracy_from_lo"].to_numpy() <= truth + 1e-12)
    assert np.all(truth <= curve["accuracy"].to_numpy() + 1e-12)
    # the curve from min_eps drops by the whole mass the search closed at the budget ...
    just_below = curve.loc[BUDGET - RESOLUTION / 2]
    drop = just_below["accuracy"] - curve.loc[BUDGET, "accuracy"]
    assert drop == pytest.approx(RESOLUTION / (2 * BUDGET), abs=0.01) and drop > 0.02
    # ... which the band spans: just below the budget it reaches down to the value after the step
    assert just_below["accuracy_from_lo"] <= curve.loc[BUDGET, "accuracy"] + 1e-12
    assert np.all(curve["asr_from_lo"] >= curve["asr"] - 1e-12)


def test_samples_without_a_bracket_add_no_width():
    frame = searched(np.array([0.05, 0.15, 0.3]))
    frame.loc[0, ["min_eps", "min_eps_lo"]] = [0.0, np.nan]  # already fooled: min_eps 0, nothing below
    curve = budget_curve(frame, np.array([0.0, 0.1, 0.2, 0.4]))
    assert curve["accuracy"].tolist() == pytest.approx([2 / 3, 2 / 3, 1 / 3, 0])
    assert curve["accuracy_from_lo"].tolist() == pytest.approx([2 / 3, 2 / 3, 1 / 3, 0])
    old = budget_curve(frame.drop(columns="min_eps_lo"), np.array([0.0, 0.1, 0.2, 0.4]))
    assert old["accuracy_from_lo"].tolist() == old["accuracy"].tolist(), "records without the column: no band"


def test_budget_figure_draws_one_band_per_curve_in_its_colour():
    rng = np.random.default_rng(1)
    frame = pd.concat([searched(rng.uniform(0, 2 * BUDGET, 200), d) for d in ("natural", "pgd_at")], ignore_index=True)
    fig = budget_figure(budget_curve(frame))
    ax = fig.axes[0]
    bands = [c for c in ax.collections if isinstance(c, PolyCollection)]
    curves = [line for line in ax.get_lines() if line.get_linestyle() != ":"]
    assert len(bands) == len(curves) == 2
    assert {to_hex(b.get_facecolor()[0]) for b in bands} == {to_hex(line.get_color()) for line in curves}
    assert "min-ε search bracket" in [t.get_text() for t in fig.legends[0].get_texts()]
    flat = budget_figure(budget_curve(frame.drop(columns="min_eps_lo")))
    assert not [c for c in flat.axes[0].collections if isinstance(c, PolyCollection)], "no width, no band"
