"""Training recipes, the inner PGD, checkpoint cache and `advbench train`'s entry point."""

from __future__ import annotations

from pathlib import Path

import hydra.utils
import pytest
import torch
import torchattacks
from omegaconf import OmegaConf
from torch import nn
from torch.nn import functional as F
from torchvision import models as tv_models

from advbench.cli.config import compose_config
from advbench.cli.spec_builder import model_spec, target_spec, train_main
from advbench.core.errors import AdvbenchError
from advbench.robustness.data.digits import Digits
from advbench.robustness.defenses.checkpoint_cache import checkpoint_key, checkpoint_path
from advbench.robustness.defenses.inner import (
    cross_entropy_objective,
    kl_objective,
    pgd_linf,
)
from advbench.robustness.defenses.recipes import Recipe
from advbench.robustness.defenses.trained import ensure_checkpoint, load_trained_model
from advbench.robustness.defenses.trainer import evaluate_accuracy, train_defense
from advbench.robustness.models.checkpoint_files import load_checkpoint

CONF = Path(__file__).resolve().parents[1] / "conf"
EPS = 0.1


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def digits() -> Digits:
    return hydra.utils.instantiate(OmegaConf.load(CONF / "dataset" / "digits.yaml"))


@pytest.fixture(scope="module")
def eval_tensors(digits: Digits) -> tuple[torch.Tensor, torch.Tensor]:
    ev = digits.eval_set()
    return torch.stack([ev[i][0] for i in range(len(ev))]), torch.tensor([ev[i][1] for i in range(len(ev))])


def _recipe(name: str, **changes) -> dict:
    recipe = OmegaConf.to_container(OmegaConf.load(CONF / "defense" / f"{name}.yaml").recipe)
    return {**recipe, **changes}


def _arch() -> dict:
    return OmegaConf.to_container(OmegaConf.load(CONF / "model" / "small_cnn.yaml"))


@pytest.fixture(scope="module")
def trained(digits: Digits, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[nn.Module, dict]]:
    """natural (YAML defaults), pgd_at (6 epochs) and trades (3 epochs), trained once."""
    out = tmp_path_factory.mktemp("ckpt")
    models = {}
    for name, changes in [("natural", {}), ("pgd_at", {"epochs": 6}), ("trades", {"epochs": 3})]:
        meta = train_defense(digits, model_spec(_arch()), Recipe.from_config(_recipe(name, **changes)), out / f"{name}.pt",
                             progress=False)
        model = model_spec(_arch()).build(10, 1)
        assert load_checkpoint(out / f"{name}.pt", model) == meta
        models[name] = (model.eval(), meta)
    return models


def _robust_accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    torch.manual_seed(0)
    x_adv = pgd_linf(cross_entropy_objective(model, y), x, EPS, EPS / 4, 20)
    return float((model(x_adv).argmax(1) == y).float().mean())


# ---------------------------------------------------------------- inner PGD


def test_pgd_reaches_the_linear_optimum_inside_box_and_ball() -> None:
    torch.manual_seed(0)
    w = torch.randn(1, 2, 4, 4)
    x = torch.rand(5, 2, 4, 4)
    eps = torch.tensor([0.0, 0.05, 0.1, 0.3, 1.0])
    x_adv = pgd_linf(lambda z: (z * w).sum(), x, eps, step_size=0.04, steps=30)
    expected = (x + eps.view(-1, 1, 1, 1) * w.sign()).clamp(0, 1)
    torch.testing.assert_close(x_adv, expected)
    assert not x_adv.requires_grad


@pytest.mark.parametrize("start", ["uniform", "gaussian", "none"])
def test_pgd_stays_in_the_ball_and_raises_the_loss(start: str, trained, eval_tensors) -> None:
    model, _ = trained["natural"]
    x, y = eval_tensors[0][:64], eval_tensors[1][:64]
    x_adv = pgd_linf(cross_entropy_objective(model, y), x, EPS, EPS / 4, 10, start=start)
    assert (x_adv - x).abs().max() <= EPS + 1e-6 and x_adv.min() >= 0 and x_adv.max() <= 1
    assert F.cross_entropy(model(x_adv), y) > 2 * F.cross_entropy(model(x), y)


def test_pgd_matches_torchattacks(trained, eval_tensors) -> None:
    model, _ = trained["natural"]
    x, y = eval_tensors[0][:64], eval_tensors[1][:64]
    ours = pgd_linf(cross_entropy_objective(model, y), x, EPS, 0.02, 7, start="none")
    theirs = torchattacks.PGD(model, eps=EPS, alpha=0.02, steps=7, random_start=False)(x, y)
    torch.testing.assert_close(ours, theirs)


def test_trades_objective_is_zero_at_the_clean_point(trained, eval_tensors) -> None:
    model, _ = trained["natural"]
    x = eval_tensors[0][:16]
    probs = F.softmax(model(x), 1).detach()
    objective = kl_objective(model, probs)
    x_adv = pgd_linf(objective, x, EPS, EPS / 4, 5, start="gaussian")
    with torch.no_grad():
        assert float(objective(x)) == pytest.approx(0.0, abs=1e-5)
        assert float(objective(x_adv)) > 1.0


# ---------------------------------------------------------------- recipes


def test_natural_model_is_accurate_and_pgd_at_is_robust(trained, eval_tensors) -> None:
    x, y = eval_tensors
    natural, nat_meta = trained["natural"]
    pgd_at, at_meta = trained["pgd_at"]
    trades, _ = trained["trades"]
    assert nat_meta["clean_accuracy"] >= 0.95
    assert at_meta["clean_accuracy"] >= 0.9
    nat, at, tr = (_robust_accuracy(m, x, y) for m in (natural, pgd_at, trades))
    assert at >= nat + 0.15, f"robust accuracy at eps {EPS}: natural {nat:.3f}, pgd_at {at:.3f}"
    assert tr >= nat + 0.1, f"robust accuracy at eps {EPS}: natural {nat:.3f}, trades {tr:.3f}"


def test_checkpoint_meta_is_plain_and_complete(trained) -> None:
    _, meta = trained["pgd_at"]
    assert (meta["dataset"], meta["architecture"], meta["recipe"]) == ("digits", "small_cnn", "pgd_at")
    assert meta["config"]["recipe"]["epochs"] == 6 and meta["config"]["model"]["arch"] == "small_cnn"
    assert meta["config"]["budgets"]["linf"] > 0 and meta["train_seconds"] > 0
    assert meta["created_at"].endswith("+00:00") and meta["advbench_version"]


def test_training_is_seeded(digits: Digits, tmp_path: Path) -> None:
    recipe = Recipe.from_config(_recipe("natural", epochs=1))
    metas = [train_defense(digits, model_spec(_arch()), recipe, tmp_path / f"{i}.pt", progress=False, seed=3) for i in range(2)]
    states = [torch.load(tmp_path / f"{i}.pt", weights_only=True)["state_dict"] for i in range(2)]
    assert metas[0]["clean_accuracy"] == metas[1]["clean_accuracy"]
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"type": "mixup"}, "unknown training recipe 'mixup'; valid: .*natural, pgd_at, .*trades"),
        ({"momentum_typo": 0.9}, "bad training recipe: Key 'momentum_typo' not in 'Recipe'"),
        ({"optimizer": "lbfgs"}, "unknown optimizer 'lbfgs'"),
        ({"epochs": 0}, "epochs >= 1"),
        ({"eps": 0.0}, "recipe 'pgd_at' needs eps > 0"),
        ({"lr": None}, "bad training recipe: Incompatible value 'None' for field of type 'float'"),
        ({"epochs": "many"}, "bad training recipe: Value 'many' of type 'str' could not be converted to Integer"),
    ],
)
def test_bad_recipes_are_one_line_errors(changes: dict, expected: str) -> None:
    with pytest.raises(AdvbenchError, match=expected):
        Recipe.from_config(_recipe("pgd_at", **changes))


def test_recipe_step_defaults_to_a_quarter_of_eps() -> None:
    assert Recipe.from_config(_recipe("pgd_at")).inner_step == pytest.approx(0.025)
    assert Recipe.from_config(_recipe("trades", step_size=0.01)).inner_step == 0.01


def test_divergence_is_reported(digits: Digits, tmp_path: Path) -> None:
    with pytest.raises(AdvbenchError, match="training diverged"):
        recipe = Recipe.from_config(_recipe("natural", epochs=2, lr=1e12, optimizer="sgd"))
        train_defense(digits, model_spec(_arch()), recipe, tmp_path / "x.pt", progress=False)
    assert not (tmp_path / "x.pt").exists()


# ---------------------------------------------------------------- CLI entry points and the cache


def test_train_main_saves_to_the_cache_and_prints_one_line(tmp_path: Path, capsys) -> None:
    cfg = compose_config("train", ["defense=natural", "defense.recipe.epochs=1", f"cache_dir={tmp_path}", "device=auto"])
    path = train_main(cfg)
    assert path == checkpoint_path(tmp_path, "digits", "small_cnn", "natural", checkpoint_key(target_spec(cfg)))
    assert path.parent == tmp_path / "checkpoints/digits/small_cnn" and path.name.startswith("natural-")
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("trained small_cnn/natural on digits: clean accuracy") and str(path) in lines[0]
    model = load_trained_model(target_spec(cfg), Digits())
    assert not model.training and not any(p.requires_grad for p in model.parameters())


def test_ensure_checkpoint_trains_digits_once(tmp_path: Path) -> None:
    cfg = compose_config("train", ["defense=natural", "defense.recipe.epochs=1", f"cache_dir={tmp_path}", "dataset.n_samples=10"])
    path = ensure_checkpoint(target_spec(cfg))
    model = model_spec(cfg.model).build(10, 1)
    accuracy = load_checkpoint(path, model)["clean_accuracy"]
    assert accuracy == evaluate_accuracy(model, Digits().eval_set())
    stamp = path.stat().st_mtime_ns
    assert ensure_checkpoint(target_spec(cfg)) == path and path.stat().st_mtime_ns == stamp


def test_missing_cifar_checkpoint_names_the_command(tmp_path: Path, fake_cifar_root: Path) -> None:
    cfg = compose_config(
        "train", ["dataset=cifar10", f"dataset.root={fake_cifar_root}", "model=resnet56", "defense=trades", f"cache_dir={tmp_path}"]
    )
    with pytest.raises(AdvbenchError) as err:
        ensure_checkpoint(target_spec(cfg))
    assert str(err.value).endswith("create it with: advbench train dataset=cifar10 model=resnet56 defense=trades")
    assert not any(tmp_path.iterdir())


def test_defense_without_recipe_cannot_be_trained(tmp_path: Path) -> None:
    cfg = compose_config("train", [f"cache_dir={tmp_path}"])
    del cfg.defense.recipe
    with pytest.raises(AdvbenchError, match="has no training recipe"):
        train_main(cfg)


def test_pretrained_natural_model_needs_no_checkpoint(tmp_path: Path, fake_cifar_root: Path) -> None:
    """A natural torchvision model with `weights_path` uses those weights, not the cache."""
    torch.manual_seed(0)
    reference = tv_models.resnet50(weights=None, num_classes=10).eval()
    torch.save(reference.state_dict(), tmp_path / "w.pth")
    overrides = ["dataset=cifar10", f"dataset.root={fake_cifar_root}", "model=resnet50", f"cache_dir={tmp_path}"]
    cfg = compose_config("train", [*overrides, "defense=natural", f"model.weights_path={tmp_path / 'w.pth'}"])
    dataset = hydra.utils.instantiate(cfg.dataset)
    model = load_trained_model(target_spec(cfg), dataset)
    x = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), reference((x - model.mean) / model.std))
    with pytest.raises(AdvbenchError, match="defense=pgd_at"):
        weighted = compose_config("train", [*overrides, "defense=pgd_at", f"model.weights_path={tmp_path / 'w.pth'}"])
        load_trained_model(target_spec(weighted), dataset)


def test_the_weights_do_not_depend_on_the_thread_count_of_the_command(tmp_path: Path) -> None:
    """`advbench train` (threads: null, one per core) and a benchmark preset (threads=1) train the same weights."""
    from advbench.cli.spec_builder import train_main
    from advbench.core.torchfile import read_torch_file

    states = []
    for threads in (1, 2):
        cfg = compose_config("train", ["defense=natural", "defense.recipe.epochs=1", f"threads={threads}",
                                       f"cache_dir={tmp_path / str(threads)}"])
        checkpoint = read_torch_file(train_main(cfg), "checkpoint")
        assert checkpoint["meta"]["training_threads"] == 1
        states.append(checkpoint["state_dict"])
    assert states[0].keys() == states[1].keys()
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])
    assert torch.get_num_threads() == 2, "the command's own thread count is back after training"


def test_the_training_thread_count_is_in_the_checkpoint_key() -> None:
    from advbench.robustness.defenses.checkpoint_cache import checkpoint_key

    one, two = (checkpoint_key(target_spec(compose_config("train", [f"training_threads={n}"]))) for n in (1, 2))
    assert one != two


def test_the_suggested_train_line_keeps_the_runs_data_and_search_path(tmp_path: Path, fake_cifar_root: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A run that names its data folder gets a train line that names it too (and the search path it used)."""
    from click.testing import CliRunner

    from advbench.cli.main import main

    monkeypatch.chdir(tmp_path)
    extra = tmp_path / "myconf"
    (extra / "model").mkdir(parents=True)
    result = CliRunner().invoke(main, ["run", "dataset=cifar10", f"dataset.root={fake_cifar_root}", "model=resnet56",
                                       f"cache_dir={tmp_path / 'cache'}", f"hydra.searchpath=[file://{extra}]"])
    assert result.exit_code == 1
    line = result.output.strip().splitlines()[-1]
    assert "create it with: advbench train dataset=cifar10 model=resnet56 defense=natural" in line
    assert f"dataset.root={fake_cifar_root}" in line and f"hydra.searchpath=[file://{extra}]" in line
