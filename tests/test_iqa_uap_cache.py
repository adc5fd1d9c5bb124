"""The universal perturbations' cache: an entry is reused only when it is the UAP its name promises.

`uap` and `cumulative_uap` keep their trained perturbation under `uaps/<metric>/<method>-<key>.pt`,
the key computed from the training settings. A UAP trained with other settings and copied over
the entry, or a file that is no UAP at all, is refused in one line before a cell writes a record;
the genuine entry is loaded without training again.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch
from torch import nn

from advbench.cli import quality_tasks as iqa_run
from advbench.cli.config import compose_config
from advbench.core.digests import tensor_digest
from advbench.core.errors import AdvbenchError
from advbench.quality.attacks.metric_attack import PrepareContext
from advbench.quality.metrics.metric_contract import QualityMetric
from advbench.quality.uap import attacks as universal
from advbench.quality.uap.attacks import CumulativeUniversal, Universal
from advbench.quality.uap.perturbation import save_uap

ATTACKS = {"uap": Universal, "cumulative_uap": CumulativeUniversal}
TINY = {"epochs": 1, "batch_size": 2, "n_train": 2}
LR = {"uap": (1e-3, 5e-2), "cumulative_uap": (1.0, 0.5)}  # (the cell's lr, a foreign lr)


class Brightness(QualityMetric):
    """A tiny differentiable metric: a squashed mean brightness, one parameter."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(4.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.scale * (x.mean(dim=(1, 2, 3)) - 0.5))


def prepare(attack: Universal, cache: Path) -> dict:
    return attack.prepare(Brightness().eval(), PrepareContext(cache=cache, seed=0, device=torch.device("cpu"),
                                                              progress=False))


@pytest.fixture(scope="module")
def entries(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """For each method: the genuine entry of the cell's settings, and one trained with a foreign lr."""
    out = {}
    crops = torch.rand(2, 3, 256, 256, generator=torch.Generator().manual_seed(0))  # not the photos: faster
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(universal, "uap_images", lambda *args, **kwargs: crops)
        for name, cls in ATTACKS.items():
            lr, foreign_lr = LR[name]
            genuine, foreign = tmp_path_factory.mktemp(f"{name}-genuine"), tmp_path_factory.mktemp(f"{name}-foreign")
            digest = prepare(cls(lr=lr, **TINY), genuine)["uap"]
            foreign_digest = prepare(cls(lr=foreign_lr, **TINY), foreign)["uap"]
            (pt,), (other,) = genuine.glob("*.pt"), foreign.glob("*.pt")
            assert digest != foreign_digest
            out[name] = {"pt": pt, "digest": digest, "foreign": other, "foreign_digest": foreign_digest}
    return out


def assert_refused(caught: pytest.ExceptionInfo, entry: Path, *needles: str) -> None:
    message = str(caught.value)
    assert "\n" not in message, message
    assert str(entry) in message and "not the cache entry its name promises" in message, message
    assert "delete it and advbench trains the right one" in message, message
    for needle in needles:
        assert needle in message, message


@pytest.mark.parametrize("name", ATTACKS)
def test_a_foreign_uap_copied_over_the_entry_is_refused_before_any_record(
        name: str, entries: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lr, foreign_lr = LR[name]
    cfg = compose_config("iqa", [f"attack={name}", "metric=cnnqa", "n_images=2", "eps=[0.01]", "threads=1",
                                 "progress=false", f"out_dir={tmp_path / 'out'}", f"attack.params.lr={lr}",
                                 *(f"attack.params.{k}={v}" for k, v in TINY.items())])
    monkeypatch.setattr(iqa_run, "build_metric", lambda _cfg: Brightness())
    entry = tmp_path / "out" / "uaps" / "cnnqa" / entries[name]["pt"].name
    entry.parent.mkdir(parents=True)
    shutil.copyfile(entries[name]["foreign"], entry)
    with pytest.raises(AdvbenchError) as caught:
        iqa_run.iqa_main(cfg)
    assert_refused(caught, entry, f"lr {foreign_lr!r}, not {lr!r}")
    records = tmp_path / "out" / "records"
    assert not records.exists() or not any(records.rglob("*")), "a record was written"
    # The genuine entry in its place is the cell's, and its digest is what the records carry.
    shutil.copyfile(entries[name]["pt"], entry)
    part = iqa_run.iqa_main(cfg)
    assert set(pd.read_parquet(part)["uap"]) == {entries[name]["digest"]}


@pytest.mark.parametrize("name", ATTACKS)
def test_the_genuine_entry_is_reused_without_training(name: str, entries: dict, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    shutil.copyfile(entries[name]["pt"], tmp_path / entries[name]["pt"].name)

    def no_training(*args, **kwargs):
        raise AssertionError("trained again although the cache holds the entry")

    monkeypatch.setattr(ATTACKS[name], "_train", no_training)
    attack = ATTACKS[name](lr=LR[name][0], **TINY)
    assert prepare(attack, tmp_path) == {"uap": entries[name]["digest"]}
    assert tensor_digest(attack.delta) == entries[name]["digest"]


def test_an_explicit_file_loads_as_given(entries: dict) -> None:
    """`file=` is the user's choice (its digest goes into the cell key): no settings to compare with."""
    attack = Universal(file=str(entries["uap"]["foreign"]), lr=LR["uap"][0], **TINY)
    assert prepare(attack, Path("unused")) == {"uap": entries["uap"]["foreign_digest"]}


def _garbage(pt: Path) -> None:
    pt.write_bytes(b"this is not a UAP\n" * 4)


def _truncated(pt: Path) -> None:
    pt.write_bytes(pt.read_bytes()[:200])


def _no_meta(pt: Path) -> None:
    torch.save({"uap": torch.zeros(3, 256, 256)}, pt)


def _bare_tensor(pt: Path) -> None:
    torch.save(torch.zeros(3, 256, 256), pt)


def _pickled_object(pt: Path) -> None:
    torch.save({"uap": torch.zeros(3, 256, 256), "meta": nn.Identity()}, pt)


def _other_shape(pt: Path) -> None:
    meta = json.loads(torch.load(pt, weights_only=True)["meta"])
    save_uap(torch.zeros(3, 64, 64), pt.with_suffix(""), meta)


@pytest.mark.parametrize(("spoil", "needle"), [
    (_garbage, "is not a readable UAP"),
    (_truncated, "is not a readable UAP"),
    (_no_meta, "carries no readable settings"),
    (_bare_tensor, "holds no UAP tensor"),
    (_pickled_object, "never unpickles"),
    (_other_shape, "shape (3, 64, 64), not (3, 256, 256)"),
])
def test_a_file_that_is_not_the_entry_is_one_line(spoil, needle: str, entries: dict, tmp_path: Path) -> None:
    entry = tmp_path / entries["uap"]["pt"].name
    shutil.copyfile(entries["uap"]["pt"], entry)
    spoil(entry)
    with pytest.raises(AdvbenchError) as caught:
        prepare(Universal(lr=LR["uap"][0], **TINY), tmp_path)
    assert_refused(caught, entry, needle)
