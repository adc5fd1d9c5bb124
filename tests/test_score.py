"""Score-based attacks (Square, NES, SPSA): exact per-sample query counts, logits only, determinism, strength.

The catalogue contract (tests/test_attacks.py) covers bounds, budgets, targeted success and
batch independence; these tests cover what is particular to attacks that pay in queries.
"""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from contract import assert_seeded_and_batch_independent
from torch import nn

from advbench.cli.config import compose_config
from advbench.robustness.attacks.estimates import NES, SPSA
from advbench.robustness.attacks.oracles import ScoreOracle
from advbench.robustness.attacks.score import Square, p_schedule
from advbench.robustness.evaluation.measure import evaluate_batch
from advbench.robustness.specs import SearchSettings
from advbench.robustness.threat import ThreatModel

BUDGETS = {"linf": 0.1, "l2": 0.8}


class CountingModel(nn.Module):
    """The tiny model behind a counter: which clean sample each queried row belongs to (its
    nearest clean input; digits are further apart than any budget here), and whether autograd
    could reach the model."""

    def __init__(self, model: nn.Module, clean: torch.Tensor) -> None:
        super().__init__()
        self.model = model
        self.bounds = model.bounds
        self.clean = clean
        self.seen = torch.zeros(len(clean), dtype=torch.long)
        self.autograd_reachable = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.autograd_reachable |= torch.is_grad_enabled() or not torch.is_inference_mode_enabled()
        owner = torch.cdist(x.flatten(1), self.clean.flatten(1), p=float("inf")).argmin(dim=1)
        self.seen.index_add_(0, owner, torch.ones_like(owner))
        return self.model(x)


# Short budgets: Square 60 queries; NES/SPSA q = 10 direction pairs: 5 steps of 21 queries + the clean check
# + a last step of 1 pair (3 queries): 109 of 110.
SHORT = {"square": (lambda: Square(n_queries=60), 60),
         "nes": (lambda: NES(n_queries=110, samples=10), 109),
         "spsa": (lambda: SPSA(n_queries=110, samples=10), 109)}


@pytest.fixture(scope="module")
def batch(digits_tensors):
    _, _, x, y = digits_tensors
    return x[:100], y[:100]


@pytest.mark.parametrize("name", sorted(SHORT))
@pytest.mark.parametrize("norm", ["linf", "l2"])
def test_queries_are_counted_exactly_per_sample_and_stay_within_the_budget(name: str, norm: str, tiny_model,
                                                                            batch) -> None:
    x, y = batch
    stub = CountingModel(tiny_model, x)
    oracle = ScoreOracle(stub, len(y))
    make, spent = SHORT[name]
    attack = make()
    res = attack(oracle, x, y, eps=torch.full((len(y),), BUDGETS[norm] / 2), norm=norm)
    assert torch.equal(oracle.queries, stub.seen), "the oracle counts every row the model saw, per sample"
    assert (oracle.queries <= attack.n_queries).all()
    assert torch.equal(oracle.queries[~res.success], torch.full_like(oracle.queries[~res.success], spent)), \
        "a robust sample spends all the steps the budget pays for"
    assert torch.equal(oracle.queries[res.success], res.first_success[res.success]), \
        "a broken sample stops at the query that broke it, and first_success is that count"
    assert res.success.any() and (~res.success).any()
    assert not stub.autograd_reachable


def test_the_score_oracle_gives_no_gradient_path(tiny_model, batch) -> None:
    x, _ = batch
    oracle = ScoreOracle(tiny_model, len(x))
    logits = oracle.logits(x.clone().requires_grad_(True), torch.arange(len(x)))
    assert logits.grad_fn is None and not logits.requires_grad
    assert not hasattr(oracle, "value_and_grad") and not hasattr(oracle, "loss_grad")


@pytest.mark.parametrize("cls", [Square, NES, SPSA])
@pytest.mark.parametrize("norm", ["linf", "l2"])
def test_deterministic_under_a_seed_and_independent_of_batch_size(cls, norm: str, tiny_model, batch) -> None:
    x, y = batch
    eps = torch.full((len(y),), BUDGETS[norm] / 2)
    kw = {"n_queries": 40} if cls is Square else {"n_queries": 64, "samples": 5}
    run = lambda seed, rows: cls(seed=seed, **kw)(  # noqa: E731
        ScoreOracle(tiny_model, len(rows)), x[rows], y[rows], eps=eps[rows], norm=norm, sample_id=rows)
    assert_seeded_and_batch_independent(run, len(y), (3, 57))


@pytest.mark.parametrize("norm", ["linf", "l2"])
def test_square_breaks_the_natural_digits_model_within_a_small_budget(norm: str, tiny_model, batch) -> None:
    x, y = batch
    clean = float((tiny_model(x).argmax(1) == y).float().mean())
    res = Square(n_queries=300)(ScoreOracle(tiny_model, len(y)), x, y, eps=torch.full((len(y),), BUDGETS[norm]),
                                norm=norm)
    robust = float((~res.success).float().mean())
    assert robust < clean - 0.25, f"robust accuracy {robust:.2f} vs clean {clean:.2f}"


@pytest.mark.parametrize("cls", [NES, SPSA])
@pytest.mark.parametrize("norm", ["linf", "l2"])
def test_gradient_estimates_break_the_natural_digits_model_within_a_small_budget(cls, norm: str, tiny_model,
                                                                                 batch) -> None:
    x, y = batch
    clean = float((tiny_model(x).argmax(1) == y).float().mean())
    res = cls(n_queries=821, samples=20)(ScoreOracle(tiny_model, len(y)), x, y,
                                         eps=torch.full((len(y),), BUDGETS[norm]), norm=norm)
    robust = float((~res.success).float().mean())
    assert robust < clean - 0.2, f"robust accuracy {robust:.2f} vs clean {clean:.2f}"  # ℓ∞ 0.76/0.74, ℓ2 far lower


def test_p_schedule_is_the_authors_scaled_to_the_budget() -> None:
    assert p_schedule(0.8, 0, 10000) == 0.8 and p_schedule(0.8, 11, 10000) == 0.4
    assert p_schedule(0.8, 9999, 10000) == 0.8 / 512 and p_schedule(0.8, 5, 500) == 0.8 / 4  # scaled to the budget


def test_engine_search_with_query_probes(tiny_model, batch) -> None:
    """Through the engine under a score threat: min-ε search by query-budgeted probes, queries recorded."""
    x, y = (t[:24] for t in batch)
    threat = ThreatModel(norm="linf", goal="untargeted", eps=0.1, knowledge="score")
    attack = Square(n_queries=50)
    out = evaluate_batch(attack, tiny_model, x, y, None, threat, SearchSettings(resolution=0.1, max_probes=3))
    assert torch.equal(out["success_at_budget"], out["min_eps"] <= 0.1)
    assert (out["queries"] >= 1).all() and (out["grad_evals"] == 0).all()
    assert (out["queries"] > 50).any(), "the search's probes are paid in queries too"
    won = out["success_at_budget"]
    assert won.any() and (out["first_success_strength"][won] <= 50).all()


def test_score_threat_presets_run_square_via_run_main(tmp_path, trained_digits_cache, monkeypatch) -> None:
    from advbench.cli.spec_builder import run_main

    monkeypatch.setenv("ADVBENCH_CACHE", str(trained_digits_cache))
    overrides = ["attack=square", "attack.params.n_queries=100", "threat=linf_score", "dataset.n_samples=32",
                 "search.max_probes=2", "defense.recipe.epochs=4", f"out_dir={tmp_path}"]
    frame = pd.read_parquet(run_main(compose_config("config", overrides)))
    assert set(frame["knowledge"]) == {"score"} and (frame["strength_budget"] == 100).all()
    assert (frame["queries"] >= 1).all() and (frame["grad_evals"] == 0).all()
    assert (frame["adv_pred"] == frame["label"]).mean() < frame["clean_correct"].mean()


@pytest.mark.slow
@pytest.mark.parametrize("norm", ["linf", "l2"])
def test_square_at_least_as_strong_as_torchattacks(norm: str, tiny_model, digits_tensors) -> None:
    """Same model, samples and queries per sample (torchattacks spends one more than its n_queries),
    robust accuracy averaged over three seeds: advbench ≤ torchattacks + 2 points."""
    torchattacks = pytest.importorskip("torchattacks")
    _, _, x, y = digits_tensors
    eps, queries, seeds = BUDGETS[norm], 500, range(3)
    peer = [float((tiny_model(torchattacks.Square(tiny_model, norm=norm.capitalize(), eps=eps, n_queries=queries - 1,
                                                   p_init=0.8, seed=s)(x, y)).argmax(1) == y).float().mean())
            for s in seeds]
    ours = [float((~Square(n_queries=queries, seed=s)(ScoreOracle(tiny_model, len(y)), x, y,
                                                       eps=torch.full((len(y),), eps), norm=norm).success).float().mean())
            for s in seeds]
    assert sum(ours) / 3 <= sum(peer) / 3 + 0.02, f"advbench {ours} vs torchattacks {peer}"


def test_bench_script_times_square_batched_and_one_at_a_time_on_equal_work(tmp_path) -> None:
    """Both rows pay the same queries (no sample breaks at the bench's ε), so queries/s compare."""
    from test_crosscheck import assert_batched_and_single_rows_do_equal_work

    assert_batched_and_single_rows_do_equal_work(tmp_path, ["--score", "--score-queries", "5"], ["Square-5"], 5)
