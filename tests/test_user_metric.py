"""A quality metric advbench has never seen, attacked per image: `advbench.evaluate_metric` on a module
object and `advbench iqa run metric=python metric.target=<file.py>:<attr>` on a file and its state dict."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from click.testing import CliRunner
from test_cli import assert_one_line_error

import advbench
from advbench.cli.main import main
from advbench.core.caller_state import caller_state_kept
from advbench.core.errors import AdvbenchError
from advbench.core.records import read_kind
from advbench.core.user_code import resolve_target

pytestmark = pytest.mark.usefixtures("one_thread")

METRIC_SOURCE = '''
import torch
from torch import nn


class Net(nn.Module):
    """A tiny learned metric: a conv layer, a spatial mean and a linear head, one score per image."""

    def __init__(self, width=4):
        super().__init__()
        self.conv = nn.Conv2d(3, width, 3, padding=1)
        self.head = nn.Linear(width, 1)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return self.head(self.drop(torch.tanh(self.conv(x)).mean(dim=(2, 3))))[:, 0]


class Sharpness(nn.Module):
    """A hand-written score: the mean absolute Laplacian of the grey image (sharper is better)."""

    def forward(self, x):
        grey = x.mean(dim=1, keepdim=True)
        kernel = torch.tensor([[0.0, 1.0, 0.0], [1.0, -4.0, 1.0], [0.0, 1.0, 0.0]]).view(1, 1, 3, 3)
        return torch.nn.functional.conv2d(grey, kernel).abs().mean(dim=(1, 2, 3))


class Detached(nn.Module):
    def forward(self, x):
        return x.detach().mean(dim=(1, 2, 3))


class Column(nn.Module):
    def forward(self, x):
        return x.mean(dim=(1, 2, 3))[:, None]


class Nan(nn.Module):
    def forward(self, x):
        return x.mean(dim=(1, 2, 3)) * float("nan")
'''
EPS = [1 / 255, 4 / 255]
TINY = ["n_images=2", "size=16", "eps=[0.00392156862745098,0.01568627450980392]", "progress=false", "threads=1",
        "out_dir=out"]


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working folder with `mymetric.py` and two state dicts of its `Net` (`a.pt`, `b.pt`)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mymetric.py").write_text(METRIC_SOURCE)
    net = resolve_target("mymetric.py:Net", "metric")
    for seed, name in ((1, "a.pt"), (2, "b.pt")):
        torch.manual_seed(seed)
        torch.save(net().state_dict(), tmp_path / name)
    return tmp_path


def _images(n: int = 3, side: int = 16) -> torch.Tensor:
    return torch.rand(n, 3, side, side, generator=torch.Generator().manual_seed(0))


def _net(folder: Path, weights: str = "a.pt") -> torch.nn.Module:
    net = resolve_target("mymetric.py:Net", "metric")()
    net.load_state_dict(torch.load(folder / weights, weights_only=True))
    return net


# ---------------------------------------------------------------- from Python


def test_evaluate_metric_attacks_the_metric_the_way_it_says_is_better(folder: Path) -> None:
    net, x = _net(folder).eval(), _images()
    frame = advbench.evaluate_metric(net, x, eps=EPS, out_dir=folder / "up")
    assert len(frame) == 3 * 2 and sorted(frame["image_id"].unique()) == [0, 1, 2]
    with torch.no_grad():
        expected = net(x).double().numpy()
    clean = frame.sort_values("sample_id").groupby("image_id")["score_clean"].first().to_numpy()
    assert clean == pytest.approx(expected, rel=1e-5)
    assert (frame["linf"] <= frame["eps"] + 1e-6).all() and (frame["iterations"] == 10).all()
    assert (frame["score_attacked"] > frame["score_clean"]).mean() > 0.5, "I-FGSM raises a higher-better score"
    assert set(frame["metric"]) == {"Net"} and frame["score_lo"].isna().all() and set(frame["higher_better"]) == {True}
    down = advbench.evaluate_metric(advbench.Metric(net, higher_better=False, score_range=(-5, 5), label="net_down"), x, eps=EPS)
    assert (down["score_attacked"] < down["score_clean"]).mean() > 0.5, "and lowers a lower-better one"
    assert set(down["score_lo"]) == {-5.0} and set(down["metric"]) == {"net_down"}
    again = advbench.evaluate_metric(net, x, eps=EPS, out_dir=folder / "up")
    pd.testing.assert_frame_equal(again, frame)  # the part exists: read back, not recomputed
    written = advbench.plot(pd.concat([frame, down]), out=folder / "figs")
    assert {p.name for p in written} >= {"msu_scores.csv", "ranking.md", "gain_vs_eps.png"}


def test_a_folder_of_images_and_a_hand_written_score(folder: Path) -> None:
    from PIL import Image

    (folder / "photos").mkdir()
    for i in range(2):
        pixels = (_images(1, 24)[0].permute(1, 2, 0) * 255).to(torch.uint8).numpy()
        Image.fromarray(pixels).save(folder / "photos" / f"{i}.png")
    sharp = resolve_target("mymetric.py:Sharpness", "metric")()
    frame = advbench.evaluate_metric(sharp, folder / "photos", attack="fgsm", eps=[2 / 255], size=16)
    assert len(frame) == 2 and set(frame["size"]) == {16} and set(frame["data"]) == {str((folder / "photos").resolve())}
    assert (frame["score_attacked"] > frame["score_clean"]).all() and set(frame["iterations"]) == {1}


def test_the_module_is_handed_back_as_it_came(folder: Path) -> None:
    net = _net(folder).train()
    net.conv.bias.requires_grad_(False)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    params = list(net.parameters())
    advbench.evaluate_metric(net, _images(2), attack="fgsm", eps=[1 / 255])
    assert all(m.training for m in net.modules())
    assert [p.requires_grad for p in net.parameters()] == [True, False, True, True]
    assert all(a is b for a, b in zip(net.parameters(), params))
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())
    with pytest.raises(AdvbenchError, match="unknown attack 'nope'"):
        advbench.evaluate_metric(net.eval(), _images(2), attack="nope")
    assert not any(m.training for m in net.modules()) and net.conv.weight.requires_grad


def test_moved_tensors_come_back_as_the_same_objects(folder: Path) -> None:
    """`.to()` inside the call (a device, here a dtype: the same `_apply`) is undone, parameters and buffers alike."""
    net = torch.nn.Sequential(_net(folder), torch.nn.BatchNorm2d(3)).train()
    params, buffers = list(net.parameters()), [b.data_ptr() for b in net.buffers()]
    before = {k: v.clone() for k, v in net.state_dict().items()}
    with caller_state_kept(net, "cpu"):
        net.to(torch.float64).eval().requires_grad_(False)
        assert net[1].running_mean.dtype == torch.float64
    assert all(a is b for a, b in zip(net.parameters(), params)) and all(p.requires_grad for p in params)
    assert [b.data_ptr() for b in net.buffers()] == buffers and all(m.training for m in net.modules())
    assert all(v.dtype == before[k].dtype and torch.equal(v, before[k]) for k, v in net.state_dict().items())


def test_dropout_is_off_while_scored(folder: Path) -> None:
    """A training-mode module is scored in eval mode: its scores are reproducible, its dropout silent."""
    net, x = _net(folder), _images(2)
    frame = advbench.evaluate_metric(net.train(), x, attack="fgsm", eps=[1 / 255])
    with torch.no_grad():
        expected = net.eval()(x).double().numpy()
    assert frame.sort_values("image_id")["score_clean"].to_numpy() == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize(("name", "says"), [
    ("Detached", "is not differentiable w.r.t. its input images"),
    ("Column", "must return one score per image, shape (2,); on 2 images of 3x16x16 it returned (2, 1)"),
    ("Nan", "returned non-finite scores on real images"),
])
def test_a_metric_breaking_the_contract_is_one_error(folder: Path, name: str, says: str) -> None:
    metric = resolve_target(f"mymetric.py:{name}", "metric")()
    with pytest.raises(AdvbenchError, match=None) as caught:
        advbench.evaluate_metric(metric, _images(2), eps=[1 / 255])
    assert says in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize(("call", "says"), [
    (lambda net: advbench.evaluate_metric(lambda x: x, _images()), "metric must be a torch.nn.Module"),
    (lambda net: advbench.evaluate_metric(net, torch.rand(2, 1, 8, 8)), "images must be a float tensor (N, 3, H, W)"),
    (lambda net: advbench.evaluate_metric(net, _images() * 2), "images must lie in [0, 1]"),
    (lambda net: advbench.evaluate_metric(net, (_images() * 255).byte()), "divide 8-bit images by 255"),
    (lambda net: advbench.evaluate_metric(net, "no/such/folder"), "image folder 'no/such/folder' does not exist"),
    (lambda net: advbench.evaluate_metric(net, torch.rand(2, 3, 8, 8)), "images must be at least 11x11 pixels"),
    (lambda net: advbench.evaluate_metric(net, _images(), eps=[0.5, 2]), "every budget must be a number in (0, 1]"),
    (lambda net: advbench.evaluate_metric(advbench.Metric(net, higher_better="yes"), _images()), "higher_better must be true or false"),
    (lambda net: advbench.evaluate_metric(advbench.Metric(net, score_range=(1, 0)), _images()), "score_range must be [low, high]"),
    (lambda net: advbench.evaluate_metric(advbench.Metric(net, label="a/b"), _images()), "label='a/b' cannot be part of a file name"),
    (lambda net: advbench.evaluate_metric(advbench.Metric("not a module"), _images()), "or an advbench.Metric around one, got str"),
    (lambda net: advbench.evaluate_metric(net, _images(), overrides=["metric.weights=x.pt"]),
     "cannot apply to a metric object"),
    (lambda net: advbench.evaluate_metric(net, _images(), overrides=["n_images=2"]), "cannot apply to a tensor of images"),
    (lambda net: advbench.evaluate_metric(net, _images().numpy()), "images must be a float tensor (N, 3, H, W) in [0, 1] or"),
    (lambda net: advbench.evaluate_metric(net, _images(), overrides=["attack.params.steps=0"]), "steps must be a whole"),
])
def test_bad_input_is_one_error(folder: Path, call, says: str) -> None:
    with pytest.raises(AdvbenchError) as caught:
        call(_net(folder))
    assert says in str(caught.value) and "\n" not in str(caught.value)


# ---------------------------------------------------------------- from the command line


def _iqa(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["iqa", "run", *TINY, *args])
    assert "Traceback" not in result.output, result.output
    return result.exit_code, result.output


def _key(*args: str) -> str:
    code, output = _iqa("metric=python", "attack=fgsm", *args)
    assert code == 0, output
    return output.split("_s0_")[-1][:12]


def test_the_cli_runs_a_metric_file_with_its_weights(folder: Path) -> None:
    code, output = _iqa("metric=python", "metric.target=mymetric.py:Net", "metric.weights=a.pt",
                        "metric.higher_better=true", "metric.score_range=[-1,1]", "metric.label=mine")
    assert code == 0, output
    kind, frame = read_kind([folder / "out" / "records"])
    assert kind.name == "iqa" and len(frame) == 2 * 2 and set(frame["metric"]) == {"mine"}
    assert set(frame["score_lo"]) == {-1.0} and set(frame["score_hi"]) == {1.0}
    objects = advbench.evaluate_metric(_net(folder), torch.rand(1, 3, 12, 12), attack="fgsm", eps=[1 / 255])
    assert list(frame.columns) == list(objects.columns), "the API returns the columns the CLI writes"
    plot = CliRunner().invoke(main, ["plot", str(folder / "out" / "records"), "--out", str(folder / "figs")])
    assert plot.exit_code == 0 and (folder / "figs" / "msu_scores.csv").stat().st_size > 0, plot.output
    drawn = advbench.plot(folder / "out" / "records", out=folder / "figs2")
    assert pd.read_csv(folder / "figs2" / "msu_scores.csv").equals(pd.read_csv(folder / "figs" / "msu_scores.csv"))
    assert {p.name for p in drawn} >= {"ranking.md", "robustness_vs_eps.png"}


def test_the_cell_key_follows_the_code_and_the_weights(folder: Path) -> None:
    metric = ["metric.target=mymetric.py:Net", "metric.higher_better=true"]
    base = _key(*metric, "metric.weights=a.pt")
    assert _key(*metric, "metric.weights=a.pt") == base
    other = _key(*metric, "metric.weights=b.pt")
    own = _key(*metric)
    flipped = _key("metric.target=mymetric.py:Net", "metric.higher_better=false", "metric.weights=a.pt")
    (folder / "mymetric.py").write_text(METRIC_SOURCE.replace("torch.tanh(", "torch.sigmoid("))
    edited = _key(*metric, "metric.weights=a.pt")
    assert len({base, other, own, flipped, edited}) == 5


def test_the_api_key_follows_the_weights_and_the_code(folder: Path) -> None:
    x = _images(2)

    def key(net: torch.nn.Module) -> str:
        return advbench.evaluate_metric(net, x, attack="fgsm", eps=[1 / 255])["cell_key"].iloc[0]

    base = key(_net(folder, "a.pt"))
    assert key(_net(folder, "a.pt")) == base and key(_net(folder, "b.pt")) != base
    (folder / "mymetric.py").write_text(METRIC_SOURCE.replace("torch.tanh(", "torch.sigmoid("))
    edited = resolve_target("mymetric.py:Net", "metric")()  # the edited file, imported anew
    edited.load_state_dict(torch.load(folder / "a.pt", weights_only=True))
    assert key(edited) != base


@pytest.mark.parametrize(("args", "says"), [
    (["metric.target=mymetric.py:Detached"], "is not differentiable w.r.t. its input images"),
    (["metric.target=mymetric.py:Column"], "must return one score per image"),
    (["metric.target=mymetric.py:Nan"], "returned non-finite scores"),
    (["metric.target=mymetric.py:Net", "metric.weights=missing.pt"], "metric.weights file"),
    (["metric.target=mymetric.py:Net", "metric.weights=mymetric.py"], "is not a readable metric.weights file"),
    (["metric.target=mymetric.py:Net", "metric.kwargs={width:3}", "metric.weights=a.pt"],
     "does not fit Net: key 'conv.weight' has shape"),
    (["metric.target=mymetric.py:Nope"], "metric.target 'mymetric.py:Nope': 'mymetric.py' has no attribute 'Nope'"),
    (["metric.target=nope.py:Net"], "file"),
    (["metric.target=mymetric"], "metric.target must be <module>:<attr>"),
    (["metric.label=a/b", "metric.target=mymetric.py:Net"], "metric.label='a/b' cannot be part of a file name"),
])
def test_cli_errors_are_one_line(folder: Path, args: list[str], says: str) -> None:
    code, output = _iqa("metric=python", "metric.higher_better=true", *args)
    errors = [line for line in output.splitlines() if line.startswith("Error:")]
    assert code == 1 and len(errors) == 1 and says in errors[0], output


def test_a_process_ends_with_one_line_and_status_1(folder: Path) -> None:
    for args, says in ((["metric.target=mymetric.py:Net"], "metric=python needs metric.higher_better=true or false"),
                       (["metric.target=mymetric.py:Detached", "metric.higher_better=false"], "not differentiable")):
        proc = subprocess.run([sys.executable, "-m", "advbench", "iqa", "run", *TINY, "metric=python", *args],
                              capture_output=True, text=True, timeout=600, cwd=folder)
        assert_one_line_error(proc, says)


# ---------------------------------------------------------------- the manual's example


def _example_blocks() -> list[tuple[str, str]]:
    """(language, code) of the fenced blocks of docs/iqa.md's "Your own metric" section."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "iqa.md").read_text(encoding="utf-8")
    section = text.split("## Your own metric", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```(\w+)\n(.*?)```", section, flags=re.S)


@pytest.mark.slow
def test_the_manual_s_example_runs_from_python_and_from_the_command_line(tmp_path: Path) -> None:
    (lang, module), (lang2, script), (lang3, command) = _example_blocks()
    assert (lang, lang2, lang3) == ("python", "python", "bash") and module.startswith("# mymetric.py")
    (tmp_path / "mymetric.py").write_text(module)
    (tmp_path / "example.py").write_text(script)
    ran = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert ran.returncode == 0, ran.stderr
    assert (tmp_path / "plots" / "msu_scores.csv").stat().st_size > 0 and "score_attacked" in ran.stdout
    args = shlex.split(command.strip())
    assert args[:3] == ["advbench", "iqa", "run"]
    cli = subprocess.run([sys.executable, "-m", *args, "progress=false", "out_dir=out"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=600)
    assert cli.returncode == 0, cli.stderr
    frame = read_kind([tmp_path / "out" / "records"])[1]
    assert len(frame) == 4 * 4 and set(frame["metric"]) == {"python"}
    assert (frame["score_attacked"] > frame["score_clean"]).all(), "I-FGSM sharpens every photo crop"
