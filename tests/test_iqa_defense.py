"""Metrics behind defenses (`iqa run defense=`): the shared transforms against reference implementations,
adaptive (BPDA / EOT) attacks at least as strong as the naive ones, the clean-cost columns, the cell
key, and bad parameters as one line."""

from __future__ import annotations

import io
import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf
from test_cli import assert_one_line_error, run_cli
from torch import nn

from advbench.cli.config import compose_config
from advbench.cli.quality_tasks import defense_spec
from advbench.core import transforms
from advbench.core.catalog import config_root, group_options
from advbench.core.errors import AdvbenchError
from advbench.core.jpeg_approx import differentiable_jpeg
from advbench.core.sample_draws import row_keys
from advbench.quality.attacks.iterative import IFGSM
from advbench.quality.images import as_batch, uap_images
from advbench.quality.iqa.defense_cost import clean_cost
from advbench.quality.iqa.run import IqaSpec, MetricAttackSpec, iqa_cell
from advbench.quality.metrics.defended import (
    KINDS,
    BitDepthParams,
    BlurParams,
    CropFlipParams,
    DefendedMetric,
    JpegParams,
    MedianParams,
    MetricDefense,
    ResizeParams,
    TransformParams,
)
from advbench.quality.metrics.learned import CNNQA, save_weights, train_cnnqa
from advbench.quality.metrics.metric_contract import QualityMetric
from advbench.quality.metrics.niqe import NIQE


class Tiny(QualityMetric):
    """A fixed random two-layer convolutional score: differentiable, sensitive to texture and colour."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Tanh(), nn.Conv2d(8, 1, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.net(x).mean(dim=(1, 2, 3)))


class Texture(QualityMetric):
    """Laplacian energy plus a small random network: rewards high-frequency detail, as sharpness metrics do."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Tanh(), nn.Conv2d(8, 4, 3))
        self.register_buffer("laplacian", torch.tensor([[0.0, 1, 0], [1, -4, 1], [0, 1, 0]]).expand(3, 1, 3, 3).clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        edges = nn.functional.conv2d(x, self.laplacian, groups=3)
        return edges.pow(2).mean(dim=(1, 2, 3)) + 0.1 * self.net(x).pow(2).mean(dim=(1, 2, 3))


class Bpda(QualityMetric):
    """`metric(transform(x))` with BPDA's identity backward, for comparison with an exact gradient."""

    def __init__(self, metric: QualityMetric, transform) -> None:
        super().__init__()
        self.metric, self.fn = metric, transform

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.metric(transforms.bpda(self.fn, x))


def images(n: int = 2, size: int = 32) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    smooth = torch.nn.functional.interpolate(torch.rand(n, 3, 8, 8, generator=g), size=size, mode="bilinear")
    return (smooth + 0.1 * torch.rand(n, 3, size, size, generator=g)).clamp(0, 1)


DEFAULTS = {"jpeg": JpegParams(50), "bit_depth": BitDepthParams(4), "median": MedianParams(3), "blur": BlurParams(1.0),
            "resize": ResizeParams(2.0), "crop_flip": CropFlipParams(0.75)}


def test_jpeg_matches_a_pil_round_trip() -> None:
    from PIL import Image

    x = images(2, 32)
    ours = transforms.jpeg_roundtrip(x, 60)
    for i in range(len(x)):
        buf = io.BytesIO()
        Image.fromarray((x[i] * 255).round().byte().permute(1, 2, 0).numpy()).save(buf, "JPEG", quality=60)
        ref = torch.from_numpy(np.array(Image.open(buf))).permute(2, 0, 1).float() / 255
        assert (ours[i] - ref).abs().mean() < 1 / 255


def test_median_matches_scipy() -> None:
    from scipy.ndimage import median_filter

    x = images(2, 17)
    for k in (3, 5):
        ref = median_filter(x.numpy(), size=(1, 1, k, k), mode="mirror")
        torch.testing.assert_close(transforms.median_filter(x, k), torch.from_numpy(ref))


def test_blur_matches_torchvision() -> None:
    from torchvision.transforms.functional import gaussian_blur

    x = images(2, 24)
    for sigma in (0.5, 1.5):
        size = 2 * math.ceil(3 * sigma) + 1
        torch.testing.assert_close(transforms.gaussian_blur(x, sigma), gaussian_blur(x, [size, size], [sigma, sigma]),
                                   rtol=1e-4, atol=1e-5)


def test_bit_depth_keeps_levels_and_resize_by_one_is_the_identity() -> None:
    x = images(2, 16)
    assert torch.unique(transforms.bit_depth(x, 2)).numel() <= 4
    torch.testing.assert_close(transforms.resize_down_up(x, 1.0), x)


def test_crop_flip_is_a_crop_or_its_mirror_and_independent_of_the_batch() -> None:
    x = images(16, 12)
    keys = row_keys(x)
    whole = transforms.crop_flip(x, 1.0, 0, keys, 0)
    flipped = [bool(torch.equal(whole[i], x[i].flip(-1))) for i in range(16)]
    assert all(torch.equal(whole[i], x[i]) or flipped[i] for i in range(16)) and 0 < sum(flipped) < 16
    part = transforms.crop_flip(x, 0.5, 0, keys, 3)
    assert part.shape == (16, 3, 6, 6)
    torch.testing.assert_close(transforms.crop_flip(x[5:7], 0.5, 0, keys[5:7], 3), part[5:7])


def test_bpda_is_the_transform_forward_and_the_identity_backward() -> None:
    x = images(2, 16).requires_grad_(True)
    out = transforms.bpda(lambda v: transforms.jpeg_roundtrip(v, 30), x)
    torch.testing.assert_close(out, transforms.jpeg_roundtrip(x, 30))
    (grad,) = torch.autograd.grad((out * 3).sum(), x)
    torch.testing.assert_close(grad, torch.full_like(grad, 3.0))


def gain(attacked: QualityMetric, judge: QualityMetric, x: torch.Tensor) -> float:
    """Mean score gain, on `judge`, of 10 I-FGSM steps at ε = 4/255 taken on `attacked`."""
    x_adv = IFGSM(steps=10, alpha=1 / 255).run(attacked, x, torch.full((len(x),), 4 / 255)).x_adv
    with torch.no_grad():
        return float((judge(x_adv) - judge(x)).mean())


@pytest.mark.parametrize("name", ["median", "blur", "resize", "jpeg"])
def test_the_adaptive_attack_gains_at_least_as_much_as_the_naive_one(name: str) -> None:
    """Adaptive: the defended metric's gradient (exact, or through the differentiable JPEG); naive: the
    undefended metric's. A high-frequency metric, whose naive perturbation the filters remove."""
    metric, x = Texture(), images(2, 32)
    defended = DefendedMetric(metric, MetricDefense(name, DEFAULTS[name]))
    adaptive, naive = gain(defended, defended, x), gain(metric, defended, x)
    assert adaptive > 0 and adaptive >= naive - 0.02 * abs(naive), (adaptive, naive)


def test_median_exact_gradient_beats_bpda() -> None:
    """Why `median` is differentiated exactly, not by BPDA's identity."""
    metric, x = Texture(), images(2, 32)
    exact = DefendedMetric(metric, MetricDefense("median", MedianParams(5)))
    via_bpda = Bpda(metric, lambda v: transforms.median_filter(v, 5))
    assert gain(exact, exact, x) > 2 * gain(via_bpda, exact, x)


def test_differentiable_jpeg_stays_close_to_libjpeg() -> None:
    """The backward's stand-in is the codec, not a blur: on average within 3/255 of libjpeg on noisy
    images (colour and grey, odd sizes, low to high quality), below what JPEG itself changes (54 % of it at quality 95 in grey)."""
    x = images(3, 37)
    for quality in (10, 50, 75, 95):
        for planes in (x, x[:, :1]):
            real = transforms.jpeg_roundtrip(planes, quality)
            error = (differentiable_jpeg(planes, quality) - real).abs().mean()
            assert error < 3 / 255 and error < 0.6 * (real - planes).abs().mean(), (quality, float(error) * 255)


def test_bpda_with_an_approximation_is_the_transform_forward_and_the_approximation_backward() -> None:
    x = images(2, 16).requires_grad_(True)
    out = transforms.bpda(lambda v: transforms.jpeg_roundtrip(v, 30), x, lambda v: differentiable_jpeg(v, 30))
    torch.testing.assert_close(out, transforms.jpeg_roundtrip(x, 30))
    (grad,) = torch.autograd.grad((out ** 2).sum(), x)
    y = x.detach().requires_grad_(True)
    (expected,) = torch.autograd.grad((differentiable_jpeg(y, 30) * 2 * out.detach()).sum(), y)
    torch.testing.assert_close(grad, expected)


def test_the_differentiable_jpeg_backward_beats_the_identity() -> None:
    """Why JPEG's BPDA runs through the codec: the identity spends the budget on frequencies JPEG drops."""
    metric, x = Texture(), images(2, 32)
    defended = DefendedMetric(metric, MetricDefense("jpeg", JpegParams(50)))
    identity = DefendedMetric(metric, MetricDefense("jpeg", JpegParams(50), backward="identity"))
    by_hand = Bpda(metric, lambda v: transforms.jpeg_roundtrip(v, 50))
    assert gain(identity, defended, x) == pytest.approx(gain(by_hand, defended, x), rel=1e-6)
    assert gain(defended, defended, x) > 2 * gain(identity, defended, x)


def test_bit_depth_gradient_is_the_mean_of_the_quantised_and_the_input_gradients() -> None:
    metric, x = Tiny(), images(2, 16).requires_grad_(True)
    defended = DefendedMetric(metric, MetricDefense("bit_depth", BitDepthParams(3)))
    out = defended(x)
    with torch.no_grad():
        torch.testing.assert_close(out, metric(transforms.bit_depth(x, 3)))
    (grad,) = torch.autograd.grad(out.sum(), x)
    at_quantised = transforms.bit_depth(x.detach(), 3).requires_grad_(True)
    at_input = x.detach().requires_grad_(True)
    expected = [torch.autograd.grad(metric(v).sum(), v)[0] for v in (at_quantised, at_input)]
    torch.testing.assert_close(grad, 0.5 * (expected[0] + expected[1]))


@pytest.fixture(scope="module")
def offline_metrics(tmp_path_factory: pytest.TempPathFactory) -> dict[str, QualityMetric]:
    """The offline preset's two metrics, small: CNNQA trained briefly, NIQE on its fitted model."""
    weights = save_weights(train_cnnqa(steps=60, progress=False), tmp_path_factory.mktemp("cnnqa") / "w.pt")
    niqe = NIQE(pristine="fitted", cache_dir=str(tmp_path_factory.mktemp("niqe")))
    return {"cnnqa": CNNQA(weights=str(weights)).eval(), "niqe": niqe.eval()}


@pytest.mark.parametrize("metric_name", ["cnnqa", "niqe"])
@pytest.mark.parametrize(("name", "params"), [("jpeg", JpegParams(75)), ("bit_depth", BitDepthParams(3)),
                                              ("bit_depth", BitDepthParams(5))])
def test_bpda_gains_at_least_as_much_as_the_naive_attack_on_real_metrics(
        metric_name: str, name: str, params: TransformParams, offline_metrics: dict) -> None:
    """BPDA (`bpda=true`) against the undefended metric's gradient (`bpda=false`), both judged by the
    defended metric, on photos; gains in the metric's better direction."""
    metric = offline_metrics[metric_name]
    x = as_batch(uap_images(None, split="test", size=96, limit=4))
    defended = DefendedMetric(metric, MetricDefense(name, params))
    naive = DefendedMetric(metric, MetricDefense(name, params, bpda=False))
    sign = 1 if metric.higher_better else -1
    adaptive, plain = sign * gain(defended, defended, x), sign * gain(naive, defended, x)
    assert adaptive > 0 and adaptive >= plain - 0.02 * abs(plain), (adaptive, plain)


@pytest.mark.parametrize("name", ["jpeg", "bit_depth"])
def test_bpda_false_is_the_undefended_gradient_with_the_defended_score(name: str) -> None:
    metric, x = Tiny(), images(2, 32)
    naive = DefendedMetric(metric, MetricDefense(name, DEFAULTS[name], bpda=False))
    defended = DefendedMetric(metric, MetricDefense(name, DEFAULTS[name]))
    with torch.no_grad():
        torch.testing.assert_close(naive(x), defended(x))
    eps = torch.full((2,), 4 / 255)
    torch.testing.assert_close(IFGSM(steps=3).run(naive, x, eps).x_adv, IFGSM(steps=3).run(metric, x, eps).x_adv)


def test_eot_over_crop_flip_gains_at_least_as_much_as_one_draw() -> None:
    metric, x = Texture(), images(2, 32)
    spec = DEFAULTS["crop_flip"]
    judge = DefendedMetric(metric, MetricDefense("crop_flip", spec, eot=32, seed=7))
    adaptive = gain(DefendedMetric(metric, MetricDefense("crop_flip", spec, eot=8)), judge, x)
    naive = gain(DefendedMetric(metric, MetricDefense("crop_flip", spec, eot=1)), judge, x)
    assert adaptive > 0 and adaptive >= naive - 0.02 * abs(naive), (adaptive, naive)


def test_a_random_defense_scores_an_image_the_same_in_any_batch_and_for_any_eot() -> None:
    x, spec = images(3, 32), DEFAULTS["crop_flip"]
    one, eight = (DefendedMetric(Tiny(), MetricDefense("crop_flip", spec, eot=e, score_draws=4)) for e in (1, 8))
    with torch.no_grad():
        torch.testing.assert_close(one(x)[1:], one(x[1:]))
        torch.testing.assert_close(one(x), eight(x))
    assert not torch.equal(one(x), eight(x)), "with autograd on, the gradient's draws (eot) score the image"


def test_clean_cost_on_constructed_scores() -> None:
    undefended = np.array([0.1, 0.5, 0.3, 0.9])
    frame = lambda defended: pd.DataFrame({"image_id": [0, 1, 2, 3], "score_clean": defended,  # noqa: E731
                                           "clean_score_undefended": undefended})
    assert clean_cost(frame(undefended)) == (1.0, 0.0)
    rho, shift = clean_cost(frame(2 * undefended + 1))
    assert rho == pytest.approx(1.0) and shift == pytest.approx(float(np.mean(undefended + 1)))
    assert clean_cost(frame(1 - undefended))[0] == pytest.approx(-1.0)


def cell(tmp_path: Path, defense: MetricDefense) -> pd.DataFrame:
    spec = IqaSpec(metric="tiny", attack=MetricAttackSpec(IFGSM(steps=2), ("steps",)), eps=[2 / 255, 4 / 255], data=None,
                   n_images=2, size=32, seed=0, device="cpu", batch_size=4, chunk_size=64, force=False, run_id="t",
                   progress=False, records_dir=str(tmp_path / "records"), defense=defense)
    part = iqa_cell(spec, Tiny(), given=(images(2, 32), "test"))
    return pd.read_parquet(part).assign(part=part.name)


def test_identity_defense_costs_nothing_and_the_defense_is_in_the_cell_key(tmp_path: Path) -> None:
    same = cell(tmp_path, MetricDefense("resize", ResizeParams(1.0)))
    np.testing.assert_allclose(same["score_clean"], same["clean_score_undefended"], rtol=1e-5)
    assert clean_cost(same) == pytest.approx((1.0, 0.0), abs=1e-6)
    assert set(same["metric"]) == {"tiny+resize"} and set(same["defense"]) == {"resize"}
    assert json.loads(same["defense_params"][0])["params"] == {"factor": 1.0}
    jpeg50 = cell(tmp_path, MetricDefense("jpeg", JpegParams(50)))
    assert json.loads(jpeg50["defense_params"][0])["backward"] == "differentiable"
    jpeg90 = cell(tmp_path, MetricDefense("jpeg", JpegParams(90)))
    naive = cell(tmp_path, MetricDefense("jpeg", JpegParams(50), bpda=False))
    plain = cell(tmp_path, MetricDefense())
    identity = cell(tmp_path, MetricDefense("jpeg", JpegParams(50), backward="identity"))
    assert json.loads(naive["defense_params"][0])["backward"] == "undefended"
    keys = {f["cell_key"][0] for f in (same, jpeg50, jpeg90, naive, plain, identity)}
    assert len(keys) == 6 and "_jpeg_" in jpeg50["part"][0] and "jpeg" not in plain["part"][0]
    assert (jpeg50["score_clean"] != jpeg50["clean_score_undefended"]).any()
    np.testing.assert_allclose(plain["score_clean"], plain["clean_score_undefended"])
    assert set(plain["metric"]) == {"tiny"} and set(plain["defense"]) == {"none"}
    np.testing.assert_allclose(jpeg50["clean_score_undefended"], plain["score_clean"], rtol=1e-5)


@pytest.mark.parametrize(("bad", "needle"), [
    ({"name": "jpeg", "params": {"quality": 500}}, "defense.params.quality must be a whole number in [1, 100]"),
    ({"name": "jpeg", "params": {"quality": 5.5}}, "defense.params.quality"),
    ({"name": "median", "params": {"k": 4}}, "defense.params.k must be an odd whole number"),
    ({"name": "blur", "params": {"sigma": float("nan")}}, "defense.params.sigma"),
    ({"name": "blur", "params": {"radius": 2}}, "defense.params.radius is not a parameter"),
    ({"name": "crop_flip", "params": {"crop": 0.5}, "eot": 0}, "defense.eot must be a whole number >= 1"),
    ({"name": "crop_flip", "params": {"crop": 0.5}, "score_draws": 1.5}, "defense.score_draws must be a whole"),
    ({"name": "jpeg", "params": {"quality": 50}, "bpda": "yes"}, "defense.bpda must be true or false"),
    ({"name": "fog", "params": {}}, "defense.name is 'fog'"),
    ({"name": "jpeg", "params": {"quality": 50}, "backward": "mean"}, "defense.backward is 'mean'; valid for jpeg: "
                                                                      "differentiable, identity"),
    ({"name": "median", "params": {"k": 3}, "backward": "identity"}, "defense.backward applies only to BPDA"),
    ({"name": "bit_depth", "params": {"bits": 3}, "bpda": False, "backward": "identity"}, "not to bpda=false"),
])
def test_bad_defense_settings_are_one_line(bad: dict, needle: str) -> None:
    with pytest.raises(AdvbenchError, match=re.escape(needle)):
        defense_spec(OmegaConf.create({"defense": bad}))


def test_a_bad_defense_parameter_is_one_line_on_the_command_line(tmp_path: Path) -> None:
    proc = run_cli("iqa", "run", "defense=jpeg", "defense.params.quality=500", cwd=tmp_path)
    assert_one_line_error(proc, "defense.params.quality must be a whole number in [1, 100], got 500")
    proc = run_cli("iqa", "run", "defense=pgd_at", cwd=tmp_path)
    assert_one_line_error(proc, "unknown defense 'pgd_at'", "crop_flip", "jpeg", "median")


@pytest.mark.parametrize("option", group_options("defense", config_root("iqa")))
def test_every_defense_option_composes_to_a_checked_spec(option: str) -> None:
    spec = defense_spec(compose_config("iqa", [f"defense={option}"]))
    assert spec.name == option and type(spec.params) is KINDS[option].params
    assert spec.backward_name == (next(iter(KINDS[option].backwards)) if KINDS[option].backwards else KINDS[option].grad)


def test_a_chosen_backward_and_the_naive_attack_compose_from_the_command_line() -> None:
    chosen = defense_spec(compose_config("iqa", ["defense=bit_depth", "defense.backward=identity"]))
    assert chosen.identity()["backward"] == "identity"
    naive = defense_spec(compose_config("iqa", ["defense=jpeg", "defense.bpda=false"]))
    assert naive.identity()["backward"] == "undefended"
