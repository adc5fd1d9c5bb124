"""Every attack on metrics, on both offline metrics: inside the ε-ball and [0, 1], traces that end at the
attacked score, and a raised score at the largest budget on most images."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate
from test_seed_metrics import CATALOGUE, cases, small_metric

from advbench.cli.config import compose_config
from advbench.core.catalog import group_options
from advbench.core.errors import AdvbenchError
from advbench.quality.attacks.iterative import activity_map
from advbench.quality.attacks.metric_attack import PrepareContext, check_gradient, score_and_grad
from advbench.quality.images import as_batch, uap_images
from advbench.quality.metrics.learned import CNNQA, save_weights, train_cnnqa
from advbench.quality.metrics.metric_contract import QualityMetric
from advbench.quality.metrics.niqe import NIQE

ATTACKS = group_options("iqa/attack")
BUDGETS = torch.tensor([2 / 255, 8 / 255])
# Sign steps over every pixel add the noise NIQE's natural-scene statistics punish: one step of 8/255
# (FGSM) makes NIQE's verdict worse on most images, ten steps of 1/255 (I-FGSM, MSU settings) better on
# about half of them, depending on the image (findings, see docs/iqa.md); the other attacks raise it.
NIQE_RESISTS = {"fgsm"}
NIQE_COIN = {"ifgsm"}


@pytest.fixture(scope="module")
def metrics(tmp_path_factory: pytest.TempPathFactory) -> dict[str, QualityMetric]:
    weights = save_weights(train_cnnqa(steps=60, progress=False), tmp_path_factory.mktemp("cnnqa") / "w.pt")
    niqe = NIQE(pristine="fitted", cache_dir=str(tmp_path_factory.mktemp("niqe")))
    return {"niqe": niqe.eval(), "cnnqa": CNNQA(weights=str(weights)).eval()}


@pytest.fixture(scope="module")
def images() -> torch.Tensor:
    return as_batch(uap_images(None, split="test"), 6)


def build(name: str, tmp_path: Path, metric: QualityMetric):
    params = compose_config("iqa", [f"attack={name}"]).attack.params
    overrides = {"epochs": 1, "n_train": 16} if "uap" in name else {"n_queries": 40} if name == "square" else {}
    attack = instantiate(params, **overrides)
    attack.prepare(metric, PrepareContext(cache=tmp_path, seed=0, device=torch.device("cpu"), progress=False))
    return attack


@pytest.mark.parametrize("metric_name", ["niqe", "cnnqa"])
@pytest.mark.parametrize("name", ATTACKS)
def test_attack_contract(name: str, metric_name: str, metrics: dict, images: torch.Tensor, tmp_path: Path) -> None:
    metric = metrics[metric_name]
    attack = build(name, tmp_path, metric)
    x = images.repeat_interleave(len(BUDGETS), 0)
    eps = BUDGETS.repeat(len(images))
    result = attack.run(metric, x, eps)
    delta = (result.x_adv - x).flatten(1).abs().amax(1)
    assert (delta <= eps + 1e-6).all(), "left the ε-ball"
    assert result.x_adv.min() >= 0 and result.x_adv.max() <= 1
    assert result.trace.shape == (len(x), attack.iterations)
    with torch.no_grad():
        torch.testing.assert_close(result.trace[:, -1], metric(result.x_adv), rtol=1e-4, atol=1e-4)
        clean = metric(x)
    better = (result.trace[:, -1] - clean) * (1 if metric.higher_better else -1)
    top = eps == BUDGETS.max()
    raised = (better[top] > 0).float().mean().item()
    if metric_name == "niqe" and name in NIQE_RESISTS:
        assert raised < 0.5
    elif not (metric_name == "niqe" and name in NIQE_COIN):
        assert raised > 0.5, f"{name} raised {metric_name} on {raised:.0%} of the images at the largest budget"


def test_one_call_serves_a_sweep_of_budgets(metrics: dict, images: torch.Tensor, tmp_path: Path) -> None:
    """An image's row does not depend on the other rows of its batch (budgets or images)."""
    metric = metrics["cnnqa"]
    attack = build("mifgsm", tmp_path, metric)
    x = images[:2].repeat_interleave(2, 0)
    together = attack.run(metric, x, BUDGETS.repeat(2)).x_adv
    alone = attack.run(metric, x[3:], BUDGETS[1:]).x_adv
    torch.testing.assert_close(together[3:], alone, rtol=1e-5, atol=1e-6)


def test_activity_map_follows_texture() -> None:
    flat = torch.full((1, 3, 32, 32), 0.5)
    stripes = flat.clone()
    stripes[..., 16:] = torch.rand((1, 3, 32, 16), generator=torch.Generator().manual_seed(0))
    mask = activity_map(torch.cat([flat, stripes]))
    assert torch.equal(mask[0], torch.ones_like(mask[0]))  # no texture anywhere: nothing to hide in
    assert mask[1, 0, 16, 2] == 0 and mask[1, 0, 16, 24] > 0.2  # flat half masked out, noisy half let through


class Constant(QualityMetric):
    """A metric with no gradient through its score, as several pyiqa metrics are."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.detach().mean(dim=(1, 2, 3)) * 0 + x.sum() * 0


@pytest.mark.parametrize("name", cases(CATALOGUE))
def test_every_differentiable_metric_gives_the_attacks_a_usable_gradient(name: str) -> None:
    """The catalogue as the attacks see it: a finite, non-zero goodness gradient for each metric they allow."""
    metric = small_metric(name)
    if not metric.differentiable:
        pytest.skip(f"{name} is refused by the attacks (not differentiable)")
    x = torch.rand(2, 3, 96, 112, generator=torch.Generator().manual_seed(0))
    _, grad = score_and_grad(metric, x)
    check_gradient(metric, name, grad)
    assert (grad.flatten(1).abs().amax(1) > 0).all()


def test_metric_without_gradient_is_refused() -> None:
    _, grad = score_and_grad(Constant(), torch.rand(2, 3, 8, 8))
    with pytest.raises(AdvbenchError, match="zero input gradient"):
        check_gradient(Constant(), "constant", grad)
    with pytest.raises(AdvbenchError, match="non-finite"):
        check_gradient(Constant(), "constant", torch.full((1, 3), float("nan")))
