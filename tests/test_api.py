"""The Python API: `advbench.evaluate` on a model object, through the command line's code path."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import torch
from click.testing import CliRunner
from torch import nn

import advbench
from advbench.cli.main import main
from advbench.core.errors import AdvbenchError
from advbench.robustness.attacks.gradient import BIM

NET_SOURCE = '''
import torch
from torch import nn


class Net(nn.Module):
    """A tiny digits classifier: NCHW floats in [0, 1] to 10 logits."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))

    def forward(self, x):
        return self.body(x)
'''
MEASURED = ["sample_id", "label", "clean_pred", "clean_correct", "success_at_budget", "adv_pred", "adv_fraction",
            "min_eps", "min_eps_lo", "adv_norm", "first_success_strength", "grad_evals", "queries", "dist_linf",
            "dist_l2", "eps_budget"]
QUICK = ["dataset.n_samples=24", "search.max_probes=3"]


@pytest.fixture
def net_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ADVBENCH_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "net.py"
    path.write_text(NET_SOURCE)
    return path


def _net(net_file: Path) -> nn.Module:
    namespace: dict = {}
    exec(compile(net_file.read_text(), str(net_file), "exec"), namespace)  # noqa: S102 - the test's own source
    torch.manual_seed(0)  # as the CLI builds a python model: under torch's RNG seeded with `seed`
    return namespace["Net"]()


def _invariants(records: pd.DataFrame) -> None:
    assert (records["success_at_budget"] == (records["min_eps"] <= records["eps_budget"])).all()


def test_evaluate_and_the_cli_give_equal_records(net_file: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["run", "model=python", "model.target=net.py:Net", "attack=fgsm",
                                       f"out_dir={tmp_path / 'cli'}", *QUICK])
    assert result.exit_code == 0, result.output
    cli = pd.read_parquet(next((tmp_path / "cli" / "records").glob("*.parquet")))
    api = advbench.evaluate(advbench.Model(_net(net_file), label="net.py:Net"), "digits", attack="fgsm", overrides=QUICK)
    assert list(api.columns) == list(cli.columns), "the CLI's schema, column for column"
    pd.testing.assert_frame_equal(api[MEASURED], cli[MEASURED])
    assert set(api["model_label"]) == set(cli["model_label"]) == {"net.py:Net"}
    for records in (api, cli):  # the evaluation card's versions and the deployed model's digest
        assert set(records["torch_version"]) == {torch.__version__}
        digest, = set(records["model_sha256"])
        assert len(digest) == 64 and int(digest, 16) >= 0
    _invariants(api)


def test_tensors_an_attack_object_and_resume_in_an_out_dir(net_file: Path, tmp_path: Path, digits_tensors) -> None:
    _, _, x, y = digits_tensors
    data = (x[:20], y[:20])
    out = tmp_path / "api"
    first = advbench.evaluate(_net(net_file), data, attack=BIM(steps=3), eps=0.15, out_dir=out)
    assert len(first) == 20 and set(first["attack"]) == {"bim"} and set(first["dataset"]) == {"tensors"}
    assert set(first["model_label"]) == {"Net"} and (first["eps_budget"] == 0.15).all()
    _invariants(first)
    parts = list((out / "records").glob("*.parquet"))
    assert len(parts) == 1
    again = advbench.evaluate(_net(net_file), data, attack=BIM(steps=3), eps=0.15, out_dir=out)
    pd.testing.assert_frame_equal(again, first)  # the part was found and read, not recomputed
    assert list((out / "records").glob("*.parquet")) == parts
    other = advbench.evaluate(_net(net_file), (x[:20], (y[:20] + 1) % 10), attack=BIM(steps=3), eps=0.15, out_dir=out)
    assert len(list((out / "records").glob("*.parquet"))) == 2, "other labels are another cell"
    assert not other["label"].equals(first["label"])


def test_a_torch_dataset_and_score_and_decision_threats(net_file: Path, digits_tensors) -> None:
    _, _, x, y = digits_tensors
    dataset = torch.utils.data.TensorDataset(x[:12], y[:12])
    score = advbench.evaluate(advbench.Model(_net(net_file), num_classes=10), dataset, attack="square", threat="linf_score", eps=0.2,
                              attack_params={"n_queries": 30}, overrides=["search.enabled=false"])
    decision = advbench.evaluate(advbench.Model(_net(net_file), num_classes=10), dataset, attack="hsj", threat="l2_decision", eps=1.0,
                                 attack_params={"max_queries": 60})
    for records in (score, decision):
        assert len(records) == 12
        _invariants(records)
    assert (score["queries"] <= 30).all() and set(decision["knowledge"]) == {"decision"}


def test_plot_summary_and_options(net_file: Path, tmp_path: Path) -> None:
    records = advbench.evaluate(_net(net_file), "digits", attack="fgsm", overrides=QUICK)
    written = advbench.plot(records, out=tmp_path / "plots")
    assert any(p.suffix == ".png" for p in written) and all(p.is_file() for p in written)
    table = advbench.summary(records)
    assert len(table) == 1 and "accuracy" in table.columns
    assert "fgsm" in advbench.options("attack") and "attack" in advbench.options()


@pytest.mark.parametrize(("call", "message"), [
    (lambda net, x, y: advbench.evaluate("not a model", "digits"), "model must be a torch.nn.Module"),
    (lambda net, x, y: advbench.evaluate(advbench.Model("not a model"), "digits"), "or an advbench.Model around one, got str"),
    (lambda net, x, y: advbench.evaluate(advbench.Model(net, eot_samples=4), (x, y)), "eot_samples"),
    (lambda net, x, y: advbench.evaluate(net, "digits", attack="nope"), "attack"),
    (lambda net, x, y: advbench.evaluate(net, (x * 255, y), eps=0.1), "must lie in [0, 1]"),
    (lambda net, x, y: advbench.evaluate(net, [1, 2, 3]), "data must be"),
    (lambda net, x, y: advbench.evaluate(net, (x, y)), "no default linf budget"),
    (lambda net, x, y: advbench.evaluate(net, (x, y), eps=0.1, attack=BIM(), attack_params={"steps": 2}),
     "attack_params go with an attack option name"),
    (lambda net, x, y: advbench.evaluate(nn.Linear(3, 3), (x, y), eps=0.1), "fails on the data set's 1x8x8 input"),
    (lambda net, x, y: advbench.options("nope"), "unknown config group 'nope'"),
])
def test_bad_input_is_one_advbench_error(net_file: Path, digits_tensors, call, message: str) -> None:
    _, _, x, y = digits_tensors
    with pytest.raises(AdvbenchError, match=None) as caught:
        call(_net(net_file), x[:8], y[:8])
    text = str(caught.value)
    assert message in text and "\n" not in text, text


class Noisy(nn.Module):
    """A trained net behind Gaussian input noise that draws whatever its mode (a randomized defense)."""

    def __init__(self, inner: nn.Module, sigma: float) -> None:
        super().__init__()
        self.inner, self.sigma = inner, sigma

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x + self.sigma * torch.randn_like(x))


def test_a_wrapper_defense_is_applied_to_the_model_object(tiny_model, digits_tensors) -> None:
    _, _, x, y = digits_tensors
    x, y = x[:24], y[:24]
    data = (x, y)
    plain = advbench.evaluate(tiny_model, data, attack="fgsm", eps=0.1, overrides=["search.enabled=false"])
    squeezed = advbench.evaluate(tiny_model, data, attack="fgsm", eps=0.1, defense="bit_red", overrides=["search.enabled=false"])
    with torch.no_grad():  # bit_red: 1 bit, so the model sees round(x)
        expected = tiny_model(torch.round(x)).argmax(1)
        undefended = tiny_model(x).argmax(1)
    assert (squeezed["clean_pred"].to_numpy() == expected.numpy()).all()
    assert (plain["clean_pred"].to_numpy() == undefended.numpy()).all()
    assert not (expected == undefended).all(), "the test needs a transform that moves some prediction"
    assert set(squeezed["defense"]) == {"bit_red"} and set(squeezed["grad_mode"]) == {"bpda"}
    assert set(plain["grad_mode"]) == {"exact"} and plain["cell_key"][0] != squeezed["cell_key"][0]


def test_eot_counts_its_passes_and_makes_the_attack_stronger(tiny_model, digits_tensors) -> None:
    _, _, x, y = digits_tensors
    model = Noisy(tiny_model, 0.3)
    common = dict(attack="bim", eps=0.08, attack_params={"steps": 5}, overrides=["search.enabled=false"])
    one = advbench.evaluate(advbench.Model(model, randomized=True, eot_samples=1), (x[:64], y[:64]), **common)
    ten = advbench.evaluate(advbench.Model(model, randomized=True, eot_samples=10), (x[:64], y[:64]), **common)
    assert set(one["grad_mode"]) == {"exact"} and set(ten["grad_mode"]) == {"eot"}
    assert (ten["grad_evals"] % 10 == 0).all() and ten["grad_evals"].max() == 50
    assert one["grad_evals"].max() == 5
    robust = {n: float((r["adv_pred"] == r["label"]).mean()) for n, r in (("one", one), ("ten", ten))}
    assert robust["ten"] < robust["one"], robust
