"""Users' own models on the command line: `model=torchvision model.arch=...` and `model=python model.target=...`.

Each kind runs a white-box, a score-based and a decision-based cell end to end on a few
samples (torchvision's resnet18 on fake CIFAR-10 files, a small net from a file in the test's
folder on digits), checks the records' invariant and the `model_label` column, and that what
a user can get wrong is one line.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
import torch
from click.testing import CliRunner
from hydra.utils import instantiate
from omegaconf import OmegaConf
from torchvision import models as tv

from advbench.cli.config import compose_config
from advbench.cli.main import main
from advbench.cli.spec_builder import cell_spec, model_spec, target_spec
from advbench.core.errors import AdvbenchError
from advbench.core.user_code import resolve_target
from advbench.robustness.evaluation.cell import build_threat, cell_identity, cell_key, model_label
from advbench.robustness.models import Classifier
from advbench.robustness.models.torchvision_nets import torchvision_net
from advbench.robustness.models.user_models import torchvision_archs
from advbench.robustness.targets import load_target

pytestmark = pytest.mark.usefixtures("one_thread")
IMAGENET = (torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1), torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1))
TINY = ["search.enabled=false", "threads=1", "batch_size=8"]
CELLS = {
    "white": ["attack=bim", "attack.params.steps=2"],
    "score": ["attack=square", "attack.params.n_queries=20", "threat=linf_score"],
    "decision": ["attack=hsj", "attack.params.max_queries=50", "attack.params.init_evals=10",
                 "attack.params.max_evals=20", "attack.params.checkpoints=[50]", "threat=l2_decision"],
}


def _run(argv: list[str]) -> tuple[int, list[str]]:
    result = CliRunner().invoke(main, ["run", *argv])
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert "Traceback" not in result.output, result.output
    return result.exit_code, lines


def _error(argv: list[str]) -> str:
    code, lines = _run(argv)
    errors = [ln for ln in lines if ln.startswith("Error:")]
    assert code == 1 and len(errors) == 1, lines
    return errors[0]


def _records(out: Path) -> pd.DataFrame:
    parts = sorted((out / "records").glob("*.parquet"))
    return pd.concat([pd.read_parquet(p).assign(part=p.name) for p in parts], ignore_index=True)


def _check_records(frame: pd.DataFrame, cells: int) -> None:
    assert frame["part"].nunique() == cells and set(frame["knowledge"]) == {"white", "score", "decision"}
    assert (frame["success_at_budget"] == (frame["min_eps"] <= frame["eps_budget"])).all(), \
        "success_at_budget ⇔ min_eps <= eps_budget"


# ---------------------------------------------------------------- model=torchvision


@pytest.fixture()
def resnet18_file(tmp_path: Path) -> tuple[Path, torch.nn.Module]:
    torch.manual_seed(0)
    net = tv.resnet18(weights=None, num_classes=10).eval()
    path = tmp_path / "resnet18.pth"
    torch.save(net.state_dict(), path)
    return path, net


def test_torchvision_net_from_a_state_dict_gives_its_logits(resnet18_file, fake_cifar_root: Path, tmp_path: Path) -> None:
    path, net = resnet18_file
    wrapped = tmp_path / "wrapped.pth"
    torch.save({"state_dict": {f"module.{k}": v for k, v in net.state_dict().items()}}, wrapped)
    x = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        expected = net((x - IMAGENET[0]) / IMAGENET[1])
    common = ["model=torchvision", "model.arch=resnet18", "dataset=cifar10", f"dataset.root={fake_cifar_root}"]
    for weights in (f"checkpoint={path}", f"checkpoint={wrapped}", f"model.weights_path={path}"):
        cfg = compose_config("config", [*common, weights])
        dataset = instantiate(cfg.dataset)
        with torch.no_grad():
            torch.testing.assert_close(load_target(target_spec(cfg), dataset)(x), expected, rtol=0, atol=0)


def test_torchvision_cells_end_to_end(resnet18_file, fake_cifar_root: Path, tmp_path: Path) -> None:
    path, _ = resnet18_file
    out = tmp_path / "out"
    common = ["model=torchvision", "model.arch=resnet18", f"checkpoint={path}", "dataset=cifar10",
              f"dataset.root={fake_cifar_root}", f"out_dir={out}", *TINY]
    for cell in CELLS.values():
        code, lines = _run([*common, *cell])
        assert code == 0, lines
    frame = _records(out)
    _check_records(frame, 3)
    assert len(frame) == 3 * 4 and set(frame["model"]) == {"torchvision"} and set(frame["model_label"]) == {"resnet18"}


def test_torchvision_errors_are_one_line(resnet18_file, fake_cifar_root: Path, tmp_path: Path) -> None:
    path, _ = resnet18_file
    common = ["model=torchvision", "dataset=cifar10", f"dataset.root={fake_cifar_root}", f"out_dir={tmp_path / 'out'}",
              "attack=fgsm", *TINY]
    assert _error([*common, "model.arch=resnet19", f"checkpoint={path}"]).startswith(
        "Error: unknown torchvision architecture 'resnet19'; close matches: resnet18")
    assert "needs model.arch" in _error([*common, f"checkpoint={path}"])
    torch.save(tv.resnet18(weights=None, num_classes=5).state_dict(), tmp_path / "five.pth")
    assert _error([*common, "model.arch=resnet18", f"checkpoint={tmp_path / 'five.pth'}"]) == (
        f"Error: state dict '{tmp_path / 'five.pth'}' does not fit resnet18: key 'fc.weight' has shape (5, 512) "
        "in the file, (10, 512) in the model")
    torch.save(tv.resnet34(weights=None, num_classes=10).state_dict(), tmp_path / "r34.pth")
    assert "does not fit resnet18: key 'layer1.2.conv1.weight' in the file is not in the model" in _error(
        [*common, "model.arch=resnet18", f"checkpoint={tmp_path / 'r34.pth'}"])
    no_weights = _error([*common, "model.arch=resnet18", f"cache_dir={tmp_path / 'cache'}"])
    assert "model=torchvision model.arch=resnet18" in no_weights and "checkpoint=<file>" in no_weights


def test_every_torchvision_classifier_builds_for_the_data_set_s_classes() -> None:
    """Built on the meta device (no memory, no initialisation); torchvision's RegNets compute
    their widths with tensors and cannot be, so the smallest is built on the CPU."""
    names = torchvision_archs()
    assert len(names) > 50 and {"resnet18", "vit_b_16", "convnext_tiny", "googlenet", "inception_v3"} <= set(names)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in names:
            if name.startswith("regnet"):
                continue
            with torch.device("meta"):
                net = torchvision_net(name, 7, 3)
            last = [m for m in net.modules() if isinstance(m, (torch.nn.Linear, torch.nn.Conv2d))][-1]
            assert (last.out_features if isinstance(last, torch.nn.Linear) else last.out_channels) == 7, name
        assert torchvision_net("regnet_x_400mf", 7, 3).fc.out_features == 7


def test_user_model_yamls_instantiate_with_their_required_key(user_folder: Path) -> None:
    conf = Path(__file__).resolve().parents[1] / "conf" / "model"
    for name, key, value, arch in (("torchvision", "arch", "resnet18", "resnet18"), ("python", "target", "my_net:Net", "my_net:Net")):
        cfg = OmegaConf.load(conf / f"{name}.yaml")
        assert cfg.name == name and cfg[key] is None and cfg.input_size == 224
        cfg[key] = value
        model = model_spec(cfg).build(num_classes=10, in_channels=3 if name == "torchvision" else 1)
        assert isinstance(model, Classifier) and model.arch == arch and model.randomized is False


# ---------------------------------------------------------------- model=python

NET_SOURCE = '''
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, width=4, classes=10):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(1, width, 3, padding=1), nn.ReLU(), nn.Flatten(),
                                  nn.Linear(width * 64, classes))

    def forward(self, x):
        return self.body(x)


class Noisy(Net):
    def forward(self, x):
        return super().forward(x + 0.1 * torch.randn_like(x))


class Wide(Net):
    def forward(self, x):
        return super().forward(torch.cat([x, x], dim=3))


def make(width=4):
    return Net(width)


def not_a_model():
    return "a string"


NUMBER = 3
'''


@pytest.fixture()
def user_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The test's folder as the working folder, holding `my_net.py`; sys.path and sys.modules restored."""
    (tmp_path / "my_net.py").write_text(NET_SOURCE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:
        if name == "my_net" or name.startswith("advbench_user_"):
            del sys.modules[name]


def _python(target: str, *more: str) -> list[str]:
    return ["model=python", f"model.target={target}", "dataset.n_samples=8", "out_dir=out", *TINY, *more]


def test_python_cells_end_to_end(user_folder: Path) -> None:
    torch.manual_seed(0)
    state = resolve_target("my_net:Net")(width=6).state_dict()
    torch.save(state, user_folder / "mine.pt")
    runs = [_python("my_net:Net", "model.kwargs={width:6}", "checkpoint=mine.pt", *CELLS["white"]),
            _python("my_net.py:make", "model.kwargs={width:6}", "checkpoint=mine.pt", *CELLS["score"]),
            _python("my_net:Net", "model.mean=[0.5]", "model.std=[0.25]", "label=mine", *CELLS["decision"])]
    for argv in runs:
        code, lines = _run(argv)
        assert code == 0, lines
    frame = _records(user_folder / "out")
    _check_records(frame, 3)
    assert any(ln.startswith("digits/mine/hsj l2 untargeted ε=0.8 (decision): clean") for ln in lines), lines
    labels = frame.groupby("knowledge")["model_label"].first().to_dict()
    assert labels == {"white": "my_net:Net", "score": "my_net.py:make", "decision": "mine"}
    assert set(frame["model"]) == {"python"} and set(frame["judge_draws"]) == {1}


def test_python_model_loads_its_checkpoint_and_normalises(user_folder: Path) -> None:
    torch.manual_seed(1)
    net = resolve_target("my_net:Net")().eval()
    torch.save({"state_dict": {f"module.{k}": v for k, v in net.state_dict().items()}}, user_folder / "w.pt")
    cfg = compose_config("config", _python("my_net:Net", "checkpoint=w.pt", "model.mean=[0.5]", "model.std=[0.25]"))
    x = torch.rand(3, 1, 8, 8)
    with torch.no_grad():
        got, expected = load_target(target_spec(cfg), instantiate(cfg.dataset))(x), net((x - 0.5) / 0.25)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    own = compose_config("config", _python("my_net:Net"))  # the factory's weights: seeded, the same on every run
    state = torch.get_rng_state()
    first, second = (load_target(target_spec(own), instantiate(own.dataset)) for _ in range(2))
    with torch.no_grad():
        torch.testing.assert_close(first(x), second(x), rtol=0, atol=0)
    assert torch.equal(state, torch.get_rng_state()), "building leaves torch's global RNG alone"


def test_randomized_python_model_is_judged_by_a_vote(user_folder: Path) -> None:
    code, lines = _run(_python("my_net:Noisy", "model.randomized=true", "judge.draws=3", *CELLS["white"]))
    assert code == 0, lines
    frame = _records(user_folder / "out")
    assert set(frame["judge_draws"]) == {3} and frame["flag_randomized"].all()
    cfg = compose_config("config", _python("my_net:Noisy", "model.randomized=true", "judge.draws=3"))
    assert cell_identity(cell_spec(cfg), build_threat(cell_spec(cfg), {"linf": 0.2}), instantiate(cfg.attack.params))["judge_draws"] == 3


def _key(overrides: list[str]) -> str:
    cfg = compose_config("config", overrides)
    return cell_key(cell_identity(cell_spec(cfg), build_threat(cell_spec(cfg), {"linf": 0.2}), instantiate(cfg.attack.params)))


def test_cell_key_covers_target_kwargs_source_and_checkpoint_not_the_label(user_folder: Path) -> None:
    torch.save({"w": torch.zeros(1)}, user_folder / "a.pt")
    torch.save({"w": torch.ones(1)}, user_folder / "b.pt")
    base = _key(_python("my_net:Net"))
    assert base == _key(_python("my_net:Net", "label=renamed"))
    assert len({base, _key(_python("my_net:make")), _key(_python("my_net:Net", "model.kwargs={width:5}")),
                _key(_python("my_net:Net", "checkpoint=a.pt")), _key(_python("my_net:Net", "checkpoint=b.pt"))}) == 5
    (user_folder / "my_net.py").write_text(NET_SOURCE + "\n# edited\n")
    assert _key(_python("my_net:Net")) != base and _key(_python("my_net.py:Net")) != base


def test_python_errors_are_one_line(user_folder: Path) -> None:
    torch.save({"body.0.weight": torch.zeros(4, 1, 3, 3)}, user_folder / "part.pt")
    torch.save(torch.nn.Linear(3, 3).state_dict(), user_folder / "other.pt")
    fgsm = ["attack=fgsm"]
    cases = {
        "nowhere:Net": "model.target 'nowhere:Net': no module named 'nowhere' (from the working folder",
        "my_net:Nett": "model.target 'my_net:Nett': 'my_net' has no attribute 'Nett'; did you mean Net",
        "missing.py:Net": "model.target 'missing.py:Net': file '",
        "my_net.Net": "model.target must be <module>:<attr> or <path/to/file.py>:<attr>",
        "my_net:NUMBER": "model.target 'my_net:NUMBER' is an object of type int, not an nn.Module class or factory",
        "my_net:not_a_model": "model.target 'my_net:not_a_model' returned an object of type str, not a torch.nn.Module",
    }
    for target, needle in cases.items():
        assert needle in _error(_python(target, *fgsm)), target
    assert "does not take model.kwargs {'depth': 3}" in _error(_python("my_net:Net", "model.kwargs={depth:3}", *fgsm))
    assert "must return logits (N, 10) for the data set's 10 classes; on a batch of 2 1x8x8 images it returned (2, 3)" \
        in _error(_python("my_net:Net", "model.kwargs={classes:3}", *fgsm))
    assert "model mean has 3 entries, expected 1 or 1 (in_channels)" in _error(
        _python("my_net:Net", "model.mean=[0.5,0.5,0.5]", "model.std=[1]", *fgsm))
    assert "fails on the data set's 1x8x8 input: RuntimeError: mat1 and mat2 shapes cannot be multiplied" in _error(
        _python("my_net:Wide", *fgsm))
    assert _error(_python("my_net:Net", "checkpoint=part.pt", *fgsm)) == (
        "Error: state dict 'part.pt' does not fit my_net:Net: key 'body.0.bias' is missing from the file")
    assert "does not fit my_net:Net: key 'body.0.weight' is missing" in _error(_python("my_net:Net", "checkpoint=other.pt", *fgsm))
    assert "model=python needs model.target" in _error(["model=python", "out_dir=out", *fgsm])


# ---------------------------------------------------------------- label=


def test_model_label_defaults_and_override() -> None:
    assert model_label(cell_spec(compose_config("config", []))) == "natural"
    assert model_label(cell_spec(compose_config("config", ["defense=pgd_at"]))) == "pgd_at"
    assert model_label(cell_spec(compose_config("config", ["label=my robust net"]))) == "my robust net"
    assert model_label(cell_spec(compose_config("config", ["model=torchvision", "model.arch=vgg11"]))) == "vgg11"
    with pytest.raises(AdvbenchError, match=r"label must be text or null, got \[1, 2\]"):
        compose_config("config", ["label=[1,2]"])
    with pytest.raises(AdvbenchError, match=r"model.kwargs must be a mapping, e.g. model.kwargs=\{width:32\}; got 3"):
        compose_config("config", ["model=python", "model.kwargs=3"])
    with pytest.raises(AdvbenchError, match="unknown torchvision architecture 'resnet_18'; close matches: resnet18"):
        compose_config("config", ["model=torchvision", "model.arch=resnet_18"])
