"""A model object's records say only what was done: defenses applied, settings that cannot apply
refused, stochastic models kept stochastic (with EOT), edited code keyed anew, the caller's model
and torch's RNG handed back as they came. Through `advbench.evaluate` and `advbench run model=python`."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest
import torch
from click.testing import CliRunner
from torch import nn

import advbench
from advbench.cli.main import main
from advbench.core.errors import AdvbenchError, AdvbenchWarning

QUIET = ["search.enabled=false"]

DROPOUT_NET = '''
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(64, 64), nn.ReLU(), nn.Dropout(0.5), nn.Linear(64, 10))

    def forward(self, x):
        return self.body(x)
'''


class Dropped(nn.Module):
    """A trained net with MC dropout on its input; records the `training` flag of its dropout at each call."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner, self.drop = inner, nn.Dropout(0.3)
        self.seen: list[bool] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(self.drop.training)
        return self.inner(self.drop(x))


@pytest.fixture
def data(digits_tensors) -> tuple[torch.Tensor, torch.Tensor]:
    _, _, x, y = digits_tensors
    return x[:24], y[:24]


def _parts(out: Path) -> list[Path]:
    return sorted((out / "records").glob("*.parquet"))


def test_a_randomized_wrapper_is_judged_by_a_vote_with_eot(tiny_model, data) -> None:
    records = advbench.evaluate(tiny_model, data, attack="fgsm", eps=0.1, overrides=["defense=rp", *QUIET])
    assert set(records["defense"]) == {"rp"} and set(records["grad_mode"]) == {"eot"}
    assert set(records["judge_draws"]) == {20} and (records["grad_evals"] == 10).all()


@pytest.mark.parametrize(("overrides", "says"), [
    (["checkpoint=weights.pt"], "comes with its weights"),
    (["+checkpoint=weights.pt"], "comes with its weights"),
    (["dataset.n_samples=4"], "fixes the images"),
    (["dataset=cifar10"], "fixes the images"),
    (["model.mean=[0.5]", "model.std=[0.25]"], "use evaluate's mean="),
    (["model.randomized=true"], "use evaluate's mean="),
    (["defense=pgd_at"], "trains a model"),
    (["defense=trades"], "trains a model"),
])
def test_settings_a_model_object_cannot_take_are_refused_before_any_work(tiny_model, data, tmp_path: Path,
                                                                        overrides, says) -> None:
    with pytest.raises(AdvbenchError, match=says) as caught:
        advbench.evaluate(tiny_model, data, attack="fgsm", eps=0.1, out_dir=tmp_path, overrides=overrides)
    assert "\n" not in str(caught.value)
    assert not _parts(tmp_path)


def test_a_named_data_set_still_takes_its_overrides(tiny_model) -> None:
    records = advbench.evaluate(tiny_model, "digits", attack="fgsm", overrides=["dataset.n_samples=5", *QUIET])
    assert len(records) == 5


def test_mc_dropout_stays_on_and_the_model_is_handed_back(tiny_model, data) -> None:
    model = Dropped(tiny_model)
    model.train()
    model.inner.eval()  # mixed flags: each must come back as it was
    flags = {name: m.training for name, m in model.named_modules()}
    rng = torch.get_rng_state()
    records = advbench.evaluate(advbench.Model(model, randomized=True, eot_samples=2, num_classes=10), data, attack="bim",
                                eps=0.1, attack_params={"steps": 3}, overrides=QUIET)
    assert model.seen and all(model.seen), "dropout drew in every pass"
    assert {name: m.training for name, m in model.named_modules()} == flags
    assert torch.equal(rng, torch.get_rng_state())
    assert records["flag_randomized"].all() and set(records["grad_mode"]) == {"eot"}
    assert not records["adv_fraction"].isin([0.0, 1.0]).all(), "a vote over passes that differ"


def test_the_caller_state_comes_back_after_a_failure_too(tiny_model, data) -> None:
    model = Dropped(tiny_model).train()
    rng = torch.get_rng_state()
    with pytest.raises(AdvbenchError):
        advbench.evaluate(model, data, attack="fgsm", eps=0.1, overrides=["defense=pgd_at"])
    with pytest.raises(AdvbenchError):
        advbench.evaluate(advbench.Model(model, randomized=True), data, attack="fgsm", eps=0.1, overrides=["search.max_probes=-1"])
    assert all(m.training for m in model.modules()) and torch.equal(rng, torch.get_rng_state())


def test_a_deterministic_model_marked_randomized_is_refused(tiny_model, data) -> None:
    with pytest.raises(AdvbenchError, match="two passes on the same input agree"):
        advbench.evaluate(advbench.Model(tiny_model, randomized=True), data, attack="fgsm", eps=0.1)
    with pytest.raises(AdvbenchError, match="eot_samples applies to a randomized model"):
        advbench.evaluate(advbench.Model(tiny_model, eot_samples=4), data, attack="fgsm", eps=0.1)


def test_a_randomized_model_behind_a_wrapper_is_refused(tiny_model, data) -> None:
    with pytest.raises(AdvbenchError, match="randomized model behind the wrapper"):
        advbench.evaluate(advbench.Model(Dropped(tiny_model), randomized=True), data, attack="fgsm", eps=0.1, defense="jpeg")


def _write(path: Path, negate: bool) -> None:
    body = "-self.body(x)" if negate else "self.body(x)"
    path.write_text(DROPOUT_NET.replace("nn.Dropout(0.5), ", "").replace("return self.body(x)", f"return {body}"))


def _exec_net(path: Path) -> nn.Module:
    namespace: dict = {}
    exec(compile(path.read_text(), str(path), "exec"), namespace)  # noqa: S102 - the test's own source
    return namespace["Net"]()


def test_an_edited_forward_is_another_cell(tmp_path: Path, data) -> None:
    source = tmp_path / "net.py"
    _write(source, negate=False)
    first = advbench.evaluate(_exec_net(source), data, attack="fgsm", eps=0.1, out_dir=tmp_path, overrides=QUIET)
    _write(source, negate=True)  # same class name, same weights, another function
    second = advbench.evaluate(_exec_net(source), data, attack="fgsm", eps=0.1, out_dir=tmp_path, overrides=QUIET)
    assert len(_parts(tmp_path)) == 2 and first["cell_key"][0] != second["cell_key"][0]
    assert not (first["clean_pred"] == second["clean_pred"]).all()


def _cli(*args: str) -> object:
    return CliRunner().invoke(main, ["run", *args, "attack=fgsm", "dataset.n_samples=12", "search.enabled=false"])


def test_the_cli_keeps_dropout_on_for_a_randomized_python_model(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ADVBENCH_CACHE", str(tmp_path / "cache"))
    (tmp_path / "mcd.py").write_text(DROPOUT_NET)
    result = _cli("model=python", "model.target=mcd.py:Net", "model.randomized=true", "model.eot_samples=2",
                  f"out_dir={tmp_path / 'out'}")
    assert result.exit_code == 0, result.output
    records = pd.read_parquet(_parts(tmp_path / "out")[0])
    assert records["flag_randomized"].all() and set(records["grad_mode"]) == {"eot"}
    assert (records["grad_evals"] == 2).all() and set(records["judge_draws"]) == {20}


def test_the_cli_refuses_a_deterministic_model_marked_randomized(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    _write(tmp_path / "net.py", negate=False)
    result = _cli("model=python", "model.target=net.py:Net", "model.randomized=true", f"out_dir={tmp_path / 'out'}")
    assert result.exit_code == 1 and "two passes on the same input agree" in result.output
    result = _cli("model=python", "model.target=net.py:Net", "model.eot_samples=3")
    assert result.exit_code == 1 and "eot_samples applies to a randomized model" in result.output


def test_the_cli_puts_a_wrapper_before_a_python_model_and_keys_edits_anew(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ADVBENCH_CACHE", str(tmp_path / "cache"))
    _write(tmp_path / "net.py", negate=False)
    out = f"out_dir={tmp_path / 'out'}"
    assert _cli("model=python", "model.target=net.py:Net", "defense=bit_red", out).exit_code == 0
    records = pd.read_parquet(_parts(tmp_path / "out")[0])
    assert set(records["defense"]) == {"bit_red"} and set(records["grad_mode"]) == {"bpda"}
    _write(tmp_path / "net.py", negate=True)
    assert _cli("model=python", "model.target=net.py:Net", "defense=bit_red", out).exit_code == 0
    assert len(_parts(tmp_path / "out")) == 2


class FailsLater(nn.Module):
    """A net that raises on its fourth call: a failure in a later batch, past the checks up front."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner, self.calls = inner, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls > 3:
            raise ValueError("index 7 is out of bounds\nsecond line")
        return self.inner(x)


def test_the_models_own_failure_mid_run_is_one_line_with_its_cause(tiny_model, data) -> None:
    with pytest.raises(AdvbenchError, match=r"model 'FailsLater' failed on a batch of \d+ 1x8x8 inputs: "
                                            r"ValueError: index 7 is out of bounds$") as caught:
        advbench.evaluate(advbench.Model(FailsLater(tiny_model), num_classes=10), data, attack="bim", eps=0.1)
    assert isinstance(caught.value.__cause__, ValueError)


@pytest.mark.parametrize(("make", "says"), [
    (lambda x, y: (x[:0], y[:0]), "data holds no images"),
    (lambda x, y: ((x * 255).to(torch.uint8), y), "uint8 pixels: divide by 255"),
    (lambda x, y: (torch.where(x > 0.9, torch.nan, x), y), "must be finite"),
])
def test_bad_images_are_named_for_what_is_wrong(tiny_model, data, make, says) -> None:
    with pytest.raises(AdvbenchError, match=says) as caught:
        advbench.evaluate(tiny_model, make(*data), attack="fgsm", eps=0.1)
    assert "\n" not in str(caught.value)


def test_a_list_of_budgets_and_a_single_logit_are_told_plainly(tiny_model, data) -> None:
    with pytest.raises(AdvbenchError, match="eps must be one number"):
        advbench.evaluate(tiny_model, data, attack="fgsm", eps=[0.1, 0.2])
    with pytest.raises(AdvbenchError, match="a classifier returns one logit per class"):
        advbench.evaluate(nn.Sequential(nn.Flatten(), nn.Linear(64, 1)), data, attack="fgsm", eps=0.1)


def test_the_summary_line_names_the_data_and_only_what_was_measured(tiny_model, data, capsys) -> None:
    advbench.evaluate(tiny_model, data, attack="fgsm", eps=0.1, overrides=QUIET)
    line = capsys.readouterr().err
    assert "tensors/" in line and "digits/" not in line and "median min-ε" not in line
    assert "->" not in line, "no path to a scratch folder deleted on return"
    advbench.evaluate(tiny_model, data, attack="fgsm", eps=0.1, overrides=["search.max_probes=2"])
    assert "median min-ε" in capsys.readouterr().err


@pytest.mark.parametrize(("source", "says"), [
    ('raise RuntimeError("boom at import")\n', "importing '.*a.py' failed: RuntimeError: boom at import"),
    ("import sys\nsys.exit(3)\n", "failed: exited with status 3"),
    ("from torch import nn\nclass Net(nn.Module):\n    def __init__(self):\n        raise NameError('x')\n",
     "building the model failed: NameError: x"),
])
def test_a_python_model_that_fails_to_import_or_build_is_one_line(tmp_path: Path, monkeypatch, source, says) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.py").write_text(source)
    result = _cli("model=python", "model.target=a.py:Net")
    assert result.exit_code == 1, result.output
    assert len(result.output.strip().splitlines()) == 1 and re.search(says, result.output), result.output


def test_a_model_object_is_recorded_as_given_and_its_warnings_are_python_warnings(tiny_model, data) -> None:
    records = advbench.evaluate(tiny_model, data, attack="fgsm", eps=0.1, overrides=QUIET)
    assert set(records["defense"]) == {"none"} and set(records["defense_category"]) == {"as given"}
    x, y = data
    untrained = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))  # an untrained net that answers 0 to everything
    torch.nn.init.zeros_(untrained[1].weight)
    torch.nn.init.constant_(untrained[1].bias, 0.0)
    untrained[1].bias.data[0] = 1.0
    with pytest.warns(AdvbenchWarning, match="near chance"):
        advbench.evaluate(advbench.Model(untrained, num_classes=10), (x[y != 0], y[y != 0]), attack="fgsm", eps=0.1, overrides=QUIET)
    with pytest.warns(AdvbenchWarning, match="gradients may be masked"):
        advbench.evaluate(tiny_model, data, attack="fgsm", eps=0.1, defense="jpeg", overrides=QUIET)


def test_randomized_python_cells_are_keyed_anew_and_deterministic_ones_are_not() -> None:
    from advbench.core.keys import model_identity

    deterministic = {"name": "python", "target": "net.py:Net", "randomized": False, "eot_samples": None}
    randomized = {**deterministic, "randomized": True}
    source = "advbench.robustness.models.user_models.python_model"
    assert "eot_samples" not in model_identity(source, deterministic), "as before eot_samples existed: the same key"
    assert model_identity(source, randomized)["eot_samples"] is None, "records from before (dropout off) are not reused"
