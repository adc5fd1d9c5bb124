"""Model zoo and checkpoints: every architecture, normalisation inside, safe loading."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from torchvision import models as tv

from advbench.cli.spec_builder import model_spec
from advbench.core.errors import AdvbenchError
from advbench.robustness.models import ARCHITECTURES, build_model
from advbench.robustness.models.checkpoint_files import load_checkpoint, save_checkpoint

CONF = Path(__file__).resolve().parents[1] / "conf" / "model"
# Small inputs (and a tiny WRN) keep the whole catalogue under a few seconds.
CASES = {
    "small_cnn": dict(in_channels=1, size=8, options={}),
    "resnet56": dict(in_channels=3, size=32, options={}),
    "resnet110": dict(in_channels=3, size=32, options={}),
    "wrn34_10": dict(in_channels=3, size=32, options={"depth": 10, "widen_factor": 2}),
    "wrn28_10": dict(in_channels=3, size=32, options={"depth": 10, "widen_factor": 2}),
    "preact_resnet18": dict(in_channels=3, size=32, options={"width": 8}),
    "vgg16": dict(in_channels=3, size=32, options={"depth": 11}),
    "ibp_large": dict(in_channels=3, size=32, options={"width": 4, "hidden": 16}),
    "inception_v3": dict(in_channels=3, size=75, options={}),
    "resnet50": dict(in_channels=3, size=32, options={}),
    "resnet152": dict(in_channels=3, size=32, options={}),
}
INPUT_SIZES = {"small_cnn": 8, "resnet56": 32, "resnet110": 32, "wrn34_10": 32, "wrn28_10": 32, "preact_resnet18": 32, "vgg16": 32,
               "ibp_large": 32, "inception_v3": 299, "resnet50": 224, "resnet152": 224}
META = {
    "dataset": "digits",
    "architecture": "small_cnn",
    "recipe": "natural",
    "clean_accuracy": 0.5,
    "config": {"model": {"arch": "small_cnn"}, "seed": 0},
    "created_at": "2026-01-01T00:00:00+00:00",
    "advbench_version": "0.1.0",
}


pytestmark = pytest.mark.usefixtures("one_thread")


def test_every_architecture_has_a_case() -> None:
    assert set(CASES) == set(ARCHITECTURES)


@pytest.mark.parametrize("arch", sorted(CASES))
def test_forward_backward_in_pixel_space(arch: str) -> None:
    case = CASES[arch]
    torch.manual_seed(0)
    model = build_model(arch, num_classes=7, in_channels=case["in_channels"], **case["options"]).eval()
    assert model.bounds == (0.0, 1.0) and model.randomized is False and model.arch == arch
    x = torch.rand(2, case["in_channels"], case["size"], case["size"], requires_grad=True)
    logits = model(x)
    assert logits.shape == (2, 7)
    (grad,) = torch.autograd.grad(logits[:, 0].sum(), x)
    assert torch.isfinite(grad).all() and grad.abs().sum() > 0
    with torch.no_grad():
        torch.testing.assert_close(model(x), model.net((x - model.mean) / model.std))


def test_paper_sizes_of_the_cifar_networks() -> None:
    """ResNet-56 has ~0.85M parameters, WRN-34-10 ~46.2M (as published)."""
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(build_model("resnet56", 10, 3)) == pytest.approx(0.853e6, rel=0.01)
    assert count(build_model("wrn34_10", 10, 3)) == pytest.approx(46.16e6, rel=0.01)
    assert count(build_model("vgg16", 10, 3)) == pytest.approx(14.73e6, rel=0.01)  # RSE's CIFAR-10 VGG-16


# The registry's options; `torchvision` and `python` (users' models) are tested in test_user_models.py.
REGISTRY_YAMLS = [p for p in sorted(CONF.glob("*.yaml")) if OmegaConf.load(p)._target_ == "advbench.robustness.models.build_model"]


@pytest.mark.parametrize("yaml_file", REGISTRY_YAMLS, ids=lambda p: p.stem)
def test_model_yaml_instantiates(yaml_file: Path) -> None:
    cfg = OmegaConf.load(yaml_file)
    if cfg.arch in ("wrn34_10", "wrn28_10"):
        cfg.depth, cfg.widen_factor = 10, 1
    model = model_spec(cfg).build(num_classes=10, in_channels=1 if cfg.arch == "small_cnn" else 3)
    assert cfg.name == yaml_file.stem and model.arch == cfg.arch
    assert cfg.input_size == INPUT_SIZES[cfg.arch]


def test_registry_errors() -> None:
    with pytest.raises(AdvbenchError, match="unknown model architecture 'vgg'; valid: ibp_large, inception_v3"):
        build_model("vgg", 10, 3)
    with pytest.raises(AdvbenchError, match="bad options for model 'small_cnn'"):
        build_model("small_cnn", 10, 1, depth=3)
    with pytest.raises(AdvbenchError, match="expects 3-channel input, but the data set has 1 channel"):
        build_model("resnet56", 10, 1)
    with pytest.raises(AdvbenchError, match="depth must be 6n \\+ 2"):
        build_model("resnet56", 10, 3, depth=20 + 1)
    with pytest.raises(AdvbenchError, match="depth must be 6n \\+ 4"):
        build_model("wrn34_10", 10, 3, depth=12)
    with pytest.raises(AdvbenchError, match="3-channel"):
        build_model("resnet50", 10, 1, mean=[0.5], std=[0.5])


# ---------------------------------------------------------------- torchvision weights


def test_local_weights_load_and_inception_aux_head_is_dropped(tmp_path: Path) -> None:
    torch.manual_seed(0)
    reference = tv.inception_v3(weights=None, aux_logits=True, init_weights=False, num_classes=5)
    path = tmp_path / "inception.pth"
    torch.save(reference.state_dict(), path)
    model = build_model("inception_v3", num_classes=5, in_channels=3, weights_path=str(path)).eval()
    reference.eval()
    x = torch.rand(1, 3, 75, 75)
    with torch.no_grad():
        # torchvision's transform_input maps ImageNet-normalised input to (x - 0.5) / 0.5.
        expected = reference((x - 0.5) / 0.5)
    torch.testing.assert_close(model(x), expected)


def test_weights_errors(tmp_path: Path) -> None:
    with pytest.raises(AdvbenchError, match=r"`advbench weights fetch resnet50` \(or download "
                                            r"https://download.pytorch.org/models/resnet50-0676ba61.pth\) "
                                            r"and set model.weights_path"):
        build_model("resnet50", 1000, 3, weights_path=str(tmp_path / "absent.pth"))
    wrong = tmp_path / "wrong.pth"
    torch.save(tv.resnet50(weights=None, num_classes=10).state_dict(), wrong)
    with pytest.raises(AdvbenchError, match=r"key 'fc.weight' has shape \(10, 2048\) in the file, \(1000, 2048\)"):
        build_model("resnet50", 1000, 3, weights_path=str(wrong))


# ---------------------------------------------------------------- checkpoints


def test_checkpoint_round_trip(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = build_model("small_cnn", 10, 1)
    path = save_checkpoint(tmp_path / "sub" / "m.pt", model, META)
    assert os.listdir(path.parent) == ["m.pt"]
    fresh = build_model("small_cnn", 10, 1)
    x = torch.rand(3, 1, 8, 8)
    assert not torch.allclose(fresh(x), model(x))
    meta = load_checkpoint(path, fresh)
    assert meta == META
    torch.testing.assert_close(fresh(x), model(x))


def test_checkpoint_meta_must_be_complete(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="clean_accuracy"):
        save_checkpoint(tmp_path / "m.pt", build_model("small_cnn", 10, 1), {k: v for k, v in META.items() if k != "clean_accuracy"})
    assert not list(tmp_path.iterdir())


def test_missing_checkpoint_names_the_train_command(tmp_path: Path) -> None:
    command = "advbench train dataset=digits model=small_cnn defense=pgd_at"
    with pytest.raises(AdvbenchError) as err:
        load_checkpoint(tmp_path / "none.pt", build_model("small_cnn", 10, 1), make_command=command)
    assert str(err.value) == f"checkpoint '{tmp_path / 'none.pt'}' not found; create it with: {command}"


def test_architecture_mismatch_names_file_archs_key_and_shapes(tmp_path: Path) -> None:
    path = save_checkpoint(tmp_path / "cnn.pt", build_model("small_cnn", 10, 1), META)
    with pytest.raises(AdvbenchError) as err:
        load_checkpoint(path, build_model("resnet56", 10, 3, depth=8))
    msg = str(err.value)
    assert "cnn.pt" in msg and "'small_cnn', requested 'resnet56'" in msg and "key 'mean'" in msg
    with pytest.raises(AdvbenchError, match=r"key 'net.8.weight' has shape \(10, 128\) in the file, \(4, 128\) in the model"):
        load_checkpoint(path, build_model("small_cnn", 4, 1))
    relabelled = save_checkpoint(tmp_path / "relabelled.pt", build_model("small_cnn", 10, 1), {**META, "architecture": "other"})
    with pytest.raises(AdvbenchError, match="'other', requested 'small_cnn'$"):
        load_checkpoint(relabelled, build_model("small_cnn", 10, 1))


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"this is not a checkpoint", "is not a readable checkpoint"),
        (b"", "is not a readable checkpoint"),
        (None, "is not an advbench checkpoint"),
    ],
    ids=["garbage", "empty", "bare-tensor"],
)
def test_corrupt_or_foreign_files(tmp_path: Path, content: bytes | None, expected: str) -> None:
    path = tmp_path / "bad.pt"
    if content is None:
        torch.save(torch.zeros(3), path)
    else:
        path.write_bytes(content)
    with pytest.raises(AdvbenchError, match=expected) as err:
        load_checkpoint(path, build_model("small_cnn", 10, 1))
    assert "\n" not in str(err.value) and "bad.pt" in str(err.value)


def test_truncated_checkpoint(tmp_path: Path) -> None:
    path = save_checkpoint(tmp_path / "m.pt", build_model("small_cnn", 10, 1), META)
    path.write_bytes(path.read_bytes()[:-200])
    with pytest.raises(AdvbenchError, match="is not a readable checkpoint"):
        load_checkpoint(path, build_model("small_cnn", 10, 1))


def test_checkpoint_cannot_run_code(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (Path.touch, (marker,))

    path = tmp_path / "evil.pt"
    torch.save({"state_dict": {}, "meta": Evil()}, path)
    with pytest.raises(AdvbenchError, match="evil.pt"):
        load_checkpoint(path, build_model("small_cnn", 10, 1))
    assert not marker.exists()


def test_a_plain_state_dict_loads_into_a_bare_module(tmp_path: Path) -> None:
    """A user's own `_target_` may build a module that is not advbench's Classifier; its state dict still loads."""
    from torch import nn

    torch.manual_seed(0)
    source = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
    path = tmp_path / "bare.pt"
    torch.save(source.state_dict(), path)
    target = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
    load_checkpoint(path, target)
    assert all(torch.equal(a, b) for a, b in zip(source.state_dict().values(), target.state_dict().values()))
