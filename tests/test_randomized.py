"""Randomized defenses (RSE, RandMix) and the masked-gradient flags in the records."""

from __future__ import annotations

from pathlib import Path

import hydra.utils
import pytest
import torch
from click.testing import CliRunner
from torch import nn

from advbench.cli.config import compose_config
from advbench.cli.main import main
from advbench.cli.spec_builder import model_spec, target_spec
from advbench.robustness.attacks.oracles import build_oracle
from advbench.robustness.data.digits import Digits
from advbench.robustness.defenses.checkpoint_cache import cache_entry
from advbench.robustness.defenses.masking import cell_flags, gradient_flags
from advbench.robustness.defenses.noise_layers import conv_noise, inner_convolutions
from advbench.robustness.defenses.recipes import Recipe
from advbench.robustness.defenses.trained import load_trained_model
from advbench.robustness.defenses.trainer import train_defense
from advbench.robustness.defenses.wrappers import (
    RandomDiscretization,
    RandomSelfEnsemble,
    wrap,
    wrapper_spec,
)
from advbench.robustness.models import build_model
from advbench.robustness.models.checkpoint_files import load_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")

NONE_FIRED = {"flag_zero_grad": False, "flag_randomized": False, "flag_probabilities": False, "flag_dynamic": False}


@pytest.fixture(scope="module")
def batch(digits_tensors) -> tuple[torch.Tensor, torch.Tensor]:
    return digits_tensors[2][:32], digits_tensors[3][:32]


def test_randmix_sets_each_pixel_to_one_of_few_centroids_within_bounds(tiny_model, batch) -> None:
    x = batch[0]
    model = RandomDiscretization(tiny_model, noise=0.1, clusters=3, ensemble=4, seed=0)
    t = model.discretize(x, torch.arange(len(x)), stream=0)
    assert t.shape == x.shape and t.min() >= 0 and t.max() <= 1
    assert max(len(torch.unique(row)) for row in t) <= 3
    assert (t - x).abs().mean() < 0.2, "the centroids are the image's own (noisy) colours"
    assert model(x).shape == (len(x), 10)


def test_rse_without_noise_is_the_base_model_and_leaves_no_hooks(tiny_model, batch) -> None:
    x = batch[0]
    quiet = RandomSelfEnsemble(tiny_model, init_noise=0.0, inner_noise=0.0, ensemble=3)
    torch.testing.assert_close(quiet(x), tiny_model(x))
    noisy = RandomSelfEnsemble(tiny_model, init_noise=0.2, inner_noise=0.5, ensemble=3)
    assert noisy.streams_per_pass == 2 and len(inner_convolutions(tiny_model)) == 1
    assert not torch.equal(noisy(x), tiny_model(x))
    assert all(not conv._forward_pre_hooks for conv in tiny_model.modules() if isinstance(conv, nn.Conv2d))


def test_inner_noise_goes_before_every_convolution_but_the_first(tiny_model, batch) -> None:
    seen = []
    with conv_noise(tiny_model, lambda a, layer: seen.append((layer, tuple(a.shape[1:]))) or torch.zeros_like(a)):
        tiny_model(batch[0])
    assert seen == [(0, (16, 8, 8))]


@pytest.mark.parametrize("spec", [{"type": "rse", "ensemble": 2}, {"type": "randmix", "ensemble": 2}])
def test_a_rows_draws_do_not_depend_on_its_batch(tiny_model, batch, spec) -> None:
    """Keyed draws: a row alone gives what it gives in a batch, and a fresh wrapper repeats a run."""
    x = batch[0]
    whole = wrap(tiny_model, wrapper_spec(spec), seed=4)(x)
    alone = wrap(tiny_model, wrapper_spec(spec), seed=4)(x[7:8].clone())
    torch.testing.assert_close(whole[7:8], alone, rtol=1e-4, atol=1e-5)
    again = wrap(tiny_model, wrapper_spec(spec), seed=4)
    torch.testing.assert_close(again(x), whole, rtol=0, atol=0)
    assert not torch.equal(again(x), whole), "every call draws anew"


@pytest.mark.parametrize("spec", [{"type": "rse", "ensemble": 4}, {"type": "randmix", "ensemble": 4}])
def test_large_calls_go_through_in_slices_with_the_same_draws(tiny_model, batch, spec, monkeypatch) -> None:
    """Decision attacks send thousands of probes at once: rows x members is bounded per model call."""
    import advbench.robustness.defenses.wrappers as W

    x = batch[0]
    whole = wrap(tiny_model, wrapper_spec(spec), seed=4)(x)
    calls = []
    model = wrap(tiny_model, wrapper_spec(spec), seed=4)
    original = type(model).noisy_logits
    monkeypatch.setattr(type(model), "noisy_logits", lambda self, *a: calls.append(len(a[0])) or original(self, *a))
    monkeypatch.setattr(W, "ENSEMBLE_ELEMENTS", 4 * 64 * 5)  # 5 rows of 4 members per call
    torch.testing.assert_close(model(x), whole, rtol=1e-4, atol=1e-5)
    assert calls == [20] * 6 + [8]


def test_eot_gradient_variance_falls_with_more_samples(tiny_model, batch) -> None:
    """RandMix's BPDA+EOT gradient: 8 passes a gradient vary about 8 times less than 1 pass."""
    x, y = batch[0][:8], batch[1][:8]

    def variance(passes: int) -> float:
        model = wrap(tiny_model, wrapper_spec({"type": "randmix", "ensemble": 1, "eot_samples": passes, "noise": 0.1}), seed=0)
        oracle = build_oracle("white", model, len(x))
        assert oracle.grad_mode == "bpda+eot"
        grads = torch.stack([oracle.loss_grad(x, y, False, torch.arange(len(x)))[1] for _ in range(6)])
        return float(grads.var(dim=0).mean())

    one, eight = variance(1), variance(8)
    assert one > 0 and eight < one / 3, (one, eight)


def test_flags_fire_on_probabilities_zero_gradients_and_randomness(tiny_model, batch) -> None:
    x, y = batch
    assert gradient_flags(tiny_model, x, y)[0] == NONE_FIRED
    softmax = nn.Sequential(tiny_model, nn.Softmax(dim=1))
    assert gradient_flags(softmax, x, y)[0] == {**NONE_FIRED, "flag_probabilities": True}
    jpeg = wrap(tiny_model, wrapper_spec({"type": "jpeg", "quality": 75}), seed=0)     # BPDA is switched off for the check
    assert gradient_flags(jpeg, x, y) == ({**NONE_FIRED, "flag_zero_grad": True}, 1.0)
    assert jpeg.straight_through, "the check works on a copy"
    for spec in ({"type": "rse"}, {"type": "randmix"}, {"type": "random_resize_pad"}):
        model = wrap(tiny_model, wrapper_spec(spec), seed=0)
        assert gradient_flags(model, x, y)[0] == {**NONE_FIRED, "flag_randomized": True}, spec
        assert model.passes == 0, "the deployed model's draws are untouched"


class SquareRootInput(nn.Module):
    """A model with finite outputs whose input gradient is infinite wherever a pixel is 0 (sqrt's slope)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x.sqrt())


def test_a_non_finite_input_gradient_is_flagged_as_unusable(tiny_model, batch) -> None:
    x, y = batch
    dark = x.flatten(1).amin(dim=1) == 0  # rows with a black pixel: sqrt's gradient there is infinite
    assert 0 < int(dark.sum()) and torch.isfinite(SquareRootInput(tiny_model)(x)).all()
    flags, unusable = gradient_flags(SquareRootInput(tiny_model), x, y)
    assert flags == {**NONE_FIRED, "flag_zero_grad": True} and unusable == float(dark.float().mean())
    assert gradient_flags(SquareRootInput(tiny_model), x + 0.01, y)[0] == NONE_FIRED, "positive pixels: finite slopes"


class Purifying(nn.Module):
    """A dynamic defense: every forward pass takes a gradient step on its input first."""

    bounds = (0.0, 1.0)

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.enable_grad():
            z = x.detach().requires_grad_(True)
            grad, = torch.autograd.grad(self.model(z).logsumexp(dim=1).sum(), z)
        return self.model((x + 0.01 * grad.sign()).clamp(0, 1))


def test_the_dynamic_flag_fires_on_a_model_that_optimises_at_inference(tiny_model, batch) -> None:
    x, y = batch
    assert gradient_flags(Purifying(tiny_model), x, y)[0] == {**NONE_FIRED, "flag_dynamic": True}
    assert gradient_flags(tiny_model, x, y)[0] == NONE_FIRED


def test_flags_stay_quiet_on_the_natural_small_cnn_and_warn_on_jpeg(trained_digits_cache: Path, capsys) -> None:
    cfg = compose_config("config", [f"cache_dir={trained_digits_cache}", "defense.recipe.epochs=4"])
    dataset = Digits()
    model = load_trained_model(target_spec(cfg), dataset)
    cpu = torch.device("cpu")
    assert cell_flags(model, dataset.eval_set(), range(64), cpu, label="cell", warn_user=True) == NONE_FIRED
    assert capsys.readouterr().err == ""
    jpeg = wrap(model, wrapper_spec({"type": "jpeg"}), seed=0)
    assert cell_flags(jpeg, dataset.eval_set(), range(64), cpu, label="cell", warn_user=True)["flag_zero_grad"]
    assert "cell: gradients may be masked: zero or non-finite input gradients for 100% of the first batch" in capsys.readouterr().err


def test_advbench_train_rse_on_digits_deploys_with_its_noise(tmp_path: Path) -> None:
    args = ["defense=rse", "dataset=digits", "defense.recipe.epochs=1", f"cache_dir={tmp_path}", "threads=1"]
    result = CliRunner().invoke(main, ["train", *args])
    assert result.exit_code == 0, result.output
    (path,) = (tmp_path / "checkpoints" / "digits" / "small_cnn").glob("rse-*.pt")
    cfg = compose_config("train", args)
    assert path == cache_entry(target_spec(cfg))
    other = compose_config("train", [*args, "defense.recipe.inner_noise=0.05"])
    assert cache_entry(target_spec(other)) != path, "another noise level is another checkpoint"
    model = wrap(build_model("small_cnn", 10, 1), wrapper_spec(cfg.defense.wrapper), seed=0)
    meta = load_checkpoint(path, model.model)
    assert meta["recipe"] == "rse" and meta["config"]["recipe"]["init_noise"] == 0.2 and meta["clean_accuracy"] > 0.5
    assert (model.init_noise, model.inner_noise, model.ensemble) == (0.2, 0.1, 10)


@pytest.mark.slow
def test_rse_trains_a_vgg16_on_tiny_cifar(tmp_path: Path, fake_cifar_root: Path) -> None:
    cfg = compose_config("train", ["dataset=cifar10", f"dataset.root={fake_cifar_root}", "model=vgg16", "defense=rse"])
    dataset = hydra.utils.instantiate(cfg.dataset)
    recipe = Recipe.from_config({**dict(cfg.defense.recipe), "epochs": 1, "batch_size": 20})
    meta = train_defense(dataset, model_spec(cfg.model), recipe, tmp_path / "rse.pt", progress=False)
    assert meta["recipe"] == "rse" and meta["architecture"] == "vgg16"
    model = wrap(build_model("vgg16", 10, 3), wrapper_spec(dict(cfg.defense.wrapper, ensemble=2)), seed=0)
    load_checkpoint(tmp_path / "rse.pt", model.model)
    assert len(inner_convolutions(model.model)) == 12
    assert model(torch.rand(2, 3, 32, 32)).shape == (2, 10)
