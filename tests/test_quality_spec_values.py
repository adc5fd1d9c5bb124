"""The quality half's job specs hold typed settings, built from the composed config where the options are
read (`cli.spec_values`), and what keys, files and records hash of them is what the YAML's mappings gave:
the same values, of the same types (an int where the YAML has a float stays an int), in the same order."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from advbench.cli.config import compose_config
from advbench.cli.quality_tasks import job_spec, resolved
from advbench.cli.spec_values import settings, typed
from advbench.core.errors import AdvbenchError
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
