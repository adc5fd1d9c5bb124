"""NES and SPSA say when their query budget buys too few steps of α = rel_stepsize·ε to reach ε.

k steps move an iterate at most k·α from the input; at 1,000 queries the seed's α = 0.15·ε buys
5 steps, 0.75·ε, so every example stays inside the ε budget's ball. The attack warns once (an
`AdvbenchWarning` inside `advbench.evaluate`, a `warning:` line on the command line).
"""

from __future__ import annotations

import warnings

import pytest
import torch

import advbench
from advbench.core.resume import AdvbenchWarning, python_warnings
from advbench.robustness.attacks.estimates import NES, SPSA
from advbench.robustness.attacks.oracles import ScoreOracle

EPS = 0.2
N = 24


def _attack(attack, tiny_model, digits_tensors, norm: str = "linf", eps: float = EPS):
    _, _, x, y = digits_tensors
    x, y = x[:N], y[:N]
    res = attack(ScoreOracle(tiny_model, N), x, y, eps=torch.full((N,), eps), norm=norm, sample_id=torch.arange(N))
    return res, (res.x_adv - x).flatten(1).abs().amax(dim=1) if norm == "linf" else (res.x_adv - x).flatten(1).norm(dim=1)


def _advbench_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, AdvbenchWarning)]


@pytest.mark.parametrize("cls", [NES, SPSA])
def test_the_seeds_step_at_1000_queries_warns_and_stays_inside(cls, tiny_model, digits_tensors, one_thread) -> None:
    attack = cls(n_queries=1000)  # the seed's q = 100, σ = 0.001, α = 0.15·ε: 5 steps
    assert len(attack.schedule()) == 5 and attack.reach() == pytest.approx(0.75)
    with python_warnings(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res, dist = _attack(attack, tiny_model, digits_tensors)
        _attack(attack, tiny_model, digits_tensors)  # a second batch of the same cell: no second line
    said = _advbench_warnings(caught)
    assert len(said) == 1, said
    assert f"{cls.__name__}: n_queries=1,000 buys 5 steps of α = 0.15·ε" in said[0]
    assert "0.75·ε" in said[0] and "n_queries >= 1,408 (7 full steps) or rel_stepsize >= 0.2" in said[0]
    assert float(dist.max()) <= 0.75 * EPS + 1e-6, "5 steps of 0.15·ε never get further than 0.75·ε"
    assert float(dist[~res.success].max()) == pytest.approx(0.75 * EPS, abs=1e-6), "survivors do get that far"


@pytest.mark.parametrize("cls,norm,eps", [(NES, "linf", EPS), (SPSA, "linf", EPS), (NES, "l2", 1.0)])
def test_a_step_that_reaches_is_silent_and_reaches_eps(cls, norm: str, eps: float, tiny_model, digits_tensors,
                                                         one_thread) -> None:
    attack = cls(n_queries=1000, rel_stepsize=0.2)
    assert attack.short_of_budget() is None
    with python_warnings(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, dist = _attack(attack, tiny_model, digits_tensors, norm, eps)
    assert _advbench_warnings(caught) == []
    assert float(dist.max()) <= eps + 1e-5
    if norm == "linf":  # ℓ2 steps lose norm to the [0, 1] clip on digits' blank pixels
        assert float(dist.max()) == pytest.approx(eps, abs=1e-5), "some example gets to the budget"


@pytest.mark.parametrize("n_queries,says", [(20000, None), (1408, None), (1210, None), (1000, "5 steps"),
                                            (3, "no step fits n_queries=3")])
def test_which_budgets_reach(n_queries: int, says: str | None) -> None:
    """The seed's 20,000 queries buy 100 steps (15·ε); 1,210 buys 7 (the last of one pair)."""
    why = NES(n_queries=n_queries).short_of_budget()
    assert why is None if says is None else says in why


def test_evaluate_warns_once_per_cell(tiny_model, digits_tensors, one_thread) -> None:
    _, _, x, y = digits_tensors
    with pytest.warns(AdvbenchWarning) as caught:
        advbench.evaluate(tiny_model, (x[:8], y[:8]), attack="nes", attack_params={"n_queries": 1000},
                          threat="linf_score", eps=EPS, overrides=["search.enabled=false"])
    said = [str(w.message) for w in caught if "NES: n_queries=1,000 buys 5 steps" in str(w.message)]
    assert len(said) == 1, [str(w.message) for w in caught]


def test_the_command_line_says_warning(tiny_model, digits_tensors, capsys) -> None:
    _, _, x, y = digits_tensors
    SPSA(n_queries=500)(ScoreOracle(tiny_model, 2), x[:2], y[:2], eps=torch.full((2,), EPS), norm="linf")
    err = capsys.readouterr()
    assert "warning: SPSA: n_queries=500 buys 3 steps" in err.out + err.err
