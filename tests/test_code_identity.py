"""Records that follow the code: a user's model or metric whose code or behaviour changed is a new cell.

The cell key holds the files of the user's modules its classes import, transitively
(`core.digests.code_digest`), and a fingerprint of its outputs on a fixed, seeded probe batch
(`core.fingerprint`). So an edited helper module, a module-level flag flipped at run time and a
value captured in a closure each run the cell anew, while the same code and weights still reuse
the records (`skip: records exist`), from `evaluate`, `evaluate_metric`, `advbench run
model=python` and `advbench iqa run metric=python` alike.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
import torch
from click.testing import CliRunner
from torch import nn

import advbench
from advbench.cli.main import main
from advbench.core.digests import code_digest, user_modules
from advbench.core.fingerprint import behaviour_digest
from advbench.core.user_code import resolve_target

pytestmark = pytest.mark.usefixtures("one_thread")

CONSTS = "FACTOR = 1.0\n"
HELPER = '''
import consts


def scale(x):
    return x * consts.FACTOR
'''
MODEL = '''
import torch
from torch import nn

import helper

MODE = 0


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        z = helper.scale(x.flatten(1))
        return self.fc(z.flip(1) if MODE else z)


class Noisy(Net):
    def forward(self, x):
        return super().forward(x + 0.1 * torch.randn_like(x))


def make(factor):
    class Scaled(Net):
        def forward(self, x):
            return super().forward(x) * factor
    return Scaled()
'''
METRIC = '''
import torch
from torch import nn

import helper

MODE = 0


class Score(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 2, 3, padding=1)

    def forward(self, x):
        z = torch.tanh(self.conv(helper.scale(x))).mean(dim=(1, 2, 3))
        return -z if MODE else z
'''
USER_NAMES = ("consts", "helper", "mynet", "mymetric")
FGSM = ["attack=fgsm", "search.enabled=false"]


@pytest.fixture
def user_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A working folder with a model and a metric that import `helper`, which imports `consts`;
    sys.path and the user's modules are restored after."""
    for name, text in (("consts", CONSTS), ("helper", HELPER), ("mynet", MODEL), ("mymetric", METRIC)):
        (tmp_path / f"{name}.py").write_text(text)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("ADVBENCH_CACHE", str(tmp_path / "cache"))
    _forget()
    yield tmp_path
    _forget()


def _forget() -> None:
    """Drop the user's modules from sys.modules: the next import reads their files, as a new process would."""
    for name in list(sys.modules):
        if name in USER_NAMES or name.startswith("advbench_user_"):
            del sys.modules[name]


def _model(attr: str = "Net", *args: float) -> nn.Module:
    torch.manual_seed(0)  # the same weights on every build
    return resolve_target(f"mynet:{attr}")(*args)


def _parts(out: Path) -> list[Path]:
    return sorted((out / "records").glob("*.parquet"))


def _evaluate(model: nn.Module, digits_tensors, out: Path, **described) -> pd.DataFrame:
    """`model` evaluated, with what `described` says of it (`randomized=True`, ...)."""
    _, _, x, y = digits_tensors
    return advbench.evaluate(advbench.Model(model, **described), (x[:6], y[:6]), attack="fgsm", eps=0.1, out_dir=out,
                             overrides=["search.enabled=false"])


def _ran_anew(capsys: pytest.CaptureFixture[str]) -> bool:
    err = capsys.readouterr().err
    return "skip" not in err


# ---------------------------------------------------------------- the code: the user's modules, transitively


def test_code_digest_follows_the_user_modules_the_classes_import(user_files: Path) -> None:
    net = _model()
    assert [m.__name__ for m in user_modules([type(net)])] == ["consts", "helper", "mynet"], \
        "the user's modules only: not torch, the standard library or advbench"
    base = code_digest(net)
    assert code_digest(_model()) == base
    (user_files / "consts.py").write_text(CONSTS + "# two imports away\n")
    assert code_digest(net) != base


def test_editing_a_helper_module_runs_the_cell_anew(user_files: Path, digits_tensors,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    out = user_files / "out"
    first = _evaluate(_model(), digits_tensors, out)
    again = _evaluate(_model(), digits_tensors, out)
    assert not _ran_anew(capsys) and again["cell_key"][0] == first["cell_key"][0], "the same code: reused"
    (user_files / "helper.py").write_text(HELPER.replace("* consts.FACTOR", "* consts.FACTOR * 3"))
    _forget()
    edited = _evaluate(_model(), digits_tensors, out)
    assert _ran_anew(capsys) and len(_parts(out)) == 2
    assert edited["cell_key"][0] != first["cell_key"][0]


# ---------------------------------------------------------------- the behaviour: flags and closures


def test_a_module_flag_flipped_at_run_time_is_a_new_cell(user_files: Path, digits_tensors,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    out = user_files / "out"
    net = _model()
    module = sys.modules[type(net).__module__]
    first = _evaluate(net, digits_tensors, out)
    module.MODE = 1
    flipped = _evaluate(net, digits_tensors, out)
    assert _ran_anew(capsys) and len(_parts(out)) == 2 and flipped["cell_key"][0] != first["cell_key"][0]
    module.MODE = 0
    back = _evaluate(net, digits_tensors, out)
    assert not _ran_anew(capsys) and back["cell_key"][0] == first["cell_key"][0] and len(_parts(out)) == 2


def test_a_value_captured_in_a_closure_is_a_new_cell(user_files: Path, digits_tensors,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    out = user_files / "out"
    once = _evaluate(_model("make", 1.0), digits_tensors, out)
    thrice = _evaluate(_model("make", 3.0), digits_tensors, out)
    assert _ran_anew(capsys) and thrice["cell_key"][0] != once["cell_key"][0] and len(_parts(out)) == 2
    _evaluate(_model("make", 1.0), digits_tensors, out)
    assert not _ran_anew(capsys) and len(_parts(out)) == 2


def test_a_randomized_model_is_reused_when_unchanged(user_files: Path, digits_tensors,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    out = user_files / "out"
    first = _evaluate(_model("Noisy"), digits_tensors, out, randomized=True, eot_samples=2)
    again = _evaluate(_model("Noisy"), digits_tensors, out, randomized=True, eot_samples=2)
    assert not _ran_anew(capsys) and again["cell_key"][0] == first["cell_key"][0] and len(_parts(out)) == 1


def test_the_fingerprint_is_reproducible_and_leaves_the_model_as_it_was(user_files: Path) -> None:
    """Seeded draws, one thread and eval mode inside; the caller's RNG, threads and modes kept; and
    the same digest in another process, as a rerun of the same cell gets."""
    net = _model("Noisy").train()
    state, threads = torch.get_rng_state(), torch.get_num_threads()
    digest = behaviour_digest(net, (1, 8, 8), "model")
    torch.set_num_threads(2)
    try:
        assert behaviour_digest(net, (1, 8, 8), "model") == digest
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(state, torch.get_rng_state()) and all(m.training for m in net.modules())
    assert behaviour_digest(_model("Net"), (1, 8, 8), "model") != digest
    script = ("import torch; from advbench.core.user_code import resolve_target; "
              "from advbench.core.fingerprint import behaviour_digest; torch.manual_seed(0); "
              "print(behaviour_digest(resolve_target('mynet:Noisy')(), (1, 8, 8), 'model'))")
    other = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=300)
    assert other.stdout.strip() == digest


# ---------------------------------------------------------------- evaluate_metric


def _metric(module: str = "mymetric") -> nn.Module:
    torch.manual_seed(0)
    return resolve_target(f"{module}:Score", "metric")()


def _evaluate_metric(metric: nn.Module, out: Path) -> pd.DataFrame:
    images = torch.rand(2, 3, 12, 12, generator=torch.Generator().manual_seed(1))
    return advbench.evaluate_metric(metric, images, attack="fgsm", eps=[1 / 255], out_dir=out)


def test_a_metric_follows_its_helper_module_and_its_flags(user_files: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = user_files / "out"
    metric = _metric()
    module = sys.modules[type(metric).__module__]
    first = _evaluate_metric(metric, out)
    assert _evaluate_metric(_metric(), out)["cell_key"][0] == first["cell_key"][0] and not _ran_anew(capsys)
    module.MODE = 1
    flipped = _evaluate_metric(metric, out)
    assert _ran_anew(capsys) and flipped["cell_key"][0] != first["cell_key"][0]
    module.MODE = 0
    (user_files / "helper.py").write_text(HELPER.replace("* consts.FACTOR", "* consts.FACTOR * 0.5"))
    _forget()
    edited = _evaluate_metric(_metric(), out)
    assert _ran_anew(capsys) and len(_parts(out)) == 3
    assert edited["cell_key"][0] not in (first["cell_key"][0], flipped["cell_key"][0])


# ---------------------------------------------------------------- the command line


def _cli(*args: str) -> str:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0 and "Traceback" not in result.output, result.output
    return result.output


def test_cli_python_model_runs_anew_after_its_helper_is_edited(user_files: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    run = ["run", "model=python", "model.target=mynet.py:Net", "dataset.n_samples=6", "threads=1", "batch_size=8",
           "out_dir=out", *FGSM]
    _cli(*run)
    assert "skip" in _cli(*run) + capsys.readouterr().err, "the same code: reused"
    (user_files / "helper.py").write_text(HELPER.replace("* consts.FACTOR", "* consts.FACTOR * 3"))
    _forget()
    assert "skip" not in _cli(*run) + capsys.readouterr().err
    assert len(_parts(user_files / "out")) == 2


def test_cli_python_metric_runs_anew_after_its_helper_is_edited(user_files: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    run = ["iqa", "run", "metric=python", "metric.target=mymetric.py:Score", "metric.higher_better=true",
           "attack=fgsm", "n_images=2", "size=16", "eps=[0.00392156862745098]", "progress=false", "threads=1",
           "metric.weights=w.pt", "out_dir=out"]
    torch.save(_metric().state_dict(), user_files / "w.pt")  # a factory's own weights are drawn anew each run
    _forget()
    _cli(*run)
    assert "skip" in _cli(*run) + capsys.readouterr().err, "the same code: reused"
    (user_files / "helper.py").write_text(HELPER.replace("* consts.FACTOR", "* consts.FACTOR * 0.5"))
    _forget()
    assert "skip" not in _cli(*run) + capsys.readouterr().err
    assert len(_parts(user_files / "out")) == 2
