"""Interval bound propagation: sound and exact bounds, the IBP training recipe, the `certified` records column."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pandas as pd
import pytest
import torch
from click.testing import CliRunner
from torch import nn

from advbench.cli.config import compose_config
from advbench.cli.main import main
from advbench.cli.spec_builder import model_spec
from advbench.core.errors import AdvbenchError
from advbench.robustness.attacks.gradient import PGD
from advbench.robustness.data.digits import Digits
from advbench.robustness.defenses.certify import (
    certified,
    certified_column,
    ibp_loss,
    ibp_schedule,
    input_box,
    interval_bounds,
    margin_bounds,
    supports,
)
from advbench.robustness.defenses.recipes import Recipe
from advbench.robustness.defenses.trainer import train_defense
from advbench.robustness.evaluation.measure import evaluate_batch
from advbench.robustness.models import build_model
from advbench.robustness.models.checkpoint_files import load_checkpoint
from advbench.robustness.models.classifier import Classifier
from advbench.robustness.report.table3 import summary_table
from advbench.robustness.specs import SearchSettings
from advbench.robustness.threat import ThreatModel

pytestmark = pytest.mark.usefixtures("one_thread")


def _every_layer() -> Classifier:
    """A net with every layer IBP has a rule for, batch norms in eval mode with non-trivial statistics."""
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
        nn.Sequential(nn.Conv2d(4, 6, 3, padding=1, stride=2), nn.Identity(), nn.ReLU()),
        nn.AvgPool2d(2, stride=1), nn.AdaptiveAvgPool2d(3), nn.Flatten(),
        nn.Linear(54, 12), nn.BatchNorm1d(12), nn.ReLU(), nn.Linear(12, 5),
    )
    for bn in (net[1], net[9]):
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 2.0)
        bn.weight.data.uniform_(-1.5, 1.5)  # negative scales flip the box
        bn.bias.data.uniform_(-0.5, 0.5)
    return Classifier(net, "test", 2, (0.3, 0.6), (0.2, 0.4)).eval()


def test_bounds_contain_the_outputs_of_random_points_in_the_box() -> None:
    model = _every_layer()
    x, y = torch.rand(6, 2, 8, 8), torch.tensor([0, 1, 2, 3, 4, 0])
    lo, hi = input_box(x, 0.05)
    points = lo + (hi - lo) * torch.rand(300, *x.shape)
    points[:2] = torch.stack([lo, hi])  # the corners too
    with torch.no_grad():
        out = model(points.flatten(0, 1)).view(300, 6, 5)
        low, high = interval_bounds(model, lo, hi)
        margins = out.gather(2, y.view(1, -1, 1).expand(300, -1, 1)) - out
        bound = margin_bounds(model, x, y, 0.05)
    assert bool((out >= low - 1e-5).all()) and bool((out <= high + 1e-5).all())
    assert bool((margins >= bound - 1e-5).all())
    assert float((high - low).min()) > 0  # the box is not degenerate


def test_bounds_are_exact_on_a_linear_layer() -> None:
    """For z = Wx + b the extremes lie on corners of the box; IBP finds them exactly."""
    torch.manual_seed(1)
    model = Classifier(nn.Sequential(nn.Flatten(), nn.Linear(6, 3)), "test", 1, (0.5,), (0.25,)).eval()
    x = torch.rand(1, 1, 2, 3)
    lo, hi = input_box(x, 0.1)
    corners = torch.tensor(list(itertools.product([0.0, 1.0], repeat=6))).view(-1, 1, 2, 3)
    with torch.no_grad():
        values = model(lo + (hi - lo) * corners)
        low, high = interval_bounds(model, lo, hi)
    torch.testing.assert_close(low[0], values.min(0).values, rtol=0, atol=1e-5)
    torch.testing.assert_close(high[0], values.max(0).values, rtol=0, atol=1e-5)


def test_bounds_tighten_as_eps_shrinks_and_are_the_point_at_zero() -> None:
    model = _every_layer()
    x, y = torch.rand(4, 2, 8, 8), torch.tensor([0, 1, 2, 3])
    widths = []
    with torch.no_grad():
        for eps in (0.2, 0.1, 0.03, 0.01, 0.0):
            low, high = interval_bounds(model, *input_box(x, eps))
            widths.append(high - low)
        logits = model(x)
        at_zero = margin_bounds(model, x, y, 0.0)
    assert all(bool((wide >= narrow - 1e-6).all()) for wide, narrow in zip(widths, widths[1:]))
    assert float(widths[-2].max()) < float(widths[0].max()) / 5
    torch.testing.assert_close(low, logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(high, logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(at_zero, logits.gather(1, y[:, None]) - logits, rtol=0, atol=1e-5)
    assert torch.equal(certified(model, x, y, 0.0), logits.argmax(1) == y)


def _plain(*layers: nn.Module) -> Classifier:
    return Classifier(nn.Sequential(*layers), "t", 1, (0.0,), (1.0,))


@pytest.mark.parametrize("model, name", [
    (_plain(nn.Flatten(), nn.Linear(4, 3), nn.Tanh()), r"layer 'net\.2' \(Tanh\)"),
    (build_model("resnet56", 10, 3, depth=8), r"layer 'net' \(CifarResNet\)"),
    (nn.Sequential(nn.Flatten(), nn.Linear(4, 3)), r"layer 'model' \(Sequential\)"),
    (_plain(nn.Flatten(), nn.BatchNorm1d(4)).train(), r"'net\.1'.*eval mode"),
], ids=["tanh", "resnet", "bare-sequential", "batchnorm-training"])
def test_an_unsupported_layer_is_a_one_line_error_naming_it(model: nn.Module, name: str) -> None:
    with pytest.raises(AdvbenchError, match=name) as caught:
        interval_bounds(model, torch.zeros(1, 1, 2, 2), torch.ones(1, 1, 2, 2))
    assert "\n" not in str(caught.value)
    assert not supports(model)
    column = certified_column(model, torch.zeros(2, 1, 2, 2), torch.zeros(2, dtype=torch.long), "linf", 0.1)
    assert bool(column.isnan().all())


def test_certified_column_is_nan_for_l2_and_certifies_only_correct_samples() -> None:
    model = _every_layer()
    x = torch.rand(8, 2, 8, 8)
    y = model(x).argmax(1)
    assert bool(certified_column(model, x, y, "l2", 0.1).isnan().all())
    wrong = (y + 1) % 5
    assert float(certified_column(model, x, y, "linf", 0.0).sum()) == 8
    assert float(certified_column(model, x, wrong, "linf", 0.0).sum()) == 0


def test_records_of_a_model_ibp_cannot_bound_hold_nan(tiny_model: nn.Module, digits_tensors) -> None:
    _, _, x, y = digits_tensors
    rec = evaluate_batch(PGD(steps=2), tiny_model, x[:8], y[:8], None, ThreatModel("linf", "untargeted", 0.1),
                         SearchSettings(enabled=False))
    assert bool(rec["certified"].isnan().all())


def test_the_summary_table_shows_certified_accuracy_per_cell() -> None:
    cell = {"dataset": "digits", "attack": "pgd", "norm": "linf", "goal": "untargeted", "knowledge": "white",
            "label": 0, "adv_pred": 0, "clean_correct": True, "success_at_budget": False, "min_eps": 0.3,
            "eps_budget": 0.2}
    frame = pd.DataFrame([{**cell, "defense": "convex", "sample_id": i, "certified": float(i < 3)} for i in range(4)]
                         + [{**cell, "defense": "jpeg", "sample_id": i, "certified": math.nan} for i in range(4)])
    tidy = summary_table(frame).set_index("defense")
    assert tidy.loc["convex", "certified_accuracy"] == 0.75 and math.isnan(tidy.loc["jpeg", "certified_accuracy"])
    assert "certified_accuracy" not in summary_table(frame.drop(columns="certified")).columns


def test_the_schedule_warms_up_then_ramps_eps_and_kappa() -> None:
    recipe = Recipe.from_config({"type": "convex", "epochs": 1, "batch_size": 8, "lr": 0.01, "eps": 0.2,
                                 "kappa": 0.5, "warmup_steps": 10, "rampup_steps": 20})
    assert ibp_schedule(0, recipe) == ibp_schedule(10, recipe) == (0.0, 1.0)
    eps, kappa = ibp_schedule(20, recipe)
    assert eps == pytest.approx(0.1) and kappa == pytest.approx(0.75)
    assert ibp_schedule(30, recipe) == ibp_schedule(500, recipe) == (pytest.approx(0.2), pytest.approx(0.5))


def test_ibp_large_trains_one_step_on_tiny_cifar_sized_data() -> None:
    """Gowal et al.'s large CIFAR-10 model at its real size: one IBP step moves every layer."""
    torch.manual_seed(0)
    model = build_model("ibp_large", 10, 3)
    recipe = Recipe.from_config({**compose_config("train", ["defense=convex"]).defense.recipe,
                                 "eps": 2 / 255, "warmup_steps": 0, "rampup_steps": 1})
    x, y = torch.rand(2, 3, 32, 32), torch.arange(2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    ibp_loss(model, x, y, recipe)  # step 0: ε = 0
    loss = ibp_loss(model, x, y, recipe)  # step 1: the full ε, robust term included
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    changed = {k for k, v in model.state_dict().items() if k.endswith("weight") and not torch.equal(v, before[k])}
    assert changed == {f"net.{i}.weight" for i in (0, 2, 4, 6, 8, 12, 14)} and torch.isfinite(loss)
    assert supports(model.eval())


def test_training_an_unsupported_model_fails_at_the_first_batch(tmp_path: Path) -> None:
    arch = {"_target_": "advbench.robustness.models.build_model", "arch": "resnet56", "depth": 8, "base_width": 2,
            "mean": [0.5], "std": [0.5]}
    recipe = dict(compose_config("train", ["defense=convex"]).defense.recipe)
    with pytest.raises(AdvbenchError, match=r"cannot bound layer 'net' \(CifarResNet\)"):
        train_defense(Digits(n_samples=16), model_spec(arch), Recipe.from_config(recipe), tmp_path / "c.pt", progress=False)
    with pytest.raises(AdvbenchError, match="recipe 'convex' needs eps > 0, 0 <= kappa <= 1"):
        train_defense(Digits(n_samples=16), model_spec({"_target_": "advbench.robustness.models.build_model", "arch": "small_cnn"}),
                      Recipe.from_config({**recipe, "kappa": 1.5}), tmp_path / "c.pt", progress=False)


def test_advbench_train_convex_writes_a_checkpoint_with_meta(tmp_path: Path) -> None:
    args = ["defense=convex", "dataset=digits", "defense.recipe.epochs=2", "defense.recipe.warmup_steps=30",
            "defense.recipe.rampup_steps=10", "defense.recipe.eps=0.05", f"cache_dir={tmp_path}", "threads=1"]
    result = CliRunner().invoke(main, ["train", *args])
    assert result.exit_code == 0, result.output
    (path,) = (tmp_path / "checkpoints" / "digits" / "small_cnn").glob("convex-*.pt")
    meta = load_checkpoint(path, build_model("small_cnn", 10, 1))
    assert meta["recipe"] == "convex" and meta["config"]["recipe"]["kappa"] == 0.5
    assert 0.3 < meta["clean_accuracy"] <= 1.0


@pytest.mark.slow
def test_no_sample_certified_at_eps_is_broken_by_pgd_and_records_agree(tmp_path: Path) -> None:
    """Train a short convex digits model; PGD (50 steps) and four restarts with other seeds
    break no certified sample, and in the records certified accuracy ≤ accuracy under attack."""
    recipe = {**compose_config("train", ["defense=convex"]).defense.recipe, "epochs": 6, "lr": 0.003,
              "eps": 0.1, "warmup_steps": 10, "rampup_steps": 60}
    digits = Digits()
    train_defense(digits, model_spec({"_target_": "advbench.robustness.models.build_model", "arch": "small_cnn"}),
                  Recipe.from_config(recipe),
                  tmp_path / "c.pt", progress=False)
    model = build_model("small_cnn", 10, 1)
    load_checkpoint(tmp_path / "c.pt", model)
    model = model.eval().requires_grad_(False)
    items = [digits.eval_set()[i] for i in range(len(digits.eval_set()))]
    x, y = torch.stack([i[0] for i in items]), torch.tensor([i[1] for i in items])
    ids = torch.tensor([i[2] for i in items])
    threat, search = ThreatModel(norm="linf", goal="untargeted", eps=0.05), SearchSettings(enabled=False)
    rec = evaluate_batch(PGD(steps=50, seed=0), model, x, y, None, threat, search, sample_id=ids)
    proven, robust = rec["certified"] == 1.0, rec["adv_pred"] == y
    assert int(proven.sum()) > len(y) // 2  # the check is not vacuous
    assert bool((~robust & (rec["clean_pred"] == y)).any())  # and the attack breaks what it can
    assert not bool((proven & rec["success_at_budget"]).any())
    assert float(proven.double().mean()) <= float(robust.double().mean())
    for seed in range(1, 5):
        again = evaluate_batch(PGD(steps=50, seed=seed), model, x[proven], y[proven], None, threat, search,
                               sample_id=ids[proven])
        assert not bool(again["success_at_budget"].any())
