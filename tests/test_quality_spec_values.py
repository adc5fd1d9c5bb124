"""The quality half's job specs hold typed settings, built from the composed config where the options are
read (`cli.spec_values`), and what keys, files and records hash of them is what the YAML's mappings gave:
the same values, of the same types (an int where the YAML has a float stays an int), in the same order."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest
from omegaconf import OmegaConf

from advbench.cli.config import compose_config
from advbench.cli.quality_tasks import attack_spec, defense_spec, job_spec, resolved
from advbench.cli.spec_values import settings, typed
from advbench.core.catalog import config_root, group_options
from advbench.core.errors import AdvbenchError
from advbench.core.keys import content_key
from advbench.quality.attacks.iterative import IFGSM
from advbench.quality.iqa.run import MetricAttackSpec
from advbench.quality.metrics.defended import KINDS, JpegParams, MetricDefense
from advbench.quality.stability.uap_rd import RawSettings, StabilitySpec, SyntheticClips
from advbench.quality.stability.video import RawFormat
from advbench.quality.uap.evaluation import MadcSettings, Table1Spec
from advbench.quality.uap.training import HeldOut, TrainSpec, UapSettings


def test_the_uap_settings_are_the_yamls_mapping_in_its_order() -> None:
    for overrides in ([], ["uap.lr=1", "uap.clamp=0.05"], ["uap=quick"]):
        cfg = compose_config("uap_train", overrides)
        spec = job_spec(TrainSpec, cfg, metric="cnnqa")
        assert isinstance(spec.uap, UapSettings) and isinstance(spec.validate, HeldOut)
        # the .pt's metadata is json.dumps of these, unsorted: the same text, byte for byte
        assert json.dumps(asdict(spec.uap)) == json.dumps(resolved(cfg.uap))
        assert json.dumps(asdict(spec.validate)) == json.dumps(resolved(cfg.validate))
    assert spec.uap.epochs == 1
    lr = job_spec(TrainSpec, compose_config("uap_train", ["uap.lr=1"]), metric="cnnqa").uap.lr
    assert lr == 1 and type(lr) is int   # the YAML's 0.001 is a float; the override's int is kept


def test_the_madc_settings_are_the_yamls_mapping() -> None:
    for overrides in ([], ["madc.lr=1", "madc.mse_power=2"]):
        cfg = compose_config("uap_eval", overrides)
        spec = job_spec(Table1Spec, cfg, metric="cnnqa")
        assert isinstance(spec.madc, MadcSettings)
        assert json.dumps(asdict(spec.madc)) == json.dumps(resolved(cfg.madc))
    assert type(spec.madc.lr) is int and spec.madc.mse_power == 2


def test_the_raw_format_in_the_rd_identity_is_the_yamls() -> None:
    """`run_rd` keys RD parts on `asdict(raw)`: the typed settings give the RawFormat the mapping gave."""
    for overrides in (["raw.width=64", "raw.height=48"], ["raw.width=64", "raw.height=48", "raw.fps=29.97"]):
        cfg = compose_config("uap_stability", overrides)
        spec = job_spec(StabilitySpec, cfg, metric="cnnqa")
        raw = resolved(cfg.raw)
        mapping_format = RawFormat(raw["width"], raw["height"], raw["pix_fmt"], raw["fps"])
        assert json.dumps(asdict(spec.raw.format())) == json.dumps(asdict(mapping_format))
    assert type(job_spec(StabilitySpec, compose_config("uap_stability", []), metric="m").raw.fps) is int
    plain = job_spec(StabilitySpec, compose_config("uap_stability", []), metric="cnnqa")
    assert plain.raw.format() is None
    assert plain.synthetic == SyntheticClips(None, (256, 384), 30, ("pan", "zoom", "shake"))


@pytest.mark.parametrize(("overrides", "message"), [
    (["madc.mse_power=high"], "madc.mse_power must be a number, got 'high'"),
    (["+madc.restarts=2"], "madc.restarts is not a parameter of madc; valid: steps, lr, mse_power"),
    (["~madc.steps"], "madc needs madc.steps"),
    (["madc=7"], "madc must be a group of settings (steps, lr, mse_power), got 7"),
])
def test_a_bad_setting_is_one_line_naming_it(overrides: list[str], message: str) -> None:
    with pytest.raises(AdvbenchError) as err:
        job_spec(Table1Spec, compose_config("uap_eval", overrides), metric="cnnqa")
    assert str(err.value) == message


def test_leaves_are_checked_against_their_annotations() -> None:
    assert typed(int | tuple[int, int], [16, 32], "size") == (16, 32)
    assert typed(int | tuple[int, int], 16, "size") == 16
    with pytest.raises(AdvbenchError, match=r"size must be a whole number or a list \[a whole number, a whole number\]"):
        typed(int | tuple[int, int], [16, 32, 64], "size")
    with pytest.raises(AdvbenchError, match="raw.fps must be a number, got True"):
        settings(RawSettings, {"width": None, "height": None, "pix_fmt": "yuv420p", "fps": True}, "raw")
    with pytest.raises(AdvbenchError, match=r"synthetic.motions\[1\] must be text, got 3"):
        settings(SyntheticClips, {"n": 2, "size": 64, "frames": 8, "motions": ["pan", 3]}, "synthetic")
    with pytest.raises(AdvbenchError, match="uap.epochs must be a whole number, got 2.5"):
        settings(UapSettings, {"size": 64, "clamp": 0.1, "lr": 1e-3, "epochs": 2.5, "batch_size": 8}, "uap")


def params_identity(cfg) -> dict:
    """What the cell key held before the attack was built where the options are read: the option's params
    but `_target_`, as the YAML (and the overrides) gave them."""
    return {k: v for k, v in resolved(cfg.attack.params).items() if k != "_target_"}


@pytest.mark.parametrize("option", group_options("iqa/attack"))
def test_the_attacks_identity_is_its_options_params(option: str) -> None:
    cfg = compose_config("iqa", [f"attack={option}"])
    attack = attack_spec(cfg)
    assert attack.identity() == params_identity(cfg)
    assert content_key(attack.identity()) == content_key(params_identity(cfg))


@pytest.mark.parametrize("overrides", [["attack=korhonen", "attack.params.lr=1"], ["attack=uap", "attack.params.lr=1"],
                                       ["attack=ifgsm", "attack.params.steps=3", "attack.params.alpha=null"],
                                       ["attack=madc", "+attack.params.mse_power=1"]])
def test_an_overridden_hyperparameter_keys_the_cell_as_the_mapping_did(overrides: list[str]) -> None:
    cfg = compose_config("iqa", overrides)
    identity = attack_spec(cfg).identity()
    assert json.dumps(identity, sort_keys=True) == json.dumps(params_identity(cfg), sort_keys=True)
    assert content_key(identity) == content_key(params_identity(cfg))
    if "attack.params.lr=1" in overrides:   # the YAML's lr is a float; the int the override gave is kept
        assert type(identity["lr"]) is int


def test_an_undeclared_hyperparameter_cannot_key_a_cell() -> None:
    class Loose(IFGSM):
        def __init__(self, *, steps: int = 10, extra: int = 0) -> None:
            super().__init__(steps=steps)
            self.extra = extra

    with pytest.raises(AdvbenchError, match="Loose: its option sets extra, which the class does not declare"):
        MetricAttackSpec(Loose(extra=1), ("steps", "extra"))


@pytest.mark.parametrize("overrides", [[f"defense={option}"] for option in group_options("defense", config_root("iqa"))]
                         + [["defense=blur", "defense.params.sigma=2"], ["defense=resize", "defense.params.factor=3"]])
def test_the_defenses_identity_holds_its_options_params(overrides: list[str]) -> None:
    """The cell key and the records' `defense_params` hold the params sorted by name, as the YAML gave them."""
    cfg = compose_config("iqa", overrides)
    spec = defense_spec(cfg)
    assert type(spec.params) is KINDS[spec.name].params
    given = dict(sorted(resolved(cfg.defense.params).items()))
    assert json.dumps(spec.identity()["params"]) == json.dumps(given)
    assert content_key(spec.identity()) == content_key({**spec.identity(), "params": given})
    if "defense.params.sigma=2" in overrides:
        assert type(spec.params.sigma) is int   # the YAML's 1.0 is a float; the override's int is kept


@pytest.mark.parametrize(("defense", "message"), [
    ({"name": "blur", "params": {"radius": 2}}, "defense.params.radius is not a parameter of defense 'blur'; valid: sigma"),
    ({"name": "jpeg", "params": {}}, "defense 'jpeg' needs defense.params.quality"),
    ({"name": "jpeg", "params": {"quality": "high"}}, "defense.params.quality must be a whole number, got 'high'"),
    ({"name": "fog", "params": {}}, "defense.name is 'fog'; valid: none, jpeg, bit_depth, median, blur, resize, crop_flip"),
])
def test_a_bad_defense_parameter_is_one_line_naming_it(defense: dict, message: str) -> None:
    with pytest.raises(AdvbenchError) as err:
        defense_spec(OmegaConf.create({"defense": defense}))
    assert str(err.value) == message


def test_a_defense_built_in_python_is_checked_too() -> None:
    with pytest.raises(AdvbenchError, match=r"defense.params.quality must be a whole number in \[1, 100\], got 5.5"):
        MetricDefense("jpeg", JpegParams(5.5))
    with pytest.raises(AdvbenchError, match="defense 'blur' takes BlurParams, not JpegParams"):
        MetricDefense("blur", JpegParams(50))
