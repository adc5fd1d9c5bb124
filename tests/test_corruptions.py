"""The common corruptions: range and shape, severity, per-sample seeding, small images, the released files."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from click.testing import CliRunner
from torch import nn

import advbench
from advbench.cli.main import main
from advbench.core.errors import AdvbenchError
from advbench.robustness.corruptions import NAMES, SEVERITIES, corrupt, why_not
from advbench.robustness.corruptions.released import read_released

GENERATED = [n for n in NAMES if why_not(n, 32) is None]


def smooth_images(n: int, side: int, channels: int = 3, seed: int = 0) -> torch.Tensor:
    """Images with structure (blurred noise), not flat: blur and zoom must change them."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, channels, side // 4, side // 4, generator=g)
    return torch.nn.functional.interpolate(x, size=(side, side), mode="bilinear", align_corners=False)


@pytest.mark.parametrize("name", GENERATED)
def test_every_severity_keeps_range_and_shape(name: str) -> None:
    x = smooth_images(2, 32)
    for severity in SEVERITIES:
        out = corrupt(x, torch.tensor([3, 9]), name, severity, seed=0)
        assert out.shape == x.shape and out.dtype == x.dtype
        assert float(out.min()) >= 0.0 and float(out.max()) <= 1.0
        assert not torch.equal(out, (x * 255).round() / 255), f"{name} at severity {severity} changed nothing"


def test_a_sample_is_corrupted_alike_in_any_batch() -> None:
    x = smooth_images(4, 32)
    ids = torch.tensor([10, 11, 12, 13])
    for name in ("gaussian_noise", "shot_noise", "glass_blur", "snow", "fog", "elastic_transform"):
        whole = corrupt(x, ids, name, 3, seed=7)
        alone = corrupt(x[2:3], ids[2:3], name, 3, seed=7)
        assert torch.equal(whole[2:3], alone), name
        other = corrupt(x[2:3], ids[2:3], name, 3, seed=8)
        assert not torch.equal(other, alone), name


def test_small_images_get_what_applies_and_the_rest_is_refused_in_one_line() -> None:
    x = smooth_images(2, 8, channels=1)
    refused = {n for n in NAMES if why_not(n, 8) is not None}
    assert refused == {"motion_blur", "snow", "frost"}
    for name in sorted(set(NAMES) - refused):
        out = corrupt(x, torch.arange(2), name, 5, seed=0)
        assert out.shape == x.shape and 0 <= float(out.min()) <= float(out.max()) <= 1
    with pytest.raises(AdvbenchError, match=r"^motion_blur does not apply to 8-px images: [^\n]*$"):
        corrupt(x, torch.arange(2), "motion_blur", 1, seed=0)
    with pytest.raises(AdvbenchError, match="frost cannot be generated"):
        corrupt(smooth_images(1, 32), torch.arange(1), "frost", 1, seed=0)
    with pytest.raises(AdvbenchError, match="unknown corruption 'fogg'"):
        corrupt(x, torch.arange(2), "fogg", 1, seed=0)
    with pytest.raises(AdvbenchError, match="severity must be one of 1-5, got 6"):
        corrupt(x, torch.arange(2), "fog", 6, seed=0)


def test_severity_lowers_accuracy_of_a_non_robust_model() -> None:
    """A nearest-class-mean classifier of the digits: accuracy over the corruptions that apply to 8 px,
    averaged, falls with severity (Hendrycks & Dietterich's severities are ordered); one step may rise by
    less than one sample in 100 of the 300, the noise of a few samples."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32)[:, None] / 16
    y = torch.tensor(digits.target)
    means = torch.stack([x[y == k].mean(0) for k in range(10)])
    test = torch.arange(0, len(y), 6)

    def accuracy(images: torch.Tensor) -> float:
        d = ((images[:, None] - means[None]) ** 2).flatten(2).sum(-1)
        return float((d.argmin(1) == y[test]).float().mean())

    names = [n for n in NAMES if why_not(n, 8) is None]
    curve = [np.mean([accuracy(corrupt(x[test], test, n, s, seed=0)) for n in names]) for s in SEVERITIES]
    clean = accuracy(x[test])
    assert clean > curve[0]
    assert all(later <= earlier + 0.01 for earlier, later in zip(curve, curve[1:])), curve
    assert curve[4] < curve[0] - 0.05


def write_released(folder, name: str, images: np.ndarray, labels: np.ndarray) -> None:
    """Five severities of `images` (n, H, W, C) uint8, one after another, as RobustBench lays them out."""
    folder.mkdir(parents=True, exist_ok=True)
    np.save(folder / f"{name}.npy", images)
    np.save(folder / "labels.npy", labels)


def test_released_files_are_read_as_they_are(tmp_path) -> None:
    n = 6
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(5 * n, 32, 32, 3), dtype=np.uint8)
    labels = np.tile(rng.integers(0, 10, size=n), 5)
    write_released(tmp_path / "CIFAR-10-C", "fog", images, labels)
    ids = torch.tensor([1, 4])
    got = read_released(tmp_path / "CIFAR-10-C", "fog", 3, ids, torch.tensor(labels[[1, 4]]))
    want = torch.from_numpy(images[[2 * n + 1, 2 * n + 4]]).permute(0, 3, 1, 2).float() / 255
    assert torch.equal(got, want)
    with pytest.raises(AdvbenchError, match="not the data set's"):
        read_released(tmp_path / "CIFAR-10-C", "fog", 3, ids, torch.tensor(labels[[1, 4]]) + 1)
    with pytest.raises(AdvbenchError, match="no released file .*snow.npy"):
        read_released(tmp_path / "CIFAR-10-C", "snow", 3, ids, torch.tensor(labels[[1, 4]]))
    with pytest.raises(AdvbenchError, match="images per severity"):
        read_released(tmp_path / "CIFAR-10-C", "fog", 1, torch.tensor([n]), torch.tensor(labels[[0]]))


PREDICTED = ["sample_id", "label", "clean_pred", *(f"pred_s{s}" for s in SEVERITIES), "min_severity"]


def _check_curves(records: pd.DataFrame) -> None:
    """min_severity is the first severity whose prediction is wrong (0: the clean one; inf: none)."""
    for _, row in records.iterrows():
        wrong = [s for s in SEVERITIES if not row[f"correct_s{s}"]]
        want = 0.0 if not row["clean_correct"] else float(wrong[0]) if wrong else math.inf
        assert row["min_severity"] == want


def test_the_api_writes_per_sample_records_and_refuses_an_attack(tiny_model, digits_tensors, tmp_path) -> None:
    _, _, x, y = digits_tensors
    data = (x[:12], y[:12])
    records = advbench.evaluate(tiny_model, data, threat="corruptions", out_dir=tmp_path,
                                overrides=["threat.corruptions=[contrast,gaussian_noise]"])
    assert len(records) == 24 and set(records["corruption"]) == {"contrast", "gaussian_noise"}
    assert records.groupby("corruption")["sample_id"].apply(sorted).map(list).tolist() == [list(range(12))] * 2
    assert set(records["corruption_constants"]) == {"cifar10-c"} and set(records["corruption_source"]) == {"generated"}
    assert not {"attack", "norm", "eps_budget", "min_eps", "knowledge"} & set(records.columns)
    _check_curves(records)
    assert len(list((tmp_path / "records").glob("*corruption-*.parquet"))) == 2
    with pytest.raises(AdvbenchError, match="'attack='pgd'' does not apply to threat=corruptions"):
        advbench.evaluate(tiny_model, data, threat="corruptions", attack="pgd", out_dir=tmp_path)
    with pytest.raises(AdvbenchError, match="'search.enabled=false' does not apply"):
        advbench.evaluate(tiny_model, data, threat="corruptions", out_dir=tmp_path, overrides=["search.enabled=false"])


def test_the_cli_writes_per_sample_records_for_a_zoo_model(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["run", "threat=corruptions", "threat.corruptions=[brightness]",
                                       "dataset.n_samples=20", f"out_dir={out}"])
    assert result.exit_code == 0, result.output
    part, = (out / "records").glob("digits_natural_corruption-brightness_s0_*.parquet")
    records = pd.read_parquet(part)
    assert len(records) == 20 and set(records["corruption"]) == {"brightness"}
    _check_curves(records)
    result = CliRunner().invoke(main, ["plot", str(out / "records"), "--out", str(tmp_path / "plots")])
    assert result.exit_code == 0, result.output
    table = pd.read_csv(tmp_path / "plots" / "corruptions_digits.csv", index_col=[0, 1, 2])
    drawn = table.loc[("digits", "natural", "brightness")]
    assert drawn["s5"] == pytest.approx(records["correct_s5"].mean())
    assert drawn["mean_1_5"] == pytest.approx(records[[f"correct_s{s}" for s in SEVERITIES]].to_numpy().mean())
    assert (tmp_path / "plots" / "corruptions_digits.png").stat().st_size > 0
    for args, message in ((["attack=pgd"], "Error: 'attack=pgd' does not apply to threat=corruptions"),
                          (["threat.corruptions=[snow]"], "Error: snow does not apply to 8-px images"),
                          (["threat.corruptions=[frost]"], "Error: frost cannot be generated")):
        result = CliRunner().invoke(main, ["run", "threat=corruptions", f"out_dir={out}", *args])
        assert result.exit_code == 1 and result.output.startswith(message), result.output


class _Pixels(nn.Module):
    """A fixed linear classifier of 32-px colour images into 4 classes (its logits' weights seeded)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x - 0.5)


def test_generated_and_released_images_give_the_same_records(tmp_path) -> None:
    model = _Pixels()
    x = (smooth_images(10, 32, seed=4) * 255).round() / 255
    with torch.no_grad():
        y = model(x).argmax(1)
    ids = torch.arange(10)
    folder = tmp_path / "CIFAR-10-C"
    for name in ("fog", "glass_blur"):
        blocks = [corrupt(x, ids, name, s, seed=0) for s in SEVERITIES]
        images = (torch.cat(blocks) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
        write_released(folder, name, images, np.tile(y.numpy(), 5))
    common = {"threat": "corruptions", "out_dir": tmp_path}
    model = advbench.Model(model, num_classes=4)
    made = advbench.evaluate(model, (x, y), **common, overrides=["threat.corruptions=[fog,glass_blur]"])
    read = advbench.evaluate(model, (x, y), **common, overrides=[f"threat.released={folder}"])
    assert set(read["corruption_source"]) == {"released"} and set(made["corruption_source"]) == {"generated"}
    key = ["corruption", "sample_id"]
    pd.testing.assert_frame_equal(made.sort_values(key)[PREDICTED].reset_index(drop=True),
                                  read.sort_values(key)[PREDICTED].reset_index(drop=True))
    assert made["min_severity"].lt(math.inf).any(), "some sample must break for the comparison to mean anything"


def test_corruption_errors_relative_to_a_baseline_row(tiny_model, digits_tensors, tmp_path) -> None:
    """ce: a row's error summed over severities over the baseline's, per corruption; mce: their mean."""
    from advbench.robustness.report.corruption_plot import AGGREGATE, corruption_table, with_corruption_errors

    _, _, x, y = digits_tensors
    data, chosen = (x[:30], y[:30]), ["threat.corruptions=[contrast,pixelate]"]
    torch.manual_seed(1)
    weak = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
    records = pd.concat([advbench.evaluate(advbench.Model(m, label=name), data, threat="corruptions", out_dir=tmp_path, overrides=chosen)
                         for m, name in ((tiny_model, "tiny"), (weak, "weak"))])
    table = with_corruption_errors(corruption_table(records), "weak")
    error = {(r, c): 1 - g[[f"correct_s{s}" for s in SEVERITIES]].to_numpy().mean()
             for (r, c), g in records.groupby(["model_label", "corruption"])}
    for name in ("contrast", "pixelate"):
        want = error[("tiny", name)] / error[("weak", name)]
        assert table.loc[("tensors", "tiny", name), "ce"] == pytest.approx(want)
        assert table.loc[("tensors", "weak", name), "ce"] == pytest.approx(1.0)
    assert table.loc[("tensors", "tiny", AGGREGATE), "mce"] == pytest.approx(
        np.mean([table.loc[("tensors", "tiny", n), "ce"] for n in ("contrast", "pixelate")]))
    with pytest.raises(AdvbenchError, match="--baseline 'alexnet' is no model row"):
        with_corruption_errors(corruption_table(records), "alexnet")
