"""Checkpoints users already have: RobustBench CIFAR-10 state dicts and torchvision ImageNet weights.

Files are made here from randomly initialised networks saved in each layout. WRN-28-10 has 36M
parameters, so its layout is checked by key names on the meta device, and the files are saved
from width-reduced WRN-28 / PreActResNet-18 variants, which have exactly the same key names.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from click.testing import CliRunner
from torchvision import models as tv

from advbench.cli.config import compose_config
from advbench.cli.main import main
from advbench.cli.spec_builder import target_spec
from advbench.core.errors import AdvbenchError
from advbench.robustness.models import ARCHITECTURES, build_model
from advbench.robustness.models.checkpoint_files import load_checkpoint
from advbench.robustness.targets import load_target

pytestmark = pytest.mark.usefixtures("one_thread")
CIFAR = SimpleNamespace(num_classes=10, input_shape=(3, 32, 32))


def _names(arch: str, **options) -> list[str]:
    """The network's state-dict keys, built on the meta device (no memory, no initialisation)."""
    with torch.device("meta"):
        return list(ARCHITECTURES[arch].build(10, 3, **options).state_dict())


def test_key_layouts_are_robustbench_s() -> None:
    """Names and counts from RobustBench's wide_resnet.py / resnet.py: per block bn1, conv1, bn2, conv2
    (12 entries with BN buffers), a projection on each stage's first block where channels change."""
    wrn = _names("wrn28_10")
    assert len(wrn) == 1 + 12 * 12 + 3 + 5 + 2
    for key in ("conv1.weight", "block1.layer.0.convShortcut.weight", "block3.layer.3.bn2.running_var",
                "block2.layer.0.convShortcut.weight", "bn1.num_batches_tracked", "fc.weight", "fc.bias"):
        assert key in wrn, key
    assert "block1.layer.1.convShortcut.weight" not in wrn
    assert _names("wrn28_10", widen_factor=2) == wrn  # the width-reduced variant the files below use
    trades = _names("wrn34_10", sub_block1=True)
    assert len(trades) == (1 + 15 * 12 + 3 + 5 + 2) + (5 * 12 + 1)  # sub_block1 repeats block1
    assert "sub_block1.layer.4.conv2.weight" in trades and "sub_block1.layer.0.convShortcut.weight" in trades
    preact = _names("preact_resnet18")
    assert len(preact) == 1 + 8 * 12 + 3 + 2
    for key in ("layer1.0.bn1.weight", "layer2.0.shortcut.0.weight", "layer4.1.conv2.weight", "linear.bias"):
        assert key in preact, key
    assert "bn.weight" in _names("preact_resnet18", bn_before_fc=True) and _names("preact_resnet18", width=8) == preact


def _logits(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(x)


def _randomised(model: torch.nn.Module) -> torch.nn.Module:
    """Random BN statistics too, so a buffer that failed to load would show in the logits."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.2, 0.2)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.5, 1.5)
    return model.eval()


@pytest.mark.parametrize(
    ("arch", "options", "wrap"),
    [
        ("wrn28_10", {"widen_factor": 2}, lambda s: {"state_dict": {f"module.{k}": v for k, v in s.items()}}),
        ("wrn34_10", {"depth": 16, "widen_factor": 2, "sub_block1": True}, lambda s: s),
        ("preact_resnet18", {"width": 8, "bn_before_fc": True, "out_shortcut": True}, lambda s: {"state_dict": s}),
        ("preact_resnet18", {"width": 8}, lambda s: {f"module.{k}": v for k, v in s.items()}),
    ],
    ids=["wrn28-module-prefix", "wrn34-sub_block1", "preact-v2", "preact-module-prefix"],
)
def test_robustbench_state_dicts_give_the_saved_logits(tmp_path: Path, arch: str, options: dict, wrap) -> None:
    torch.manual_seed(0)
    saved = _randomised(build_model(arch, 10, 3, mean=[0.0], std=[1.0], **options))
    path = tmp_path / "rb.pt"
    torch.save(wrap(saved.net.state_dict()), path)
    torch.manual_seed(1)
    fresh = build_model(arch, 10, 3, mean=[0.0], std=[1.0], **options)
    x = torch.rand(3, 3, 32, 32)
    assert not torch.allclose(_logits(fresh, x), _logits(saved, x))
    assert load_checkpoint(path, fresh)["format"] == "state dict"
    torch.testing.assert_close(_logits(fresh, x), _logits(saved, x), rtol=0, atol=0)


def test_normalisation_inside_or_outside_the_file(tmp_path: Path) -> None:
    """RobustBench keeps it as `mu`/`sigma` buffers (or `normalize.*` around `model.*`); else the config says."""
    torch.manual_seed(0)
    net = _randomised(build_model("preact_resnet18", 10, 3, width=8, mean=[0.0], std=[1.0])).net
    mu, sigma = torch.tensor([0.3, 0.4, 0.5]).view(1, 3, 1, 1), torch.tensor([0.2, 0.25, 0.3]).view(1, 3, 1, 1)
    x = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        expected = net((x - mu) / sigma)
    inside, wrapped, outside = tmp_path / "inside.pt", tmp_path / "wrapped.pt", tmp_path / "outside.pt"
    torch.save({**net.state_dict(), "mu": mu, "sigma": sigma}, inside)
    torch.save({"normalize.mean": mu, "normalize.std": sigma, **{f"model.{k}": v for k, v in net.state_dict().items()}}, wrapped)
    torch.save(net.state_dict(), outside)
    for path in (inside, wrapped):
        model = build_model("preact_resnet18", 10, 3, width=8, normalization="inside")
        load_checkpoint(path, model)
        torch.testing.assert_close(_logits(model, x), expected)
    model = build_model("preact_resnet18", 10, 3, width=8, mean=[0.3, 0.4, 0.5], std=[0.2, 0.25, 0.3])
    load_checkpoint(outside, model)
    torch.testing.assert_close(_logits(model, x), expected)
    with pytest.raises(AdvbenchError, match=r"key 'mu' in the file is not in the model \(.*set model.normalization=inside\)"):
        load_checkpoint(inside, build_model("preact_resnet18", 10, 3, width=8))
    with pytest.raises(AdvbenchError, match="key 'mu' is missing from the file"):
        load_checkpoint(outside, build_model("preact_resnet18", 10, 3, width=8, normalization="inside"))


def test_config_builds_the_layout_and_the_engine_loads_it(tmp_path: Path) -> None:
    """`model=wrn28_10 checkpoint=...` with the config's normalisation, through the benchmark's loader."""
    torch.manual_seed(0)
    saved = _randomised(build_model("wrn28_10", 10, 3, widen_factor=2, mean=[0.0], std=[1.0]))
    path = tmp_path / "Carmon2019Unlabeled.pt"
    torch.save(saved.net.state_dict(), path)
    cfg = compose_config("config", ["dataset=cifar10", "model=wrn28_10", "model.widen_factor=2", f"checkpoint={path}",
                                    "model.mean=[0]", "model.std=[1]"])
    model = load_target(target_spec(cfg), CIFAR)
    x = torch.rand(2, 3, 32, 32)
    torch.testing.assert_close(_logits(model, x), _logits(saved, x))


def test_torchvision_weights_by_path(tmp_path: Path) -> None:
    torch.manual_seed(0)
    reference = _randomised(tv.resnet50(weights=None, num_classes=4))
    path = tmp_path / "resnet50.pth"
    torch.save(reference.state_dict(), path)
    x = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        expected = reference((x - torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)) / torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1))
    model = build_model("resnet50", 4, 3)  # `model.weights_path=` takes the same file (test_models)
    load_checkpoint(path, model)
    torch.testing.assert_close(_logits(model, x), expected)


def test_mismatch_is_one_line_naming_the_key_through_the_cli(tmp_path: Path) -> None:
    net = build_model("small_cnn", 10, 1).net
    state = {k: v for k, v in net.state_dict().items() if k != "2.bias"}
    path = tmp_path / "theirs.pt"
    torch.save(state, path)
    argv = ["run", "attack=fgsm", "dataset.n_samples=4", f"checkpoint={path}", f"out_dir={tmp_path / 'out'}"]
    result = CliRunner().invoke(main, argv)
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert lines == [f"Error: state dict '{path}' does not fit small_cnn: key '2.bias' is missing from the file"]


def test_another_defenses_checkpoint_at_a_cache_path_is_refused(tmp_path: Path, monkeypatch) -> None:
    """An RSE checkpoint copied over the natural model's cache entry loads without a key mismatch; its meta gives it away."""
    import shutil

    import hydra.utils

    from advbench.robustness.defenses.checkpoint_cache import cache_entry
    from advbench.robustness.defenses.trained import ensure_checkpoint, load_trained_model

    cache = [f"cache_dir={tmp_path}", "defense.recipe.epochs=1"]
    natural = compose_config("config", ["defense=natural", *cache])
    rse = compose_config("config", ["defense=rse", *cache])
    shutil.copy(ensure_checkpoint(target_spec(rse)), cache_entry(target_spec(natural)))
    dataset = hydra.utils.instantiate(natural.dataset)
    with pytest.raises(AdvbenchError) as caught:
        load_trained_model(target_spec(natural), dataset)
    message = str(caught.value)
    assert "was trained as rse on digits, not natural on digits" in message and "\n" not in message


def test_random_bytes_at_a_cache_path_are_not_a_checkpoint(tmp_path: Path) -> None:
    from advbench.core.torchfile import read_torch_file

    path = tmp_path / "noise.pt"
    path.write_bytes(bytes(range(7, 200)))
    with pytest.raises(AdvbenchError, match="is not a readable checkpoint: it is not a file torch.save writes") as caught:
        read_torch_file(path, "checkpoint")
    assert "pickled" not in str(caught.value)
