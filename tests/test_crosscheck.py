"""Cross-check of FGSM/BIM/PGD/MIM against torchattacks 3.5.1 on the same model and samples.

Both sides get identical ε, step size (ours: rel_stepsize·ε), steps, momentum and random start,
so every sample follows the same trajectory on both sides until our loop stops it. The one
intended difference: our loop returns the FIRST adversarial iterate of a sample (early stop),
torchattacks returns the LAST iterate. A sample torchattacks ends adversarial on was therefore
adversarial at some iterate we checked too, so our broken set contains theirs and our robust
accuracy can only be lower; it differs by the samples that torchattacks breaks and then loses
again. On the whole digits test split (~500 samples, 1pp ≈ 5 samples) we require:

* robust accuracy within 1 percentage point;
* at most one sample broken by torchattacks but not by us (slack for float rounding only);
* on samples we never break, the returned example equals torchattacks' last iterate (the
  attacks are the same map), for at least 98% of them (slack for sign flips of gradient
  components that round to ~0 differently at another batch size).

Definitions that had to be aligned, checked against torchattacks' source:

* BIM: torchattacks clamps to [max(x−ε, 0), x+ε] then to ≤ 1, which is our Π_ε then clip.
* MIFGSM: g ← μ·g + ∇/mean|∇|; mean|∇| = ‖∇‖₁/d, so its momentum is d times ours and
  sign(g) is the same.
* PGD ℓ∞: torchattacks draws `torch.empty_like(x).uniform_(-ε, ε)` from the global generator,
  ours draws per sample from (seed, sample_id); the test hands torchattacks our draw in place
  of its own, so both start from the bit-identical point.
* PGDL2: it averages the loss over the batch and divides the gradient by ‖∇‖₂ + 1e-10, so on
  confident samples (tiny gradients, shrunk again by 1/N) that constant shortens the step;
  `eps_for_division=1e-30` makes it the plain g/‖g‖₂ step. Its random start draws the radius
  uniformly in [0, ε] while ours is uniform in the ℓ2 ball (radius ε·u^(1/d)); no seed
  aligns the two, so ℓ2 is compared without a random start (PGD's step size, BIM's loop).
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest
import torch
import torchattacks
from torch import nn

from advbench.core.sample_draws import uniform
from advbench.robustness.attacks.gradient import (
    BIM,
    FGSM,
    MIM,
    PGD,
    IterativeGradientAttack,
)
from advbench.robustness.attacks.oracles import WhiteBoxOracle

pytestmark = pytest.mark.slow

# Budgets that leave robust accuracy near 50% on the tiny digits model, where a definitional
# mismatch moves the number most.
EPS = {"linf": 0.1, "l2": 0.5}
SEED = 5
NEAR_ZERO = 1e-30


@dataclass(frozen=True)
class Case:
    """Our attack, and torchattacks' built from the model, ε and our attack's parameters."""

    ours: IterativeGradientAttack
    theirs: Callable[[nn.Module, float, IterativeGradientAttack], torchattacks.attack.Attack]
    norm: str


CASES = {
    "fgsm-linf": Case(FGSM(), lambda m, e, a: torchattacks.FGSM(m, eps=e), "linf"),
    "bim-linf": Case(BIM(), lambda m, e, a: torchattacks.BIM(m, eps=e, alpha=a.rel_stepsize * e, steps=a.steps), "linf"),
    "mim-linf": Case(MIM(), lambda m, e, a: torchattacks.MIFGSM(
        m, eps=e, alpha=a.rel_stepsize * e, steps=a.steps, decay=a.decay), "linf"),
    "pgd-linf": Case(PGD(seed=SEED), lambda m, e, a: torchattacks.PGD(
        m, eps=e, alpha=a.rel_stepsize * e, steps=a.steps, random_start=True), "linf"),
    "fgm-l2": Case(FGSM(), lambda m, e, a: torchattacks.PGDL2(
        m, eps=e, alpha=e, steps=1, random_start=False, eps_for_division=NEAR_ZERO), "l2"),
    "pgd-l2-no-start": Case(BIM(rel_stepsize=PGD().rel_stepsize), lambda m, e, a: torchattacks.PGDL2(
        m, eps=e, alpha=a.rel_stepsize * e, steps=a.steps, random_start=False, eps_for_division=NEAR_ZERO), "l2"),
}


class _Drawn:
    """Stands in for torchattacks' `torch.empty_like(x)`: its `uniform_` yields our draw."""

    def __init__(self, delta: torch.Tensor) -> None:
        self.delta = delta

    def uniform_(self, low: float, high: float) -> torch.Tensor:
        return self.delta


def predict(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return model(x).argmax(dim=1)


@pytest.mark.parametrize("name", list(CASES))
def test_matches_torchattacks(name: str, tiny_model, digits_tensors, monkeypatch) -> None:
    case = CASES[name]
    _, _, x, y = digits_tensors
    eps = EPS[case.norm]
    ours = case.ours(WhiteBoxOracle(tiny_model, len(y)), x, y, eps=torch.full((len(y),), eps), norm=case.norm)
    if getattr(case.ours, "random_init", False):
        delta = (uniform(SEED, torch.arange(len(y)), tuple(x.shape[1:]), 0) * 2 - 1) * eps
        monkeypatch.setattr(torch, "empty_like", lambda _: _Drawn(delta))
    theirs_x = case.theirs(tiny_model, eps, case.ours)(x, y)
    monkeypatch.undo()

    ours_broken = predict(tiny_model, ours.x_adv) != y
    theirs_broken = predict(tiny_model, theirs_x) != y
    ours_acc, theirs_acc = 1 - ours_broken.float().mean().item(), 1 - theirs_broken.float().mean().item()
    assert 0.2 < theirs_acc < 0.8, f"budget should leave accuracy mid-range, got {theirs_acc:.3f}"
    assert abs(ours_acc - theirs_acc) <= 0.01, f"robust accuracy ours {ours_acc:.4f} vs torchattacks {theirs_acc:.4f}"
    assert int((theirs_broken & ~ours_broken).sum()) <= 1, "torchattacks broke samples our loop missed"

    never = ~ours.success
    gap = (ours.x_adv[never] - theirs_x[never]).flatten(1).abs().amax(dim=1)
    assert (gap <= 1e-5).float().mean() >= 0.98, f"trajectories differ: max gap {gap.max():.3g} on unbroken samples"


def load_bench() -> ModuleType:
    """scripts/ is not a package; load the benchmark script as a module."""
    path = Path(__file__).resolve().parents[1] / "scripts" / "bench_attacks.py"
    spec = importlib.util.spec_from_file_location("bench_attacks", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def assert_batched_and_single_rows_do_equal_work(tmp_path: Path, mode: list[str], names: list[str],
                                                 queries: int) -> None:
    """Run the bench script on 4 small_cnn samples in a query-attack `mode`; each attack's batched
    and one-at-a-time rows must pay the same queries (4 x `queries`), so their queries/s compare."""
    out = tmp_path / "bench.json"
    args = ["--model", "small_cnn", "--batch", "4", "--iters", "1", "--repeats", "1", "--warmup", "0",
            "--device", "cpu", *mode, "--out", str(out)]
    assert load_bench().main(args) == 0
    rows = json.loads(out.read_text())["rows"]
    for name in names:
        batched, single = rows[f"advbench {name} batched"], rows[f"advbench {name} one sample at a time"]
        assert batched["queries"] == single["queries"] == 4 * queries
        assert batched["queries_per_s"] > 0 and single["queries_per_s"] > 0


def test_bench_script_compares_on_equal_work(tmp_path: Path) -> None:
    """The cost benchmark runs end to end on a tiny WRN and its figures are comparable.

    Our per-iteration figure is only fair if no sample left the active set, and the search
    figures only mean something if the search did work beyond the fixed-budget run.
    """
    out = tmp_path / "bench.json"
    args = ["--model", "wrn34_10", "--depth", "10", "--width", "1", "--batch", "6", "--iters", "3",
            "--repeats", "1", "--warmup", "0", "--device", "cpu", "--out", str(out)]
    assert load_bench().main(args) == 0
    result = json.loads(out.read_text())
    rows, search = result["rows"], result["search"]
    assert rows["advbench BIM-3"]["grad_evals"] == 6 * 3
    assert rows["advbench BIM-3"]["note"].startswith("100%")
    assert {"forward+backward (limit)", "torchattacks PGD-3"} <= set(rows)
    assert all(row["x_limit"] > 0 for row in rows.values() if "x_limit" in row)
    curves = {k.split("=")[-1].split(" ")[0]: v for k, v in search["curves"].items()}
    assert curves["margin"]["grad_evals"] > curves["fixed"]["grad_evals"] > 0
    assert curves["bisect"]["grad_evals"] > curves["fixed"]["grad_evals"]
    assert 0 < search["forward_vs_forward_backward"] and rows["forward only"]["grad_evals"] == 0
    assert result["input_shape"] == [6, 3, 32, 32]


def test_bench_script_reports_a_missing_device(tmp_path: Path, capsys) -> None:
    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA")
    assert load_bench().main(["--model", "small_cnn", "--device", "cuda", "--out", str(tmp_path / "b.json")]) == 1
    assert capsys.readouterr().err.startswith("error: device 'cuda' requested")
