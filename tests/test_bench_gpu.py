"""scripts/bench_gpu.py, the GPU throughput bench, run on the CPU at its tiny size so that it cannot rot
before a device runs it: one JSON holding the limit and every attack beside its peer in each dtype
asked for, every figure finite and positive, both sides of a pair at the same iteration count, and
a failing side recorded with its error instead of stopping the run. No timing is asserted. The
first test runs the command as documented, in a fresh interpreter; the others call its `main`."""

from __future__ import annotations

import importlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
PEERS = {"pgd": "torchattacks PGD", "apgd": "torchattacks APGD", "fab": "torchattacks FAB",
         "square": "torchattacks Square", "autoattack": "original AutoAttack"}

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """The script as a module (scripts/ is not a package; it imports its neighbour bench_attacks)."""
    monkeypatch.syspath_prepend(str(SCRIPTS))
    return importlib.import_module("bench_gpu")


def run(bench: ModuleType, tmp_path: Path, *flags: str) -> dict[str, Any]:
    out = tmp_path / "bench_gpu.json"
    assert bench.main(["--device", "cpu", "--tiny", *flags, "--out", str(out)]) == 0
    return json.loads(out.read_text())


def assert_figures(row: dict[str, Any], batch: int) -> None:
    """Every figure of a timed row is a finite positive number, and they agree with each other."""
    assert "error" not in row, row.get("error")
    numbers = [row["seconds"], row["samples_per_s"], row["per_iter_s"], row["x_forward_backward"], *row["times"]]
    assert all(isinstance(v, float) and math.isfinite(v) and v > 0 for v in numbers), row
    assert row["iterations"] >= 1
    assert row["samples_per_s"] == pytest.approx(batch / row["seconds"], rel=1e-6)
    assert row["per_iter_s"] == pytest.approx(row["seconds"] / row["iterations"], rel=1e-6)


def test_tiny_run_times_every_attack_beside_its_peer(bench: ModuleType, tmp_path: Path) -> None:
    out = tmp_path / "tmp"
    subprocess.run([sys.executable, str(SCRIPTS / "bench_gpu.py"), "--device", "cpu", "--tiny", "--out", str(out)],
                   check=True, capture_output=True, text=True, env=os.environ | {"OMP_NUM_THREADS": "1"})
    result = json.loads(out.read_text())
    batch = result["size"]["batch"]
    assert batch == 8 and result["model"]["weights"] == "random"
    assert result["environment"]["batch"] == batch and result["environment"]["torch"]
    assert "random weights" in result["what"] and math.isfinite(result["wall_s"]) and result["wall_s"] > 0
    assert list(result["dtypes"]) == ["fp32"]
    fp32 = result["dtypes"]["fp32"]
    assert set(fp32["limit"]) == {"forward+backward", "forward"}
    for row in fp32["limit"].values():
        assert_figures(row, batch)
    assert fp32["limit"]["forward+backward"]["x_forward_backward"] == pytest.approx(1.0)
    assert list(fp32["attacks"]) == list(PEERS)
    for name, pair in fp32["attacks"].items():
        assert set(pair["sides"]) == {"advbench", PEERS[name]}
        for row in pair["sides"].values():
            assert_figures(row, batch)
            assert len(row["times"]) == result["size"]["rounds"]
        ours, theirs = pair["sides"]["advbench"], pair["sides"][PEERS[name]]
        assert ours["iterations"] == theirs["iterations"], f"{name}: both sides at the same iteration count"
        assert pair["advbench_over_peer"] == pytest.approx(ours["seconds"] / theirs["seconds"], rel=1e-6)
        assert pair["settings"]
    assert fp32["attacks"]["autoattack"]["settings"]["original module"] in bench.ORIGINAL_AUTOATTACK


def test_bf16_on_the_cpu_runs_through_autocast(bench: ModuleType, tmp_path: Path) -> None:
    result = run(bench, tmp_path, "--dtypes", "bf16", "--attacks", "pgd,square", "--rounds", "1", "--warmup", "0")
    bf16 = result["dtypes"]["bf16"]
    assert list(result["dtypes"]) == ["bf16"] and list(bf16["attacks"]) == ["pgd", "square"]
    for pair in bf16["attacks"].values():
        for row in pair["sides"].values():
            assert_figures(row, 8)


def test_a_failing_peer_is_recorded_not_fatal(bench: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("no bf16 kernels here\nsecond line")

    monkeypatch.setattr(bench.torchattacks, "PGD", refuse)
    result = run(bench, tmp_path, "--attacks", "pgd", "--rounds", "1")
    pair = result["dtypes"]["fp32"]["attacks"]["pgd"]
    assert pair["sides"]["torchattacks PGD"] == {"error": "RuntimeError: no bf16 kernels here"}
    assert_figures(pair["sides"]["advbench"], 8)
    assert "advbench_over_peer" not in pair


def test_the_original_autoattack_is_found_under_either_name(bench: ModuleType, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The authors' repository installs `autoattack`, PyPI `pyautoattack`: the first present is used, a
    missing one is a recorded reason, and a present one that fails on its own import is not skipped."""
    broken = tmp_path / "broken_original"
    broken.mkdir()
    (broken / "__init__.py").write_text("import a_dependency_that_is_not_there\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(bench, "ORIGINAL_AUTOATTACK", ("no_such_original", "json"))
    assert bench.original_autoattack() is json
    monkeypatch.setattr(bench, "ORIGINAL_AUTOATTACK", ("no_such_original", "no_such_either"))
    with pytest.raises(ModuleNotFoundError, match="the original AutoAttack is not installed"):
        bench.original_autoattack()
    monkeypatch.setattr(bench, "ORIGINAL_AUTOATTACK", ("broken_original", "json"))
    with pytest.raises(ModuleNotFoundError, match="a_dependency_that_is_not_there"):
        bench.original_autoattack()


@pytest.mark.parametrize("flags", [["--attacks", "pgd,cw"], ["--dtypes", "fp16"], ["--batch", "0"], ["--attacks", ","]])
def test_bad_options_are_refused_before_anything_runs(bench: ModuleType, tmp_path: Path, flags: list[str],
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        bench.main(["--device", "cpu", "--tiny", *flags, "--out", str(tmp_path / "x.json")])
    assert exc.value.code == 2
    assert "error:" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


@pytest.mark.parametrize("flags", [["--arch", "no_such_net"], ["--device", "cuda"]])
def test_what_the_run_cannot_use_is_a_one_line_error(bench: ModuleType, tmp_path: Path, flags: list[str],
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    if flags[0] == "--device" and torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    assert bench.main(["--device", "cpu", "--tiny", *flags, "--out", str(tmp_path / "x.json")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("Error: ") and err.count("\n") == 1, err
    assert not (tmp_path / "x.json").exists()
