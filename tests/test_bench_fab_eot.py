"""scripts/bench_fab_eot.py at a tiny size: the judged rows hold both sides at equal gradient passes
and the time advbench spent in its votes apart, within its own time; the oracles' vote is restored
after the run. No timing is asserted."""

from __future__ import annotations

import importlib
import json
import math
from pathlib import Path

import pytest

from advbench.robustness.attacks import oracles

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_judged_rows_time_the_vote_apart(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.syspath_prepend(str(SCRIPTS))
    bench, vote, out = importlib.import_module("bench_fab_eot"), oracles.vote, tmp_path / "judged.json"
    assert bench.main(["--what", "judged", "--batches", "8", "--rounds", "2", "--warmup", "0", "--eot", "2",
                       "--threads", "1", "--out", str(out)]) == 0
    assert oracles.vote is vote
    rows = json.loads(out.read_text())["rows"]
    assert sorted(rows) == sorted(f"batch 8: PGD-10 EOT-{p}, {m}, vote of 20" for p in (2, 1)
                                  for m in ("random_resize_pad", "dropout"))
    for row in rows.values():
        votes, ours = row["advbench_votes_s"]["times"], row["advbench"]["times"]
        assert len(votes) == len(ours) == len(row["torchattacks"]["times"]) == 2
        assert all(0 < v < t for v, t in zip(votes, ours)), "ε∞ 0.2 breaks digits, so every run votes"
        assert math.isfinite(row["advbench_without_votes_over_peer"]) and row["advbench_without_votes_over_peer"] > 0
