"""DeepDefense, ALP, Ens-AT and ADP: their losses, the ADP ensemble, and `advbench train` end to end."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import hydra.utils
import pytest
import torch
from omegaconf import OmegaConf, open_dict
from torch import nn
from torch.nn import functional as F

from advbench.cli.config import compose_config
from advbench.cli.spec_builder import defense_spec, model_spec, static_target, target_spec, train_main
from advbench.core.catalog import group_options
from advbench.core.errors import AdvbenchError
from advbench.robustness.defenses.checkpoint_cache import checkpoint_key
from advbench.robustness.defenses.inner import pgd_linf
from advbench.robustness.defenses.recipes import LOSSES, REGISTRY, SINGLE_STEPS, Recipe
from advbench.robustness.defenses.recipes.adp import adp_regularizer
from advbench.robustness.defenses.recipes.alp import logit_pairing
from advbench.robustness.defenses.recipes.deepdefense import unrolled_deepfool
from advbench.robustness.defenses.trained import load_trained_model
from advbench.robustness.defenses.trainer import build_defended_model
from advbench.robustness.models.checkpoint_files import load_checkpoint
from advbench.robustness.models.ensemble import Ensemble
from advbench.robustness.targets import load_target

CONF = Path(__file__).resolve().parents[1] / "conf"
RECIPES = ("deepdefense", "alp", "ens_at", "adp")

pytestmark = pytest.mark.usefixtures("one_thread")


def _recipe(name: str, **changes) -> Recipe:
    recipe = OmegaConf.to_container(OmegaConf.load(CONF / "defense" / f"{name}.yaml").recipe)
    return Recipe.from_config({**recipe, **changes})


def _model_cfg(name: str) -> dict:
    return OmegaConf.to_container(OmegaConf.load(CONF / "model" / f"{name}.yaml"))


def _one_step(recipe: Recipe, arch: str, x: torch.Tensor, y: torch.Tensor, statics: tuple[nn.Module, ...] = ()) -> float:
    """One optimiser step of `recipe` on (x, y); returns the loss after checking it moved every member."""
    torch.manual_seed(0)
    model = build_defended_model(model_spec(_model_cfg(arch)), recipe, 10, x.shape[1]).train()
    before = [p.detach().clone() for p in model.parameters()]
    extra = {"static_models": statics} if statics else {}
    loss = LOSSES[recipe.type](model, x, y, recipe, **extra)
    assert loss.dim() == 0 and math.isfinite(loss.item())
    loss.backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    moved = [not torch.equal(b, p) for b, p in zip(before, model.parameters())]
    assert sum(moved) >= len(moved) // 2, f"{recipe.type}: only {sum(moved)} of {len(moved)} tensors changed"
    if isinstance(model, Ensemble):
        assert all(any(p.grad.abs().sum() > 0 for p in m.parameters()) for m in model.members)
    return loss.item()


def _statics(arch: str, channels: int) -> tuple[nn.Module, ...]:
    torch.manual_seed(1)
    return tuple(model_spec(_model_cfg(arch)).build(10, channels).eval().requires_grad_(False) for _ in range(2))


@pytest.mark.parametrize("name", list(REGISTRY))
def test_each_recipe_takes_a_finite_differentiable_step_on_digits(name: str) -> None:
    """Every registered recipe, with its conf/defense YAML's settings, on a tiny digits batch."""
    torch.manual_seed(0)
    x, y = torch.rand(16, 1, 8, 8), torch.arange(16) % 10
    _one_step(_recipe(name), "small_cnn", x, y, _statics("small_cnn", 1) if name == "ens_at" else ())


@pytest.mark.parametrize(("name", "arch"), [("deepdefense", "resnet56"), ("alp", "resnet56"), ("ens_at", "resnet56"),
                                            ("adp", "resnet110")])
def test_each_recipe_takes_one_step_on_its_cifar10_architecture(name: str, arch: str) -> None:
    """The seed's CIFAR-10 nets (ResNet-56; three ResNet-110 for ADP), one step on tiny random images."""
    torch.manual_seed(0)
    x, y = torch.rand(2, 3, 32, 32), torch.tensor([3, 7])
    cheap = {"deepdefense": {"deepfool_steps": 1}, "alp": {"steps": 1}}.get(name, {})
    if name == "deepdefense":  # double backward through ResNet-56, once per candidate class
        x, y = x[:1], y[:1]
    _one_step(_recipe(name, **cheap), arch, x, y, _statics(arch, 3)[:1] if name == "ens_at" else ())


# ---------------------------------------------------------------- ALP


class _Constant(nn.Module):
    """Logits that ignore the input: clean and adversarial examples score alike."""

    def __init__(self) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.tensor([0.5, -1.0, 2.0]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bias.expand(x.shape[0], -1) + 0 * x.flatten(1).sum(1, keepdim=True)


def test_logit_pairing_is_the_mean_squared_distance_of_pairs() -> None:
    clean = torch.tensor([[0.0, 0.0], [1.0, 1.0]])
    assert float(logit_pairing(clean, clean)) == 0.0
    assert float(logit_pairing(clean, torch.tensor([[3.0, 4.0], [1.0, 1.0]]))) == pytest.approx(25 / 2)


def test_alp_loss_is_plain_cross_entropy_when_the_logits_coincide() -> None:
    """A model that ignores its input gives identical clean and adversarial logits: no pairing term."""
    model, y = _Constant(), torch.tensor([0, 2, 1])
    loss = LOSSES["alp"](model, torch.rand(3, 1, 4, 4), y, _recipe("alp", pairing_weight=100.0))
    torch.testing.assert_close(loss, F.cross_entropy(model.bias.expand(3, -1), y))


# ---------------------------------------------------------------- Ens-AT


def test_ens_at_weights_the_adversarial_half_as_kurakin_et_al() -> None:
    """(Σ_clean CE + λ·Σ_adv CE) / (m − k + λ·k) with the second half adversarial: labels 0 then 1."""
    model, y = _Constant(), torch.tensor([0, 0, 1, 1])
    loss = LOSSES["ens_at"](model, torch.rand(4, 1, 4, 4), y, _recipe("ens_at", adv_weight=0.3))
    ce = F.cross_entropy(model.bias[None], torch.tensor([0])), F.cross_entropy(model.bias[None], torch.tensor([1]))
    torch.testing.assert_close(loss, (ce[0] + 0.3 * ce[1]) / 1.3)


@pytest.mark.parametrize("kind", ["fgsm", "step_ll"])
def test_single_steps_move_away_from_the_label_or_towards_the_least_likely_class(kind: str) -> None:
    torch.manual_seed(0)
    linear = nn.Sequential(nn.Flatten(), nn.Linear(16, 3))
    x, y = torch.full((4, 1, 4, 4), 0.5), torch.tensor([0, 1, 2, 0])
    objective = SINGLE_STEPS[kind](linear, x, y)
    with torch.no_grad():
        before = linear(x)
    x_adv = pgd_linf(objective, x, 0.1, 0.1, 1, start="none")
    with torch.no_grad():
        after = linear(x_adv)
    assert (x_adv - x).abs().max() == pytest.approx(0.1)
    if kind == "fgsm":
        assert (F.cross_entropy(after, y, reduction="none") > F.cross_entropy(before, y, reduction="none")).all()
    else:
        least = before.argmin(1)
        assert (F.log_softmax(after, 1).gather(1, least[:, None]) > F.log_softmax(before, 1).gather(1, least[:, None])).all()


# ---------------------------------------------------------------- ADP


def test_adp_regularizer_on_hand_checkable_members() -> None:
    """Two members, three classes, label 0. Orthogonal non-label predictions: Gram = I, log det =
    2·log(1 + 1e-6); the mean prediction (0.5, 0.25, 0.25) has entropy 1.5·log 2. Identical
    members: Gram = all ones, det = 1e-6·(2 + 1e-6)."""
    y = torch.tensor([0])
    diverse = torch.tensor([[[0.5, 0.5, 0.0]], [[0.5, 0.0, 0.5]]])
    expected = -2.0 * 1.5 * math.log(2) - 0.5 * 2 * math.log(1 + 1e-6)
    assert float(adp_regularizer(diverse.double(), y, alpha=2.0, beta=0.5)) == pytest.approx(expected, rel=1e-9)
    same = torch.tensor([[[0.2, 0.5, 0.3]], [[0.2, 0.5, 0.3]]]).double()
    entropy = -sum(p * math.log(p) for p in (0.2, 0.5, 0.3))
    expected = -2.0 * entropy - 0.5 * math.log(1e-6 * (2 + 1e-6))
    assert float(adp_regularizer(same, y, alpha=2.0, beta=0.5)) == pytest.approx(expected, rel=1e-6)


def test_the_ensemble_predicts_the_log_of_the_mean_member_probabilities() -> None:
    torch.manual_seed(0)
    members = [model_spec(_model_cfg("small_cnn")).build(10, 1) for _ in range(3)]
    ensemble = Ensemble(members)
    x = torch.rand(4, 1, 8, 8)
    with torch.no_grad():
        mean = torch.stack([F.softmax(m(x), dim=1) for m in members]).mean(0)
        torch.testing.assert_close(ensemble(x), mean.log())
    assert ensemble.arch == "small_cnnx3" and not ensemble.randomized and ensemble.bounds == (0.0, 1.0)


# ---------------------------------------------------------------- DeepDefense


def test_unrolled_deepfool_reaches_a_linear_boundary_in_one_step_and_keeps_the_weight_gradient() -> None:
    """For a linear two-class model, DeepFool's step is |f|/‖w‖ along w (f = Z_1 − Z_0, w = W_1 − W_0)."""
    torch.manual_seed(0)
    linear = nn.Sequential(nn.Flatten(), nn.Linear(16, 2))
    x = torch.rand(5, 1, 4, 4)
    with torch.no_grad():
        logits = linear(x)
    y = logits.argmax(1)
    r, correct = unrolled_deepfool(linear, x, y, steps=3, overshoot=0.02)
    assert correct.all()
    w = linear[1].weight[1] - linear[1].weight[0]
    f = (logits[:, 1] - logits[:, 0]).abs()
    torch.testing.assert_close(r.flatten(1).norm(dim=1), 1.02 * (f / w.norm() + 1e-4))
    (grad,) = torch.autograd.grad(r.norm(), linear[1].weight)
    assert grad.abs().sum() > 0, "the perturbation's norm must depend on the weights"


def test_deepdefense_penalises_small_perturbations_of_correct_samples() -> None:
    """The regulariser grows as the boundary gets nearer (ρ smaller) for a correctly classified input."""
    recipe = _recipe("deepdefense")
    x, y = torch.full((1, 1, 2, 2), 0.5), torch.tensor([1])
    losses = []
    for margin in (0.1, 1.0):
        linear = nn.Sequential(nn.Flatten(), nn.Linear(4, 2))
        with torch.no_grad():
            linear[1].weight.copy_(torch.tensor([[0.0] * 4, [1.0] * 4]))
            linear[1].bias.copy_(torch.tensor([0.0, margin - 2.0]))
        ce = F.cross_entropy(linear(x), y)
        losses.append((LOSSES["deepdefense"](linear, x, y, recipe) - ce).item())
    ratios = [1.02 * (m / 2 + 1e-4) for m in (0.1, 1.0)]  # ‖r‖ = margin / ‖w‖ = margin / 2; ‖x‖ = 1
    assert losses == pytest.approx([15 * math.exp(-25 * r) for r in ratios], rel=1e-4)


# ---------------------------------------------------------------- configs and `advbench train`


def _defense_recipes() -> dict[str, dict]:
    """The `recipe:` block of each conf/defense option that has one (wrappers reuse their base's)."""
    blocks = {name: OmegaConf.load(CONF / "defense" / f"{name}.yaml").get("recipe") for name in group_options("defense")}
    return {name: recipe for name, recipe in blocks.items() if recipe is not None}


@pytest.mark.parametrize("name", list(REGISTRY))
def test_every_defense_config_builds_its_model_and_recipe(name: str) -> None:
    """Every conf/defense recipe of each registered type validates and builds its digits model;
    every registered recipe ships the conf/defense option of its name."""
    built = []
    for option, recipe in _defense_recipes().items():
        if recipe.type != name:
            continue
        model = build_defended_model(model_spec(_model_cfg("small_cnn")), Recipe.from_config(recipe), 10, 1)
        assert model(torch.zeros(2, 1, 8, 8)).shape == (2, 10), option
        built.append(option)
    assert name in built
    if REGISTRY[name].ensemble:
        assert isinstance(build_defended_model(model_spec(_model_cfg("small_cnn")), _recipe(name), 10, 1), Ensemble)


def test_every_defense_config_trains_a_registered_recipe() -> None:
    assert {recipe.type for recipe in _defense_recipes().values()} <= set(REGISTRY)
    assert set(RECIPES) <= set(REGISTRY) and REGISTRY["adp"].ensemble


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"members": 1}, "recipe 'adp' trains at least 2 members; got members=1"),
        ({"init": "natural"}, "cannot start from one model's checkpoint"),
    ],
)
def test_bad_ensemble_recipes_are_one_line_errors(changes: dict, expected: str) -> None:
    with pytest.raises(AdvbenchError, match=expected):
        _recipe("adp", **changes)
    with pytest.raises(AdvbenchError, match="unknown single_step 'pgd'; valid: fgsm, step_ll"):
        _recipe("ens_at", single_step="pgd")
    with pytest.raises(AdvbenchError, match="recipe 'alp' trains one model; got members=3"):
        _recipe("alp", members=3)


def test_checkpoint_key_follows_the_checkpoints_a_recipe_starts_from(tmp_path: Path) -> None:
    cfg = compose_config("train", ["defense=ens_at", f"cache_dir={tmp_path}"])
    other = cfg.copy()
    other.defense.recipe.static_models[0].seed = 4
    target = target_spec(cfg)
    natural = target.static_models[0]
    assert checkpoint_key(target) != checkpoint_key(target_spec(other))
    shorter = {**natural.defense.identity(), "name": "natural", "recipe": {**natural.defense.recipe_identity(), "epochs": 1}}
    assert checkpoint_key(natural) != checkpoint_key(dataclasses.replace(natural, defense=defense_spec(shorter)))
    static = static_target(cfg, target, {"model": "small_cnn", "seed": 3, "width": 32})
    assert (static.defense.name, static.seed, static.model.argument("width"), static.model.argument("hidden")) == ("natural", 3, 32, 128)
    with pytest.raises(AdvbenchError, match="needs 'model:' naming a conf/model option"):
        static_target(cfg, static, {"model": "nonet"})


TINY = ["dataset.test_fraction=0.93", "defense.recipe.epochs=1", "threads=1"]


@pytest.mark.slow
def test_advbench_train_writes_each_recipes_checkpoint_with_its_meta(tmp_path: Path, capsys) -> None:
    """`advbench train defense=X dataset=digits` on a 7% training split, one epoch each."""
    for name in RECIPES:
        cfg = compose_config("train", [f"defense={name}", "dataset=digits", f"cache_dir={tmp_path}", *TINY])
        path = train_main(cfg)
        assert path.name.startswith(f"{name}-") and str(path) in capsys.readouterr().out.splitlines()[-1]
        dataset = hydra.utils.instantiate(cfg.dataset)
        model = load_trained_model(target_spec(cfg), dataset)
        meta = load_checkpoint(path, build_defended_model(model_spec(cfg.model), target_spec(cfg).defense.recipe, 10, 1))
        assert meta["recipe"] == name and 0.0 <= meta["clean_accuracy"] <= 1.0
        assert meta["architecture"] == ("small_cnnx3" if name == "adp" else "small_cnn")
        assert not any(p.requires_grad for p in model.parameters())
        with open_dict(cfg):
            cfg.checkpoint = str(path)  # what `advbench run checkpoint=...` loads
        assert type(load_target(target_spec(cfg), dataset)) is type(model)
    cached = {p.parent.name + "/" + p.name.split("-")[0] for p in (tmp_path / "checkpoints").rglob("*.pt")}
    assert cached == {"small_cnn/natural", "small_cnn_w32/natural", *(f"small_cnn/{n}" for n in RECIPES)}
