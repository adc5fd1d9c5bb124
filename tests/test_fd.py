"""Feature denoising (FD): the non-local-means block, backbones with blocks, PGD-AT training of them."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from torch import nn

from advbench.cli.config import compose_config
from advbench.cli.main import main
from advbench.cli.spec_builder import target_spec
from advbench.core.errors import AdvbenchError
from advbench.robustness.data.digits import Digits
from advbench.robustness.defenses.checkpoint_cache import checkpoint_key
from advbench.robustness.defenses.recipes import LOSSES, Recipe
from advbench.robustness.defenses.trained import load_trained_model
from advbench.robustness.models import build_model
from advbench.robustness.models.checkpoint_files import load_checkpoint
from advbench.robustness.models.denoise import DenoisingBlock

pytestmark = pytest.mark.usefixtures("one_thread")
DENOISE = {"kind": "gaussian", "embed": True, "stages": None}


def _blocks(model: nn.Module) -> list[str]:
    return [name for name, m in model.named_modules() if isinstance(m, DenoisingBlock)]


def _reference_non_local_means(x: torch.Tensor, block: DenoisingBlock) -> torch.Tensor:
    """y_i = Σ_j f(x_i, x_j) x_j / C(x), one sample and one position at a time (the definition)."""
    out = torch.zeros_like(x)
    theta = x if block.theta is None else block.theta(x)
    phi = x if block.phi is None else block.phi(x)
    for n in range(x.shape[0]):
        t, p, g = theta[n].flatten(1), phi[n].flatten(1), x[n].flatten(1)
        for i in range(g.shape[1]):
            scores = t[:, i] @ p
            weights = torch.softmax(scores / t.shape[0] ** 0.5, 0) if block.kind == "gaussian" else scores / g.shape[1]
            out[n].view(g.shape[0], -1)[:, i] = g @ weights
    return out


@pytest.mark.parametrize("kind", ["gaussian", "dot_product"])
@pytest.mark.parametrize("embed", [True, False])
def test_block_keeps_shape_starts_as_identity_and_filters_as_defined(kind: str, embed: bool) -> None:
    torch.manual_seed(0)
    block = DenoisingBlock(6, kind, embed).eval()
    x = torch.randn(3, 6, 5, 4)
    assert block(x).shape == x.shape
    torch.testing.assert_close(block(x), x)  # zero-initialised BN scale: the residual branch is off
    with torch.no_grad():
        torch.testing.assert_close(block.non_local_means(x), _reference_non_local_means(x, block), rtol=1e-4, atol=1e-5)
        block.bn.weight.fill_(1.0)
    assert not torch.allclose(block(x), x)


def test_gradient_reaches_the_input_and_every_block_parameter() -> None:
    torch.manual_seed(0)
    block = DenoisingBlock(4)
    with torch.no_grad():
        block.bn.weight.fill_(0.5)  # as after some training; at zero init only the BN scale gets a gradient
    x = torch.randn(2, 4, 3, 3, requires_grad=True)
    block(x).pow(2).sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
    for name, p in block.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


@pytest.mark.parametrize(
    ("arch", "channels", "size", "options", "expected"),
    [
        ("small_cnn", 1, 8, {}, ["net.2", "net.5"]),
        ("resnet56", 3, 16, {}, ["net.blocks.9", "net.blocks.19", "net.blocks.29"]),
        ("wrn34_10", 3, 16, {"depth": 10, "widen_factor": 1}, [f"net.block{i}.layer.1" for i in (1, 2, 3)]),
        ("preact_resnet18", 3, 16, {"width": 4}, [f"net.layer{i}.2" for i in (1, 2, 3, 4)]),
        pytest.param("resnet152", 3, 32, {}, ["net.layer1.3", "net.layer2.8", "net.layer3.36", "net.layer4.3"],
                     marks=pytest.mark.slow),  # ~60M parameters to initialise: seconds
    ],
    ids=["small_cnn", "resnet56", "wrn", "preact_resnet18", "resnet152"],
)
def test_blocks_after_each_stage_forward_backward(arch: str, channels: int, size: int, options: dict, expected: list[str]) -> None:
    """Digits, CIFAR-10 and ImageNet backbones (ResNet-152 at 32 px): blocks where the stages end."""
    torch.manual_seed(0)
    model = build_model(arch, 5, channels, denoise=DENOISE, **options)
    assert _blocks(model) == expected
    x = torch.rand(2, channels, size, size, requires_grad=True)
    logits = model(x)  # training mode: batch-norm statistics from the batch
    assert logits.shape == (2, 5)
    logits.sum().backward()
    assert x.grad.abs().sum() > 0
    assert all(m.bn.weight.grad.abs().sum() > 0 for m in model.modules() if isinstance(m, DenoisingBlock))
    # Freshly inserted blocks are the identity: the backbone without them computes the same logits.
    backbone = copy.deepcopy(model)
    for name in _blocks(backbone):
        parent, _, child = name.rpartition(".")
        setattr(backbone.get_submodule(parent), child, nn.Identity())
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(x), backbone.eval()(x))


def test_chosen_stages_and_errors() -> None:
    model = build_model("resnet56", 10, 3, depth=8, denoise={"stages": [2], "kind": "dot_product", "embed": False})
    assert _blocks(model) == ["net.blocks.3"] and model.net.blocks[3].theta is None
    with pytest.raises(AdvbenchError, match=r"model.denoise.stages has 3; resnet56 has stages 0..2"):
        build_model("resnet56", 10, 3, depth=8, denoise={"stages": [3]})
    with pytest.raises(AdvbenchError, match="unknown denoising kind 'median'"):
        build_model("small_cnn", 10, 1, denoise={"kind": "median"})
    with pytest.raises(AdvbenchError, match="unknown model.denoise key 'size'"):
        build_model("small_cnn", 10, 1, denoise={"size": 3})
    with pytest.raises(AdvbenchError, match="model 'inception_v3' takes no denoising blocks"):
        build_model("inception_v3", 10, 3, denoise={})


def test_fd_config_is_pgd_at_recipe_on_a_denoised_backbone() -> None:
    fd = compose_config("train", ["defense=fd"])
    pgd_at = compose_config("train", ["defense=pgd_at"])
    assert fd.defense.recipe == pgd_at.defense.recipe and list(fd.defense.category) == ["robust training"]
    assert fd.model.denoise.kind == "gaussian" and "denoise" not in pgd_at.model
    assert checkpoint_key(target_spec(fd)) != checkpoint_key(target_spec(pgd_at))
    cifar = compose_config("config", ["defense=fd", "model=resnet56", "dataset=cifar10"])
    assert cifar.model.depth == 56 and cifar.model.denoise.stages is None


def test_fd_trains_on_a_digits_batch() -> None:
    torch.manual_seed(0)
    model = build_model("small_cnn", 10, 1, denoise=DENOISE)
    recipe = Recipe.from_config({**compose_config("train", ["defense=fd"]).defense.recipe, "steps": 2})
    x, y = _digits_batch(16)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(2):  # the first step opens the zero-initialised BN scales, the second reaches the embeddings
        loss = LOSSES["pgd_at"](model, x, y, recipe)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        assert torch.isfinite(loss)
    changed = {k for k, v in model.state_dict().items() if not torch.equal(v, before[k])}
    assert {"net.0.weight", "net.2.bn.weight", "net.5.bn.weight", "net.2.theta.weight", "net.5.phi.weight"} <= changed


def _digits_batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    data = Digits().train_set(augment=False)
    items = [data[i] for i in range(n)]
    return torch.stack([x for x, _ in items]), torch.tensor([y for _, y in items])


def test_advbench_train_fd_writes_a_checkpoint_with_meta(tmp_path: Path) -> None:
    args = ["defense=fd", "defense.recipe.epochs=1", "defense.recipe.steps=1", "defense.recipe.batch_size=256",
            f"cache_dir={tmp_path}"]
    result = CliRunner().invoke(main, ["train", *args])
    assert result.exit_code == 0, result.output
    (path,) = (tmp_path / "checkpoints" / "digits" / "small_cnn").glob("fd-*.pt")
    cfg = compose_config("train", args)
    model = load_trained_model(target_spec(cfg), Digits())
    assert len(_blocks(model)) == 2
    meta = load_checkpoint(path, build_model("small_cnn", 10, 1, denoise=DENOISE))
    assert meta["recipe"] == "pgd_at" and meta["config"]["model"]["denoise"]["kind"] == "gaussian"
    assert 0.1 < meta["clean_accuracy"] <= 1.0
    with pytest.raises(AdvbenchError, match=r"does not fit the small_cnn .*: key 'net.2.weight' is missing"):
        load_checkpoint(path, build_model("small_cnn", 10, 1))
