"""A randomized row's worst case re-judged: the union of the attacks' votes leans low, so the report
judges each sample's worst example again by the fresh vote its cell recorded (`recheck_fraction`),
worked by hand on five samples; the engine records that vote on later draws than the first, for
randomized models only; records without it get a line saying so, never a number."""

from __future__ import annotations

import pandas as pd
import pyarrow as pa
import pytest
import torch
from audit_records import cell, records
from torch import nn

import advbench
from advbench.core.errors import AdvbenchWarning
from advbench.core.records import write_table
from advbench.core.resume import ChunkStore, python_warnings
from advbench.core.sample_draws import normal
from advbench.robustness.attacks.gradient import BIM
from advbench.robustness.attacks.model_draws import draw_keys
from advbench.robustness.audit.audit import audit
from advbench.robustness.audit.card import card, verdict_lines
from advbench.robustness.audit.html import page
from advbench.robustness.evaluation.measure import evaluate_batch
from advbench.robustness.specs import SearchSettings
from advbench.robustness.threat import ThreatModel

RANDOM = {"defense": "rp", "grad_mode": "eot", "judge_draws": 20, "flag_randomized": True}


def votes(first_bim: list[float], first_square: list[float], fresh_bim: list[float] | None,
          fresh_square: list[float] | None) -> pd.DataFrame:
    """Five samples at ε = 0.2: BIM breaks 0 and 2, Square 1 and 2, none 3 and 4 (the union leaves 40 %
    robust); each cell's first and fresh votes as given (no `recheck_fraction` where None)."""
    cells = []
    for name, eps, first, fresh in (("bim", [0.1, 0.3, 0.1, 0.3, 0.3], first_bim, fresh_bim),
                                    ("square", [0.3, 0.1, 0.1, 0.3, 0.3], first_square, fresh_square)):
        one = cell(name, eps, knowledge="white" if name == "bim" else "score", **RANDOM).assign(adv_fraction=first)
        cells.append(one if fresh is None else one.assign(recheck_fraction=fresh))
    return records(*cells)


FIRST_BIM, FIRST_SQUARE = [0.6, 0.3, 0.9, 0.4, 0.1], [0.2, 0.55, 0.7, 0.45, 0.2]
# The picks, by the first votes: 0 BIM (the one that broke it), 1 Square (likewise), 2 BIM (0.9 > 0.7 of the two
# that broke it), 3 Square (0.45 > 0.4, none broke it), 4 Square (0.2 > 0.1). Their fresh votes: 0.4, 0.6, 0.8,
# 0.3, 0.1, so broken 1 and 2 only: 60 % robust; the union (0, 1, 2 broken) agrees on 1-4, 4 of 5. The fresh
# votes not picked say the opposite, so a wrong pick moves the number.
FRESH_BIM, FRESH_SQUARE = [0.4, 0.9, 0.8, 0.9, 0.9], [0.9, 0.6, 0.3, 0.3, 0.1]


def test_the_worst_example_is_picked_by_the_first_votes_and_judged_by_the_fresh_one() -> None:
    threat, = audit(votes(FIRST_BIM, FIRST_SQUARE, FRESH_BIM, FRESH_SQUARE))[0].threats
    assert threat.case.robust_at_budget == pytest.approx(0.4, rel=1e-12)
    judged = threat.rejudged
    assert (judged.union, judged.rejudged, judged.agreement) == (pytest.approx(0.4, rel=1e-12),
                                                                 pytest.approx(0.6, rel=1e-12),
                                                                 pytest.approx(0.8, rel=1e-12))
    assert judged.line == ("linf untargeted ε=0.2: 60.0% robust accuracy re-judged by a fresh vote (20 passes) on each "
                           "sample's worst example, 40.0% robust accuracy by the union of the attacks' votes; they "
                           "agree on 80.0% of 5 samples.")
    report = card(audit(votes(FIRST_BIM, FIRST_SQUARE, FRESH_BIM, FRESH_SQUARE)), [])
    entry = report["models"][0]["threats"][0]["rejudged"]
    assert entry["rejudged"] == pytest.approx(0.6, rel=1e-12) and entry["line"] == judged.line
    assert verdict_lines(report)[1] == f"rp · {judged.line}"
    assert "re-judged by a fresh vote (20 passes)" in page(report, {"rp": [""]})


def test_records_without_the_fresh_vote_are_said_to_lack_it() -> None:
    for fresh_square in (None, FRESH_SQUARE):  # no cell has it; one cell lacks it
        judged = audit(votes(FIRST_BIM, FIRST_SQUARE, None, fresh_square))[0].threats[0].rejudged
        assert (judged.union, judged.rejudged, judged.agreement) == (pytest.approx(0.4, rel=1e-12), None, None)
        assert "not re-judged: no fresh vote is recorded" in judged.line and "%" in judged.line.split(",")[0]
    without_first = votes(FIRST_BIM, FIRST_SQUARE, FRESH_BIM, FRESH_SQUARE).drop(columns="adv_fraction")
    assert audit(without_first)[0].threats[0].rejudged.rejudged is None, "nothing to pick the worst example by"


def test_a_deterministic_row_is_not_re_judged() -> None:
    frame = records(cell("bim", [0.1, 0.3, 0.3]), cell("square", [0.3, 0.1, 0.3], knowledge="score"))
    threat, = audit(frame)[0].threats
    assert threat.rejudged is None
    report = card(audit(frame), [])
    assert report["models"][0]["threats"][0]["rejudged"] is None and len(verdict_lines(report)) == 1


SIGMA = 0.3


class KeyedNoise(nn.Module):
    """A digits net behind Gaussian input noise (σ 0.3) drawn per row from the engine's keys, which it keeps
    (torch's generator on a direct call)."""

    bounds, randomized, keyed_draws, grad_mode, eot_samples = (0.0, 1.0), True, True, "eot", 2

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net, self.keys = net, []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        keys = draw_keys()
        if keys is None:  # a direct call (the checks before a cell): torch's generator
            return self.net(x + SIGMA * torch.randn_like(x))
        self.keys.append(keys.clone())
        return self.net(x + SIGMA * normal(0, keys, tuple(x.shape[1:]), 0).to(x.dtype))


def test_the_engine_records_a_fresh_vote_for_a_randomized_model_only(tiny_model, digits_tensors) -> None:
    _, _, x, y = digits_tensors
    x, y = x[:32], y[:32]
    threat = ThreatModel(norm="linf", goal="untargeted", knowledge="white", eps=0.1)
    noisy = KeyedNoise(tiny_model)
    out = evaluate_batch(BIM(steps=3), noisy, x, y, None, threat, SearchSettings(enabled=False), draws=5,
                         sample_id=torch.arange(32) + 500)
    fresh, first = out["recheck_fraction"], out["adv_fraction"]
    assert fresh.shape == (32,) and bool(((fresh >= 0) & (fresh <= 1)).all())
    assert bool((fresh != first).any()), "a second vote on other draws"
    keys = torch.cat(noisy.keys)
    assert keys.unique().numel() == keys.numel(), "no pass of the cell, the fresh vote's included, repeats a draw"
    plain = evaluate_batch(BIM(steps=3), tiny_model, x, y, None, threat, SearchSettings(enabled=False))
    assert "recheck_fraction" not in plain


def test_a_randomized_cells_records_carry_the_fresh_vote_and_the_report_reads_it(tiny_model, digits_tensors,
                                                                                 tmp_path) -> None:
    _, _, x, y = digits_tensors
    part = advbench.evaluate(advbench.Model(KeyedNoise(tiny_model), randomized=True, eot_samples=2, label="noisy"),
                             (x[:32], y[:32]), attack="bim", attack_params={"steps": 3}, eps=0.1, out_dir=str(tmp_path),
                             overrides=["search.enabled=false", "judge.draws=5"])
    assert part["recheck_fraction"].between(0, 1).all() and (part["recheck_fraction"] != part["adv_fraction"]).any()
    judged = audit(part)[0].threats[0].rejudged
    assert 0 <= judged.rejudged <= 1 and 0 <= judged.agreement <= 1
    broken = ~part["clean_correct"].to_numpy(bool) | part["success_at_budget"].to_numpy(bool)
    assert judged.union == pytest.approx(1 - broken.mean(), rel=1e-12)
    assert judged.agreement == pytest.approx(float(((part["recheck_fraction"] >= 0.5) == broken).mean()), rel=1e-12)


def test_a_resumed_cell_drops_chunks_written_without_the_fresh_vote(tmp_path) -> None:
    """The fresh vote adds no key entry (the first vote is drawn as before), so a run resumed over chunks
    written before it computes their samples again, saying so, rather than write a part half without it."""
    ids = [10, 11, 12, 13]
    folder = tmp_path / "records" / ".partial" / "cell"
    folder.mkdir(parents=True)
    row = {"cell_key": "k", "advbench_version": "v", "adv_fraction": 0.5}
    write_table(pa.Table.from_pandas(pd.DataFrame({"sample_id": [10, 11], **row})), folder / "chunk-000000-00002.parquet")
    store = ChunkStore(folder, "k", "v", ids)
    assert store.load() == 2 and store.missing() == [2, 3]
    with python_warnings(), pytest.warns(AdvbenchWarning, match="its columns differ from this version's"):
        store.add(pd.DataFrame({"sample_id": [12, 13], **row, "recheck_fraction": 0.4}))
    assert store.missing() == [0, 1]
    store.add(pd.DataFrame({"sample_id": [10, 11], **row, "recheck_fraction": 0.6}))
    assert store.merged()["recheck_fraction"].notna().all()
