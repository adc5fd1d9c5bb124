"""The ℓ0 attacks' own behaviour beyond the catalogue's contract: FMN's whole-pixel radius, PGD-ℓ0's restarts,
and ℓ0 records through the engine (whole pixel counts, brackets closed at one pixel)."""

from __future__ import annotations

import math

import pytest
import torch
from test_known_optimum import catalogue

from advbench.core.norms import norm
from advbench.robustness.attacks.fmn import next_count
from advbench.robustness.attacks.oracles import WhiteBoxOracle
from advbench.robustness.attacks.pgd_l0 import PGDL0
from advbench.robustness.data.target_classes import target_classes
from advbench.robustness.evaluation.measure import evaluate_batch
from advbench.robustness.specs import SearchSettings
from advbench.robustness.threat import ThreatModel

pytestmark = pytest.mark.usefixtures("one_thread")


def test_fmn_radius_moves_a_whole_pixel_at_least() -> None:
    """Foolbox's L0FMNAttack rule: ±1 while γ·ε < 1, ⌊ε(1 ± γ)⌋ beyond; never above the smallest found, never below 1."""
    radius = torch.tensor([0.0, 3.0, 3.0, 40.0, 40.0, 5.0, 1.0])
    hit = torch.tensor([False, False, True, False, True, True, True])
    smallest = torch.tensor([math.inf, math.inf, 3.0, math.inf, 40.0, 3.0, 1.0])
    assert next_count(radius, hit, smallest, 0.05).tolist() == [1.0, 4.0, 2.0, 42.0, 38.0, 3.0, 1.0]


def test_pgd_l0_restarts_only_failed_samples_and_never_lose_one(tiny_model, digits_tensors) -> None:
    _, _, x, y = digits_tensors
    x, y = x[:100], y[:100]
    eps = torch.full((100,), 1.0)
    one = PGDL0(steps=20, restarts=1)(WhiteBoxOracle(tiny_model, 100), x, y, eps=eps, norm="l0")
    oracle = WhiteBoxOracle(tiny_model, 100)
    three = PGDL0(steps=20, restarts=3)(oracle, x, y, eps=eps, norm="l0")
    assert (three.success >= one.success).all() and three.success.sum() > one.success.sum()
    assert torch.equal(three.x_adv[one.success], one.x_adv[one.success])      # the first restart is the same run
    assert torch.equal(three.first_success[one.success], one.first_success[one.success])
    later = three.success & ~one.success
    assert (three.first_success[later] >= 20).all() and (three.first_success <= 60).all()
    assert (oracle.grad_evals <= 60).all() and (oracle.grad_evals[one.success] <= 20).all()


def test_pgd_l0_without_random_start_is_deterministic_and_starts_at_the_input(tiny_model, digits_tensors) -> None:
    _, _, x, y = digits_tensors
    x, y = x[:50], y[:50]
    run = lambda seed: PGDL0(steps=10, random_init=False, seed=seed)(  # noqa: E731
        WhiteBoxOracle(tiny_model, 50), x, y, eps=torch.full((50,), 2.0), norm="l0")
    a, b = run(0), run(7)
    assert torch.equal(a.x_adv, b.x_adv)
    assert torch.equal(a.first_success == 0, tiny_model(x).argmax(1) != y)


@pytest.mark.parametrize("method", ["margin", "bisect"])
@pytest.mark.parametrize("goal", ["untargeted", "targeted"])
def test_l0_records_count_whole_pixels_and_close_at_one(method: str, goal: str, tiny_model, digits_tensors) -> None:
    """min_eps a whole number of pixels, the last failed probe one pixel below it, success at the budget ⇔
    min_eps ≤ budget, and the example behind the budget columns within the budget."""
    _, _, x, y = digits_tensors
    x, y = x[:48], y[:48]
    target = target_classes(torch.arange(48), y, 10, seed=0) if goal == "targeted" else None
    threat = ThreatModel(norm="l0", goal=goal, eps=3.0)
    out = evaluate_batch(PGDL0(steps=30), tiny_model, x, y, target, threat, SearchSettings(method=method))
    hi, lo = out["min_eps"], out["min_eps_lo"]
    found = torch.isfinite(hi) & (hi > 0)
    assert found.float().mean() > 0.5
    assert torch.equal(hi[found], hi[found].round()) and torch.equal(lo[found], hi[found] - 1)
    assert torch.equal(out["success_at_budget"], hi <= 3.0)
    assert (out["adv_norm"][found] <= hi[found]).all()


def test_fmn_l0_records_are_the_returned_examples_pixel_counts(tiny_model, digits_tensors) -> None:
    _, _, x, y = digits_tensors
    x, y = x[:40], y[:40]
    threat = ThreatModel(norm="l0", goal="untargeted", eps=2.0)
    out = evaluate_batch(catalogue("fmn"), tiny_model, x, y, None, threat, SearchSettings())
    res = catalogue("fmn")(WhiteBoxOracle(tiny_model, 40), x, y, eps=torch.full((40,), 2.0), norm="l0")
    counts = norm("l0").distance(res.x_adv.double(), x.double())
    fresh = tiny_model(x).argmax(1) == y
    assert res.success[fresh].all()
    assert torch.equal(out["min_eps"][fresh], counts[fresh]) and torch.equal(counts, counts.round())
    assert torch.equal(out["success_at_budget"], out["min_eps"] <= 2.0)


class Noisy(torch.nn.Module):
    """The tiny model behind Gaussian input noise: a randomized target, judged by a vote."""

    bounds = (0.0, 1.0)
    randomized = True

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x + 0.2 * torch.randn_like(x))


def test_pgd_l0_runs_its_course_on_a_randomized_model(tiny_model, digits_tensors) -> None:
    """A vote dates a sample's first success but does not stop it (`Oracle.stops_on_hit`): every sample
    takes every step, and the last iterate, within the budget, is returned."""
    _, _, x, y = digits_tensors
    x, y = x[:40], y[:40]
    torch.manual_seed(0)
    oracle = WhiteBoxOracle(Noisy(tiny_model), 40, draws=5)
    assert not oracle.stops_on_hit
    res = PGDL0(steps=10)(oracle, x, y, eps=torch.full((40,), 3.0), norm="l0")
    assert (oracle.grad_evals == 10).all()
    assert res.success.any() and torch.equal(res.success, res.first_success >= 0)
    assert (norm("l0").distance(res.x_adv, x) <= 3).all() and res.x_adv.min() >= 0 and res.x_adv.max() <= 1
