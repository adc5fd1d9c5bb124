"""The seven NR metrics of the UAP seed paper (+ the pyiqa backend): layouts, loading, gradients.

Catalogue tests run over every `conf/metric/*.yaml`, so a new metric is tested by default.
Layout tests check our replicas against key names and shapes taken from the authors' code;
load tests write files in the authors' container formats and read them back. Random-init
builds are used throughout (their scores are meaningless, only their mechanics are tested);
`test_real_weights_sane` runs only where the real files are present under ADVBENCH_WEIGHTS.
"""

from __future__ import annotations

import inspect
import math
import os
import sys
import types
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterable

import pytest
import torch
import torch.nn.functional as F
import torchvision
from omegaconf import OmegaConf
from torch import nn

from advbench.cli.metrics import build_metric, metric_config
from advbench.core.errors import AdvbenchError
from advbench.quality.metrics import pyiqa_backend
from advbench.quality.metrics.common import PretrainedMetric, RandomWeightsWarning
from advbench.quality.metrics.metric_catalogue import available_metrics
from advbench.quality.metrics.metric_contract import QualityMetric
from advbench.quality.metrics.pyiqa_backend import MissingDependencyError
from advbench.quality.metrics.spaq import patch_starts
from advbench.quality.metrics.vsfa import sitp

pytestmark = pytest.mark.filterwarnings("ignore::advbench.quality.metrics.common.RandomWeightsWarning")

SEED_METRICS = ("paq2piq", "linearity", "vsfa", "mdtvsfa", "koncept", "nima", "spaq")
CATALOGUE = [m for m in available_metrics() if m != "python"]  # a user's own network: tests/test_user_metric.py
# Options that keep CPU tests small where the architecture allows (same code paths).
SMALL: dict[str, dict[str, Any]] = {
    "linearity": {"arch": "resnet18", "resize_to": None},
    "vsfa": {"backbone": "resnet18"},
    "mdtvsfa": {"backbone": "resnet18"},
    "spaq": {"short_side": 96, "patch_size": 64, "patch_stride": 32},
}
# Fixed-size metrics whose forward+backward is seconds on 2 cores even at the smallest input.
HEAVY = {"koncept"}
# Catalogue entries this file knows; others (added later) run in the slow tier with their defaults.
KNOWN = {*SEED_METRICS, "pyiqa"}


def weight_options(name: str) -> list[str]:
    return [str(k) for k in metric_config(name) if str(k).endswith("weights")]


def no_weights(name: str) -> dict[str, None]:
    """Random-init overrides for our metrics; entries this file does not know keep their defaults."""
    return {k: None for k in weight_options(name)} if name in KNOWN else {}


@lru_cache(maxsize=None)
def small_metric(name: str) -> QualityMetric:
    """Build with SMALL options (random init for known entries), shared by tests that do not modify it."""
    try:
        return build_metric(name, **no_weights(name), **SMALL.get(name, {}))
    except MissingDependencyError as exc:
        pytest.skip(str(exc))


@lru_cache(maxsize=None)
def published_metric(name: str) -> PretrainedMetric:
    """Random-init build with the published architecture options of the YAML."""
    return build_metric(name, **no_weights(name))


def cases(rows: Iterable[Any]) -> list[Any]:
    """Parametrize rows (a value or a tuple); HEAVY metrics and entries not in KNOWN run as slow."""
    params = []
    for row in rows:
        values = row if isinstance(row, tuple) else (row,)
        slow = values[0] in HEAVY or values[0] not in KNOWN
        params.append(pytest.param(*values, marks=pytest.mark.slow) if slow else pytest.param(*values))
    return params


# --------------------------------------------------------------------------- catalogue

@pytest.mark.parametrize("name", cases(CATALOGUE))
def test_yaml_has_target_and_metadata(name: str) -> None:
    cfg = metric_config(name)
    assert str(cfg["_target_"]).startswith("advbench.")
    metric = small_metric(name)
    lo, hi = metric.score_range
    assert lo < hi and metric.range_width == hi - lo
    assert isinstance(metric.higher_better, bool)


@pytest.mark.parametrize("name", cases(CATALOGUE))
def test_scores_batch_independent_with_input_gradients(name: str) -> None:
    metric = small_metric(name)
    torch.manual_seed(0)
    x = torch.rand(2, 3, 96, 112, requires_grad=True)
    scores = metric(x)
    assert scores.shape == (2,) and torch.isfinite(scores).all()
    alone = metric(x[1:].detach())
    torch.testing.assert_close(alone, scores[1:].detach(), rtol=1e-4, atol=1e-5)
    if metric.differentiable:
        scores.sum().backward()
        grad = x.grad
        assert torch.isfinite(grad).all()
        assert (grad.flatten(1).abs().amax(dim=1) > 0).all(), "every image needs a non-zero gradient"


@pytest.mark.parametrize("name", cases(CATALOGUE))
def test_missing_weights_file_names_file_and_metric(name: str, tmp_path: Path) -> None:
    if "weights" not in weight_options(name):
        pytest.skip(f"{name} has no weights option")
    missing = tmp_path / "nowhere" / f"{name}.pth"
    overrides = {**no_weights(name), **SMALL.get(name, {}), "weights": str(missing)}
    with pytest.raises(AdvbenchError) as err:
        build_metric(name, **overrides)
    if isinstance(err.value, MissingDependencyError):
        pytest.skip(str(err.value))
    assert str(missing) in str(err.value) and "not found" in str(err.value)
    assert "\n" not in str(err.value)


def test_registry_rejects_unknown_names_and_options() -> None:
    with pytest.raises(AdvbenchError, match=r"unknown metric 'nope'; valid: .*paq2piq"):
        build_metric("nope")
    with pytest.raises(AdvbenchError, match="colour"):
        build_metric("nima", weights=None, colour="red")
    with pytest.raises(AdvbenchError, match="_target_"):
        build_metric({"weights": None})


def test_bad_input_shape_is_one_line_error() -> None:
    with pytest.raises(AdvbenchError, match=r"\(N, 3, H, W\).*\(3, 32, 32\)"):
        small_metric("nima")(torch.rand(3, 32, 32))


@pytest.mark.parametrize("name", cases(CATALOGUE))
def test_scores_do_not_depend_on_train_mode(name: str) -> None:
    metric = small_metric(name)
    x = torch.rand(2, 3, 96, 96)
    before = metric(x)
    metric.train()
    try:
        torch.testing.assert_close(metric(x), before)
    finally:
        metric.eval()


@pytest.mark.parametrize("name", SEED_METRICS)
def test_seed_metrics_stay_frozen_in_eval_mode(name: str) -> None:
    metric = small_metric(name).train()
    assert not any(m.training for m in metric.modules())
    assert not any(p.requires_grad for p in metric.parameters())


def test_random_weights_warn() -> None:
    with pytest.warns(RandomWeightsWarning, match="meaningless"):
        build_metric("nima", weights=None)


# --------------------------------------------------------------------------- layouts

def _resnet_keys(arch: str, fc: bool = False) -> int:
    """Number of state-dict keys of a torchvision ResNet trunk (without fc unless asked)."""
    return len(getattr(torchvision.models, arch)().state_dict()) - (0 if fc else 2)


# Inception-ResNet-v2 (Cadene): 204 BasicConv2d units (conv + 5 BN entries) and 40 residual
# 1x1 convs with bias; see the unit counts per stage in the reference network definition.
_IRV2_UNITS = 5 + 7 + 10 * 6 + 4 + 20 * 4 + 7 + 10 * 4 + 1
_KONCEPT_HEAD = 4 * 2 + 3 * 5

# (metric, option) -> (expected key count, sample of (key, shape)) from the authors' code.
EXPECTED: dict[tuple[str, str], tuple[Callable[[], int], list[tuple[str, tuple[int, ...]]]]] = {
    ("paq2piq", "weights"): (lambda: _resnet_keys("resnet18") + 5 + 2 + 5 + 2, [
        ("body.0.weight", (64, 3, 7, 7)), ("body.1.running_mean", (64,)),
        ("body.4.0.conv1.weight", (64, 64, 3, 3)), ("body.5.0.downsample.0.weight", (128, 64, 1, 1)),
        ("body.7.1.bn2.weight", (512,)), ("head.2.weight", (1024,)), ("head.2.running_var", (1024,)),
        ("head.4.weight", (512, 1024)), ("head.6.weight", (512,)), ("head.8.weight", (1, 512)), ("head.8.bias", (1,)),
    ]),
    ("linearity", "weights"): (lambda: _resnet_keys("resnext101_32x8d") + 2 * (3 * 2 + 3 * 5) + 3 * 2, [
        ("features.0.weight", (64, 3, 7, 7)), ("features.4.0.conv2.weight", (256, 8, 3, 3)),
        ("features.6.22.bn3.weight", (1024,)), ("features.7.2.conv3.weight", (2048, 2048, 1, 1)),
        ("dr6.0.weight", (1024, 1024)), ("dr6.1.running_mean", (1024,)), ("dr6.2.weight", (256, 1024)),
        ("dr6.4.weight", (64, 256)), ("dr6.5.weight", (64,)), ("dr7.0.weight", (1024, 2048)),
        ("regr6.weight", (1, 64)), ("regr7.bias", (1,)), ("regression.weight", (1, 128)),
    ]),
    ("vsfa", "weights"): (lambda: 10, [
        ("ann.fc0.weight", (128, 4096)), ("ann.fc0.bias", (128,)), ("ann.fc.weight", (128, 128)),
        ("rnn.weight_ih_l0", (96, 128)), ("rnn.weight_hh_l0", (96, 32)), ("rnn.bias_ih_l0", (96,)),
        ("rnn.bias_hh_l0", (96,)), ("q.weight", (1, 32)), ("q.bias", (1,)),
    ]),
    ("mdtvsfa", "weights"): (lambda: 2 + 4 + 2 + 4 + 4 * 2, [
        ("dimemsion_reduction.weight", (128, 4096)), ("feature_aggregation.weight_ih_l0", (96, 128)),
        ("feature_aggregation.weight_hh_l0", (96, 32)), ("regression.weight", (1, 32)),
        ("nlm.0.weight", (1, 1)), ("nlm.0.bias", (1,)), ("nlm.2.weight", (1, 1)),
        ("lm.K.weight", (1, 1)), ("lm.C.bias", (1,)), ("lm.L.weight", (1, 1)), ("lm.N.bias", (1,)),
    ]),
    ("koncept", "weights"): (lambda: _IRV2_UNITS * 6 + 40 * 2 + _KONCEPT_HEAD, [
        ("base.0.conv.weight", (32, 3, 3, 3)), ("base.0.bn.running_var", (32,)),
        ("base.5.conv.weight", (192, 80, 3, 3)), ("base.7.branch0.conv.weight", (96, 192, 1, 1)),
        ("base.7.branch3.1.conv.weight", (64, 192, 1, 1)), ("base.8.0.branch2.2.conv.weight", (64, 48, 3, 3)),
        ("base.8.9.conv2d.weight", (320, 128, 1, 1)), ("base.9.branch1.2.conv.weight", (384, 256, 3, 3)),
        ("base.10.19.branch1.1.conv.weight", (160, 128, 1, 7)), ("base.11.branch2.2.bn.weight", (320,)),
        ("base.12.8.conv2d.bias", (2080,)), ("base.13.branch1.2.conv.weight", (256, 224, 3, 1)),
        ("base.14.conv.weight", (1536, 2080, 1, 1)), ("fc.0.weight", (2048, 1536)), ("fc.2.running_mean", (2048,)),
        ("fc.4.weight", (1024, 2048)), ("fc.8.weight", (256, 1024)), ("fc.10.bias", (256,)), ("fc.12.weight", (1, 256)),
    ]),
    ("nima", "weights"): (lambda: 6 + 17 * 18 + 6 + 2, [
        ("base_model.0.0.0.weight", (32, 3, 3, 3)), ("base_model.0.0.1.running_mean", (32,)),
        ("base_model.0.1.conv.0.weight", (32, 32, 1, 1)), ("base_model.0.1.conv.3.weight", (32, 1, 3, 3)),
        ("base_model.0.1.conv.6.weight", (16, 32, 1, 1)), ("base_model.0.2.conv.0.weight", (96, 16, 1, 1)),
        ("base_model.0.17.conv.6.weight", (320, 960, 1, 1)), ("base_model.0.18.0.weight", (1280, 320, 1, 1)),
        ("head.2.weight", (10, 1280)), ("head.2.bias", (10,)),
    ]),
    ("spaq", "weights"): (lambda: _resnet_keys("resnet50", fc=True), [
        ("backbone.conv1.weight", (64, 3, 7, 7)), ("backbone.layer4.2.bn3.running_var", (2048,)),
        ("backbone.fc.weight", (1, 2048)), ("backbone.fc.bias", (1,)),
    ]),
}
for _video in ("vsfa", "mdtvsfa"):
    EXPECTED[(_video, "backbone_weights")] = (lambda: _resnet_keys("resnet50"), [
        ("conv1.weight", (64, 3, 7, 7)), ("bn1.running_var", (64,)),
        ("layer1.0.downsample.0.weight", (256, 64, 1, 1)), ("layer4.2.conv3.weight", (2048, 512, 1, 1)),
    ])


def test_every_seed_metric_and_weights_option_has_an_expected_layout() -> None:
    assert set(SEED_METRICS) <= set(CATALOGUE)
    assert {(n, o) for n in SEED_METRICS for o in weight_options(n)} == set(EXPECTED)


@pytest.mark.parametrize(("name", "option"), sorted(EXPECTED))
def test_layout_matches_authors_checkpoint(name: str, option: str) -> None:
    count, samples = EXPECTED[(name, option)]
    state = published_metric(name).weight_files()[option].module.state_dict()
    assert len(state) == count()
    for key, shape in samples:
        assert key in state, key
        assert tuple(state[key].shape) == shape, key


# --------------------------------------------------------------------------- loading

def _authors_file(name: str, option: str, state: dict[str, torch.Tensor]) -> Any:
    """`state` wrapped the way the authors' released file is."""
    if option == "backbone_weights":  # torchvision's ImageNet checkpoint still has its classifier
        channels = [v for k, v in state.items() if k.startswith("layer4") and k.endswith("running_mean")][-1].numel()
        return {**state, "fc.weight": torch.zeros(1000, channels), "fc.bias": torch.zeros(1000)}
    if name == "paq2piq":
        return {"model": state, "opt": {"lr": 1e-3}}
    if name == "linearity":
        return {"model": state, "optimizer": {}, "amp": {"loss_scaler0": {"loss_scale": 1.0}},
                "k": [2.5, 0.5, 7.0], "b": [10.0, -3.0, 1.5]}
    if name == "spaq":
        return {"state_dict": state, "epoch": 7}
    return state


def _random_state(module: nn.Module) -> dict[str, torch.Tensor]:
    """A state dict of `module`'s layout with values unlike any fresh initialisation."""
    gen = torch.Generator().manual_seed(1)
    return {k: (torch.rand(v.shape, generator=gen) + 0.5 if v.is_floating_point() else v.clone())
            for k, v in module.state_dict().items()}


def _build_with(name: str, **paths: str) -> PretrainedMetric:
    return build_metric(name, **{**no_weights(name), **SMALL.get(name, {}), **paths})


@pytest.mark.parametrize(("name", "option"), cases(sorted(EXPECTED)))
def test_load_file_in_authors_format(name: str, option: str, tmp_path: Path) -> None:
    spec_module = small_metric(name).weight_files()[option].module
    state = _random_state(spec_module)
    path = tmp_path / f"{name}-{option}.pth"
    torch.save(_authors_file(name, option, state), path)
    metric = _build_with(name, **{option: str(path)})
    loaded = metric.weight_files()[option].module.state_dict()
    for key, value in state.items():
        torch.testing.assert_close(loaded[key], value, msg=key)
    assert metric.pretrained == (len(weight_options(name)) == 1)


def test_linearity_applies_checkpoint_rescaling(tmp_path: Path) -> None:
    """The overall output is mapped with k[0], b[0] (the authors' i=0); k[1:], b[1:] map side outputs."""
    base = small_metric("linearity")
    path = tmp_path / "p1q2.pth"
    torch.save(_authors_file("linearity", "weights", base.net.state_dict()), path)
    metric = _build_with("linearity", weights=str(path))
    x = torch.rand(2, 3, 64, 64)
    torch.testing.assert_close(metric(x), base(x) * 2.5 + 10.0)


def test_linearity_without_rescaling_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "bare.pth"
    torch.save({"model": small_metric("linearity").net.state_dict()}, path)
    with pytest.raises(AdvbenchError, match=r"'k' and 'b'"):
        _build_with("linearity", weights=str(path))


def test_data_parallel_prefix_and_old_batchnorm_files_load(tmp_path: Path) -> None:
    state = _random_state(small_metric("nima").net)
    old = {f"module.{k}": v for k, v in state.items() if not k.endswith("num_batches_tracked")}
    path = tmp_path / "nima.pth"
    torch.save(old, path)
    loaded = _build_with("nima", weights=str(path)).net.state_dict()
    torch.testing.assert_close(loaded["head.2.weight"], state["head.2.weight"])


def _corrupt(state: dict[str, torch.Tensor], how: str) -> tuple[dict[str, torch.Tensor], str]:
    """One layout defect; returns the file content and the key the error must name."""
    keys = [k for k in state if not k.endswith("num_batches_tracked")]
    key = keys[len(keys) // 2]
    bad = dict(state)
    if how == "renamed":
        bad[key.replace(".", "_x.", 1)] = bad.pop(key)
    elif how == "shape":
        bad[key] = torch.zeros(*state[key].shape, 2)
    else:
        bad[key + "_extra"] = torch.zeros(1)
        key += "_extra"
    return bad, key


# Every loader gets a renamed key; the other defects are checked on one file of each kind.
MISMATCH_CASES = [(name, option, "renamed") for name, option in sorted(EXPECTED)] + [
    (name, option, how) for name, option in (("nima", "weights"), ("vsfa", "backbone_weights"))
    for how in ("shape", "unexpected")
]


@pytest.mark.parametrize(("name", "option", "how"), cases(MISMATCH_CASES))
def test_layout_mismatch_names_first_bad_key(name: str, option: str, how: str, tmp_path: Path) -> None:
    state = small_metric(name).weight_files()[option].module.state_dict()
    bad, key = _corrupt(state, how)
    path = tmp_path / "bad.pth"
    torch.save(_authors_file(name, option, bad), path)
    with pytest.raises(AdvbenchError) as err:
        _build_with(name, **{option: str(path)})
    message = str(err.value)
    assert f"'{key}'" in message and str(path) in message and name in message and "\n" not in message


def test_file_that_is_not_a_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "junk.pth"
    path.write_bytes(b"definitely not a torch file")
    with pytest.raises(AdvbenchError, match="weights-only torch checkpoint"):
        _build_with("nima", weights=str(path))


def test_checkpoint_that_would_run_code_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "evil.pth"
    torch.save({"state_dict": small_metric("nima").net.state_dict(), "hook": types.SimpleNamespace(x=1)}, path)
    with pytest.raises(AdvbenchError, match="weights-only"):
        _build_with("nima", weights=str(path))


# --------------------------------------------------------------------------- per-metric behaviour

def _sitp_reference(q: list[float], tau: int = 12, beta: float = 0.5) -> list[float]:
    """Direct reading of the authors' TP: min over the past tau frames, softmin mean over the next."""
    out = []
    for t in range(len(q)):
        past = q[max(0, t - tau + 1): t + 1]
        future = q[t: t + tau]
        weights = [math.exp(-v) for v in future]
        current = sum(w * v for w, v in zip(weights, future)) / sum(weights)
        out.append(beta * current + (1 - beta) * min(past))
    return out


def test_sitp_matches_definition() -> None:
    torch.manual_seed(0)
    q = torch.randn(3, 30)
    expected = torch.tensor([_sitp_reference(row.tolist()) for row in q])
    torch.testing.assert_close(sitp(q), expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(sitp(q[:, :1]), q[:, :1])


@pytest.mark.parametrize("name", ["vsfa", "mdtvsfa"])
def test_video_scores_and_images_as_one_frame_videos(name: str) -> None:
    metric = small_metric(name)
    assert metric.is_video
    torch.manual_seed(0)
    video = torch.rand(2, 3, 3, 48, 48)
    scores = metric.score_video(video)
    assert scores.shape == (2,) and torch.isfinite(scores).all()
    torch.testing.assert_close(metric.score_video(video[0]), scores[:1])
    torch.testing.assert_close(metric(video[:, 0]), metric.score_video(video[:, :1]))
    with pytest.raises(AdvbenchError, match="T, 3, H, W"):
        metric.score_video(torch.rand(2, 5, 4, 8, 8))


def test_mdtvsfa_output_is_inside_its_mapping_range() -> None:
    scores = small_metric("mdtvsfa")(torch.rand(4, 3, 64, 64))
    assert ((scores > 0) & (scores < 1)).all()


@pytest.mark.parametrize(
    ("length", "patch", "stride"), [(512, 224, 112), (683, 224, 112), (224, 224, 112), (300, 100, 50)]
)
def test_spaq_patch_grid(length: int, patch: int, stride: int) -> None:
    starts = patch_starts(length, patch, stride)
    assert starts[0] == 0 and starts[-1] == length - patch
    steps = [b - a for a, b in zip(starts, starts[1:])]
    assert all(0 < s <= stride for s in steps) and all(s == stride for s in steps[:-1])


def test_spaq_score_is_mean_over_patches() -> None:
    metric = small_metric("spaq")
    x = torch.rand(1, 3, 48, 64)  # -> 96 x 128 -> 2 x 3 patches of 64 (stride 32)
    patches = metric.patches(x)
    assert patches.shape[:2] == (1, 6) and patches.shape[-2:] == (64, 64)
    torch.testing.assert_close(metric(x), metric.net(patches[0]).mean().view(1))


def test_nima_score_is_mean_of_rating_distribution() -> None:
    metric = small_metric("nima")
    x = torch.rand(2, 3, 64, 64)
    probs = metric.net(metric.normalize(F.interpolate(x, size=(224, 224), mode="bilinear", antialias=True)))
    torch.testing.assert_close(probs.sum(dim=1), torch.ones(2))
    torch.testing.assert_close(metric(x), (probs * torch.arange(1.0, 11.0)).sum(dim=1))
    assert ((metric(x) >= 1) & (metric(x) <= 10)).all()


# --------------------------------------------------------------------------- pyiqa backend

def test_pyiqa_missing_dependency(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pyiqa", None)
    with pytest.raises(MissingDependencyError, match=r"install advbench\[pyiqa\]"):
        build_metric("pyiqa", weights=None)


class _FakeArch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 1, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x).mean(dim=(2, 3))


def test_pyiqa_wrapper_uses_local_weights_and_metadata(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls: list[dict[str, Any]] = []

    def create_metric(name: str, **kwargs: Any) -> Any:
        calls.append({"name": name, **kwargs})
        return types.SimpleNamespace(net=_FakeArch(), lower_better=True)

    monkeypatch.setitem(sys.modules, "pyiqa", types.SimpleNamespace(create_metric=create_metric,
                                                                     list_models=lambda metric_mode: ["musiq"]))

    def musiq_parameters(pretrained: bool = True, pretrained_model_path: str | None = None) -> None:
        """The constructor options of pyiqa's MUSIQ that the backend reads; the fake package has no architectures."""

    monkeypatch.setattr(pyiqa_backend, "architecture_parameters",
                        lambda pyiqa, name: inspect.signature(musiq_parameters).parameters)
    state = _random_state(_FakeArch())
    path = tmp_path / "musiq.pth"
    torch.save({"params": state}, path)
    metric = build_metric("pyiqa", weights=str(path))
    assert calls[0]["name"] == "musiq" and calls[0]["pretrained"] is False
    assert metric.higher_better is False and metric.pretrained
    torch.testing.assert_close(metric.net.conv.weight, state["conv.weight"])
    x = torch.rand(3, 3, 16, 16, requires_grad=True)
    scores = metric(x)
    assert scores.shape == (3,)
    scores.sum().backward()
    assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0


# --------------------------------------------------------------------------- real weights

def _real_paths(name: str) -> dict[str, str] | None:
    if not os.environ.get("ADVBENCH_WEIGHTS"):
        return None
    cfg = OmegaConf.to_container(metric_config(name), resolve=True)
    paths = {k: str(Path(os.path.expanduser(cfg[k]))) for k in weight_options(name)}
    return paths if all(Path(p).is_file() for p in paths.values()) else None


def _test_images() -> torch.Tensor:
    """Two natural photographs bundled with scikit-image (no download)."""
    from skimage import data

    images = [torch.from_numpy(img).permute(2, 0, 1).float() / 255 for img in (data.astronaut(), data.chelsea())]
    return torch.stack([F.interpolate(im[None], size=(256, 256), mode="bilinear", antialias=True)[0] for im in images])


@pytest.mark.slow
@pytest.mark.parametrize("name", SEED_METRICS)
def test_real_weights_sane(name: str) -> None:
    paths = _real_paths(name)
    if paths is None:
        pytest.skip(f"real weights for {name} not under ADVBENCH_WEIGHTS")
    metric = build_metric(name, **paths)
    clean = _test_images()
    blurred = F.avg_pool2d(F.pad(clean, (7, 7, 7, 7), mode="reflect"), 15, stride=1)
    degraded = (blurred + 0.15 * torch.randn_like(blurred)).clamp(0, 1)
    with torch.no_grad():
        good, bad = metric(clean), metric(degraded)
    lo, hi = metric.score_range
    margin = 0.25 * (hi - lo)
    assert torch.isfinite(good).all() and ((good > lo - margin) & (good < hi + margin)).all(), good
    sign = 1 if metric.higher_better else -1
    assert (sign * (good - bad) > 0).all(), (good, bad)
