"""Bad input that must end in one line, third round: a one-class model, records that are not records, the
user's option folders (a file that does not parse, a target that is not an attack, a module that exits, a
name the shipped catalogue already has), and a keyword and an override that set the same thing.

Commands run in process (CliRunner); the Python API is called directly on tiny tensors.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from audit_records import cell, records
from click.testing import CliRunner, Result
from torch import nn

import advbench
from advbench.cli.config import compose_config
from advbench.cli.main import main
from advbench.core.errors import AdvbenchError
from advbench.robustness.attacks.attack_contract import Attack

QUIET = ["search.enabled=false"]


class OneLogit(nn.Module):
    """A classifier of one class: every image gets the same, only, label."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3 * 8 * 8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x.flatten(1))


def _images(n: int = 4) -> torch.Tensor:
    return torch.rand(n, 3, 8, 8, generator=torch.Generator().manual_seed(0))


def _three_classes() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 3)), (_images(6), torch.tensor([0, 1, 2, 0, 1, 2]))


def one_line(result: Result, *needles: str) -> str:
    """The command failed with exit status 1 and one `Error:` line holding `needles`, no traceback."""
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert result.exit_code == 1, result.output
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def user_conf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty ADVBENCH_CONF folder (attack/) and a folder of modules on the path; the cwd in tmp_path."""
    (tmp_path / "conf" / "attack").mkdir(parents=True)
    (tmp_path / "mods").mkdir()
    monkeypatch.setenv("ADVBENCH_CONF", str(tmp_path / "conf"))
    monkeypatch.setenv("ADVBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.syspath_prepend(str(tmp_path / "mods"))
    monkeypatch.chdir(tmp_path)
    return tmp_path / "conf"


def _run(*argv: str) -> Result:
    return CliRunner().invoke(main, ["run", *argv, "dataset.n_samples=2", *QUIET, "threads=1"])


# ---- a one-class model -----------------------------------------------------------------------------

@pytest.mark.parametrize("attack", ["fab", "fab_t", "fgsm", "deepfool"])
def test_a_one_class_model_is_refused_before_any_attack(attack: str) -> None:
    # FAB and DeepFool divided by zero (no other class); FGSM "measured" 100 % robustness of a constant.
    with pytest.raises(AdvbenchError, match="returns one logit per image, a single class") as caught:
        advbench.evaluate(OneLogit(), (_images(), torch.zeros(4, dtype=torch.long)), attack=attack, eps=0.03)
    assert "\n" not in str(caught.value)


# ---- advbench.report on what is not records -----------------------------------------------------------

def _records() -> pd.DataFrame:
    return records(cell("bim", [0.05, 0.1, 0.15, 0.3]), cell("pgd", [0.05, 0.1, 0.2, 0.25]))


def test_report_of_good_records_writes_its_files(tmp_path: Path) -> None:
    written = advbench.report(_records(), tmp_path / "out")
    assert [p.name for p in written] == ["report.json", "report.html"] and all(p.is_file() for p in written)


@pytest.mark.parametrize(("records_of", "out", "message"), [
    (lambda r: r.assign(min_eps="x"), "out", "column 'min_eps' of the records holds"),
    (lambda r: r.assign(min_eps=r["min_eps"].astype(str)), "out", "column 'min_eps' of the records holds"),
    (lambda r: r.drop(columns=["adv_norm"]), "out", "the records lack column(s) adv_norm"),
    (lambda r: 42, "out", "records must be a DataFrame of records, or a file or folder of parts"),
    (lambda r: [str(r.shape), 3], "out", "got list"),
    (lambda r: r, None, "out_dir must be a folder path, got None"),
])
def test_report_refuses_what_is_not_records_in_one_line(records_of, out, message: str, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(AdvbenchError) as caught:
        advbench.report(records_of(_records()), out)
    assert message in str(caught.value) and "\n" not in str(caught.value)
    assert not (tmp_path / "out").exists()


def test_plot_refuses_text_where_numbers_belong(tmp_path: Path) -> None:
    with pytest.raises(AdvbenchError, match="column 'min_eps' of the records holds"):
        advbench.plot(_records().assign(min_eps="x"), tmp_path / "plots")


# ---- the user's option folders ------------------------------------------------------------------------

BROKEN = "name: broken\nparams:\n  _target_: x.Y\n  steps: [1, 2\n"


def test_an_option_file_that_does_not_parse_is_one_line_naming_it(user_conf: Path) -> None:
    (user_conf / "attack" / "broken.yaml").write_text(BROKEN)
    needles = (f"option file '{user_conf / 'attack' / 'broken.yaml'}' is not valid YAML", "line 5",
               "from line 4")
    one_line(CliRunner().invoke(main, ["list", "attack"]), *needles)  # was a 71-line traceback
    one_line(_run("attack=broken"), *needles)  # was 219 lines
    with pytest.raises(AdvbenchError, match="is not valid YAML, line 5"):
        advbench.options("attack")


def test_a_target_that_is_not_an_attack_is_one_line(user_conf: Path) -> None:
    (user_conf / "attack" / "ordered.yaml").write_text("name: ordered\nparams:\n  _target_: collections.OrderedDict\n")
    one_line(_run("attack=ordered"), "attack 'ordered'", "collections.OrderedDict builds an object of type OrderedDict",
             "not an attack")


def test_a_module_that_exits_on_import_is_one_line(user_conf: Path) -> None:
    (user_conf.parent / "mods" / "exits_on_import.py").write_text("import sys\n\nsys.exit(7)\n")
    (user_conf / "attack" / "exits.yaml").write_text("name: exits\nparams:\n  _target_: exits_on_import.Thing\n")
    one_line(_run("attack=exits"), "attack.params for 'exits'",
             "'exits_on_import.Thing': importing exits_on_import failed: exited with status 7")
    sys.modules.pop("exits_on_import", None)


def test_an_attack_that_exits_while_building_is_one_line(user_conf: Path) -> None:
    (user_conf.parent / "mods" / "exits_when_built.py").write_text(
        "import sys\n\n\nclass Thing:\n    def __init__(self):\n        sys.exit(7)\n")
    (user_conf / "attack" / "exits2.yaml").write_text("name: exits2\nparams:\n  _target_: exits_when_built.Thing\n")
    one_line(_run("attack=exits2"), "attack.params for 'exits2'", "'exits_when_built.Thing': building it failed: "
             "exited with status 7")


class ExitingAttack(Attack):
    """An attack of one's own that ends the process while attacking."""

    strength_budget = 1

    def run(self, oracle, x, y, *, eps, norm, target, sample_id):  # noqa: ANN001, ANN201
        sys.exit(7)


def test_an_attack_that_exits_while_attacking_is_one_line() -> None:
    net, data = _three_classes()
    with pytest.raises(AdvbenchError, match="attack ExitingAttack: attacking a batch failed: exited with status 7"):
        advbench.evaluate(net, data, attack=ExitingAttack(), eps=0.03, overrides=QUIET)


def test_a_user_file_under_a_shipped_name_is_said_to_be_ignored(user_conf: Path, capsys: pytest.CaptureFixture) -> None:
    mine = user_conf / "attack" / "fgsm.yaml"
    mine.write_text("name: fgsm\ndescription: my own\nparams:\n  _target_: advbench.robustness.attacks.gradient.PGD\n")
    cfg = compose_config("config", ["attack=fgsm"])
    assert cfg.attack.params._target_.endswith("gradient.FGSM")  # the shipped one wins, as before
    warned = [ln for ln in capsys.readouterr().err.splitlines() if str(mine) in ln]
    assert len(warned) == 1 and "is ignored: attack=fgsm is the shipped option" in warned[0]
    listed = CliRunner().invoke(main, ["list", "attack", "--full"])
    row = next(ln for ln in listed.output.splitlines() if "│ fgsm " in ln)
    assert f"(shipped; ignores {mine})" in row


# ---- a keyword and an override that set the same thing ------------------------------------------------

@pytest.mark.parametrize(("keywords", "override", "message"), [
    ({"attack": "fgsm"}, "attack=pgd", "attack='fgsm' and override 'attack=pgd' both set attack"),
    ({"eps": 0.1}, "threat.eps=0.2", "eps=0.1 and override 'threat.eps=0.2' both set threat.eps"),
    ({"attack": "pgd", "attack_params": {"steps": 3}}, "attack.params.steps=5", "both set attack.params.steps"),
    ({"attack": "pgd", "attack_params": {"steps": 3}}, "attack.params={steps: 5}", "both set attack.params.steps"),
    ({"label": "mine"}, "label=other", "label='mine' and override 'label=other' both set label"),
    ({"threat": "l2"}, "threat=linf", "both set threat"),
    ({"defense": "jpeg"}, "defense=rp", "both set defense"),
])
def test_evaluate_refuses_a_keyword_and_an_override_of_the_same_thing(keywords: dict, override: str,
                                                                      message: str) -> None:
    net, data = _three_classes()
    keywords = dict(keywords)
    model = advbench.Model(net, label=keywords.pop("label")) if "label" in keywords else net  # the model's own name
    with pytest.raises(AdvbenchError, match="give it once") as caught:
        advbench.evaluate(model, data, **{"eps": 0.05, **keywords}, overrides=[override, *QUIET])
    assert message in str(caught.value)


def test_evaluate_takes_an_override_where_no_keyword_set_the_same() -> None:
    net, data = _three_classes()
    chosen = advbench.evaluate(net, data, eps=0.05, overrides=["attack=fgsm", *QUIET])
    assert set(chosen["attack"]) == {"fgsm"}
    params = advbench.evaluate(net, data, attack="pgd", eps=0.05, attack_params={"steps": 2},
                               overrides=["threat=l2", *QUIET])
    assert set(params["norm"]) == {"l2"} and '"steps": 2' in params["attack_params"].iloc[0]


def test_evaluate_preset_refuses_a_label_twice() -> None:
    net, data = _three_classes()
    with pytest.raises(AdvbenchError, match="label='mine' and override 'label=other' both set label"):
        advbench.evaluate_preset(advbench.Model(net, label="mine"), data, budgets={"linf": 0.03, "l2": 0.5}, overrides=["label=other"])


@pytest.mark.parametrize(("keywords", "override", "message"), [
    ({"attack": "fgsm"}, "attack=ifgsm", "attack='fgsm' and override 'attack=ifgsm' both set attack"),
    ({"eps": (0.01,)}, "eps=[0.02]", "eps=(0.01,) and override 'eps=[0.02]' both set eps"),
    ({"attack_params": {"steps": 2}}, "attack.params.steps=3", "both set attack.params.steps"),
])
def test_evaluate_metric_refuses_a_keyword_and_an_override_of_the_same_thing(keywords: dict, override: str,
                                                                             message: str) -> None:
    metric = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 1), nn.Flatten(0))
    with pytest.raises(AdvbenchError, match="give it once") as caught:
        advbench.evaluate_metric(metric, _images(), **keywords, overrides=[override])
    assert message in str(caught.value)
