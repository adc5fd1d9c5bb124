"""A randomized defense's records do not depend on the batch, the chunk or a resume.

Its noise is drawn per row by (seed, sample id, how many passes that sample has been through),
so a sample attacked in another batch, in another chunk or in a resumed process meets the same
draws; before, the wrapper's pass counter restarted with each process and ran on across batches.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import torch
from hydra.utils import instantiate

from advbench.cli.config import compose_config
from advbench.cli.spec_builder import cell_spec, run_main
from advbench.robustness.attacks.gradient import BIM
from advbench.robustness.attacks.model_draws import RowCalls, call_keys
from advbench.robustness.attacks.score import Square
from advbench.robustness.defenses.wrappers import wrap, wrapper_spec
from advbench.robustness.evaluation import cell
from advbench.robustness.evaluation.measure import evaluate_batch
from advbench.robustness.specs import SearchSettings
from advbench.robustness.threat import ThreatModel

pytestmark = pytest.mark.usefixtures("one_thread")

RSE = {"type": "rse", "init_noise": 0.2, "inner_noise": 0.1, "ensemble": 2, "eot_samples": 2}
RP = {"type": "random_resize_pad", "rate": 0.5, "eot_samples": 2}
VOLATILE = ["seconds", "run_id", "created_at"]


def test_row_calls_count_each_samples_passes_whatever_its_companions() -> None:
    calls = RowCalls(torch.tensor([7, 3, 9]))
    first = calls.take(torch.tensor([0, 2, 2, 1]))        # sample 9 twice: two call indices
    assert torch.equal(first, call_keys(torch.tensor([7, 9, 9, 3]), torch.tensor([0, 0, 1, 0])))
    second = calls.take(torch.tensor([2, 0]))
    assert torch.equal(second, call_keys(torch.tensor([9, 7]), torch.tensor([2, 1])))
    assert calls.count.tolist() == [2, 1, 3]


def records(attack, spec: dict, x: torch.Tensor, y: torch.Tensor, ids: torch.Tensor, model, threat, search,
            batches: list[slice]) -> pd.DataFrame:
    """The batch records of rows `ids`, evaluated in the given batches by one wrapper (as a cell does)."""
    wrapped = wrap(model, wrapper_spec(spec), seed=1)
    frames = []
    for part in batches:
        out = evaluate_batch(attack, wrapped, x[part], y[part], None, threat, search, sample_id=ids[part])
        frames.append(pd.DataFrame({k: v.numpy() for k, v in out.items() if isinstance(v, torch.Tensor)})
                      .assign(sample_id=ids[part].numpy()))
    return pd.concat(frames).sort_values("sample_id").reset_index(drop=True)


@pytest.mark.parametrize("spec, attack, knowledge", [(RSE, Square(n_queries=30, seed=2), "score"),
                                                     (RP, BIM(steps=3), "white")], ids=["rse-square", "rp-bim"])
def test_the_same_rows_in_other_batches_give_the_same_records(tiny_model, digits_tensors, spec, attack,
                                                              knowledge) -> None:
    x, y = digits_tensors[2][:12], digits_tensors[3][:12]
    ids = torch.arange(100, 112)
    threat = ThreatModel(norm="linf", goal="untargeted", knowledge=knowledge, eps=0.15)
    search = SearchSettings(enabled=True, resolution=0.25, max_probes=2)
    whole = records(attack, spec, x, y, ids, tiny_model, threat, search, [slice(0, 12)])
    order = torch.tensor([11, 4, 0, 7, 2, 9, 5, 1, 10, 3, 8, 6])     # other companions, other positions
    split = records(attack, spec, x[order], y[order], ids[order], tiny_model, threat, search,
                    [slice(0, 5), slice(5, 7), slice(7, 12)])
    pd.testing.assert_frame_equal(split, whole)
    assert whole["queries"].gt(0).all()


def test_a_direct_call_still_draws_anew_on_every_pass(tiny_model, digits_tensors) -> None:
    x = digits_tensors[2][:4]
    for spec in (RSE, RP):
        model = wrap(tiny_model, wrapper_spec(spec), seed=1)
        assert not torch.equal(model(x), model(x)), spec


class GlobalNoise(torch.nn.Module):
    """A user's randomized model: noise from torch's global generator, which no key reaches."""

    bounds = (0.0, 1.0)
    randomized = True

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x + 0.2 * torch.randn_like(x))


def test_a_model_on_torchs_generator_repeats_a_batch_whatever_the_generator_held(tiny_model, digits_tensors) -> None:
    """Not row by row (the generator draws for the whole call), but a rerun of a batch, as a resume
    reruns its chunk's batches, gives the same records: each pass seeds the generator from its keys."""
    x, y = digits_tensors[2][:8], digits_tensors[3][:8]
    threat = ThreatModel(norm="linf", goal="untargeted", knowledge="white", eps=0.15)
    search = SearchSettings(enabled=False)
    runs = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        out = evaluate_batch(BIM(steps=2), GlobalNoise(tiny_model), x, y, None, threat, search, draws=5)
        runs.append(out)
    for column in ("clean_pred", "adv_pred", "adv_fraction", "dist_linf"):
        assert torch.equal(runs[0][column], runs[1][column]), column


@pytest.fixture(autouse=True)
def _cache(trained_digits_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ADVBENCH_CACHE", str(trained_digits_cache))


# R&P in front of the conftest's cached natural small_cnn, or RSE's wrapper in its place: no training.
CELLS = {
    "rp": ["defense=rp", "defense.wrapper.eot_samples=2", "defense.wrapper.rate=0.5"],
    "rse": ["defense=rp", "defense.wrapper.type=rse", "~defense.wrapper.rate", "defense.wrapper.eot_samples=2",
            "+defense.wrapper.ensemble=2"],
}
BASE = ["experiment=smoke", "attack=bim", "attack.params.steps=3", "defense.recipe.epochs=4", "threads=1",
        "dataset.n_samples=12", "batch_size=4", "search.max_probes=2", "judge.draws=3"]


def run(kind: str, out: Path, *extra: str) -> Path:
    return run_main(compose_config("config", [*BASE, *CELLS[kind], f"out_dir={out}", *extra]))


@pytest.mark.parametrize("kind", list(CELLS))
def test_a_resumed_randomized_cell_equals_an_uninterrupted_run(kind: str, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The first chunk in one process (killed before the second), the rest in a fresh one."""
    reference = pd.read_parquet(run(kind, tmp_path / "whole", "chunk_size=12"))
    real, calls = cell.evaluate_batch, {"n": 0}

    def dying(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] > 1:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(cell, "evaluate_batch", dying)
    with pytest.raises(KeyboardInterrupt):
        run(kind, tmp_path / "resumed", "chunk_size=4")
    calls["n"] = -100
    resumed = pd.read_parquet(run(kind, tmp_path / "resumed", "chunk_size=8", "batch_size=3"))
    assert calls["n"] == -100 + 1, "the first chunk is reused, the other 8 rows run in one pool (calls of 3)"
    assert len(resumed) == 12 and resumed["grad_mode"].eq("eot").all()
    pd.testing.assert_frame_equal(resumed.drop(columns=VOLATILE), reference.drop(columns=VOLATILE))


def test_randomized_cells_name_their_noise_deterministic_ones_keep_their_keys() -> None:
    def identity(*overrides: str) -> dict:
        cfg = compose_config("config", list(overrides))
        return cell.cell_identity(cell_spec(cfg), cell.build_threat(cell_spec(cfg), dict(cfg.dataset.budgets)),
                                  instantiate(cfg.attack.params))

    assert identity("defense=rp")["noise"] == "counter-v1"
    assert identity("defense=rse")["noise"] == "counter-v1"
    assert identity("model=python", "model.target=my_net:Noisy", "model.randomized=true")["noise"] == "counter-v1"
    assert "noise" not in identity("model=python", "model.target=my_net:Net")
    assert "noise" not in identity("defense=natural") and "noise" not in identity("defense=jpeg")
