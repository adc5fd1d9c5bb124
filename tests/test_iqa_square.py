"""The score-based attack on metrics (`square`): budget, box, counted queries, traces, direction, and a
metric without a gradient, which the gradient attacks refuse and `square` climbs."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import torch

from advbench.core.errors import AdvbenchError
from advbench.quality.attacks.iterative import MetricFGSM
from advbench.quality.attacks.square import MetricSquare
from advbench.quality.iqa.run import IqaSpec, MetricAttackSpec, iqa_cell
from advbench.quality.metrics.metric_contract import QualityMetric

EPS = torch.tensor([2 / 255, 8 / 255])


class Rounded(QualityMetric):
    """Sharpness of the image quantised to quarter levels: torch.round and an argmax inside, no useful
    gradient (zero almost everywhere). Lower-better when `flip`: 1 − sharpness."""

    differentiable = False

    def __init__(self, flip: bool = False) -> None:
        super().__init__()
        self.flip, self.higher_better = flip, not flip
        self.calls, self.rows = 0, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls, self.rows = self.calls + 1, self.rows + len(x)
        q = torch.round(x * 4) / 4
        brightest = q.mean(dim=(2, 3)).argmax(dim=1)                      # (N,) the brightest channel
        channel = q.gather(1, brightest.view(-1, 1, 1, 1).expand(-1, 1, *q.shape[2:]))
        sharp = (channel[..., 1:] - channel[..., :-1]).abs().mean(dim=(1, 2, 3))
        return 1 - sharp if self.flip else sharp


def images(n: int = 3, size: int = 16) -> torch.Tensor:
    return torch.rand(n, 3, size, size, generator=torch.Generator().manual_seed(1))


def attack_rows(n: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    x = images(n)
    return x.repeat_interleave(len(EPS), 0), EPS.repeat(n)


def test_zero_gradient_metric_stops_gradient_attacks() -> None:
    x = images(1).requires_grad_(True)
    Rounded()(x).sum().backward()
    assert x.grad is not None and not x.grad.abs().amax() > 0  # what makes the gradient attacks useless here


@pytest.mark.parametrize("flip", [False, True], ids=["higher-better", "lower-better"])
def test_square_contract(flip: bool) -> None:
    metric, (x, eps) = Rounded(flip), attack_rows()
    result = MetricSquare(n_queries=60).run(metric, x, eps)
    delta = (result.x_adv - x).flatten(1).abs().amax(1)
    assert (delta <= eps + 1e-6).all(), "left the ε-ball"
    assert result.x_adv.min() >= 0 and result.x_adv.max() <= 1
    assert metric.calls == 60 and metric.rows == 60 * len(x), "a forward the attack did not make or count"
    assert result.queries.tolist() == [60] * len(x)
    assert result.trace.shape == (len(x), 60)
    with torch.no_grad():
        clean, again = metric(x), metric(result.x_adv)
    torch.testing.assert_close(result.trace[:, 0], clean)
    torch.testing.assert_close(result.trace[:, -1], again)
    sign = -1 if flip else 1
    steps = sign * result.trace.diff(dim=1)
    assert (steps >= 0).all(), "the best score moved towards the metric's worse end"
    gain = sign * (again - clean)
    assert (gain[eps == EPS.max()] > 0).all(), "an image's verdict was not raised at the largest budget"


def test_rows_do_not_depend_on_their_batch() -> None:
    x, eps = attack_rows()
    attack = MetricSquare(n_queries=30, seed=3)
    together = attack.run(Rounded(), x, eps)
    alone = attack.run(Rounded(), x[3:5], eps[3:5])
    assert torch.equal(together.x_adv[3:5], alone.x_adv)
    other_seed = MetricSquare(n_queries=30, seed=4).run(Rounded(), x[3:5], eps[3:5])
    assert not torch.equal(other_seed.x_adv, alone.x_adv)


@pytest.mark.parametrize("bad", [{"n_queries": 0}, {"n_queries": 2.5}, {"p_init": 0}, {"p_init": 1.5},
                                 {"seed": "a"}])
def test_bad_hyperparameters_are_one_line(bad: dict) -> None:
    with pytest.raises(AdvbenchError, match=next(iter(bad))):
        MetricSquare(**bad)


def spec(tmp_path: Path, folder: Path, attack: MetricAttackSpec) -> IqaSpec:
    return IqaSpec(metric="rounded", attack=attack, eps=[2 / 255, 8 / 255], data=str(folder),
                   n_images=2, size=16, seed=0, device="cpu", batch_size=4, chunk_size=64, force=False,
                   run_id="t", progress=False, records_dir=str(tmp_path / "records"))


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    from PIL import Image

    out = tmp_path / "images"
    out.mkdir()
    for i, img in enumerate(images(2, 16)):
        Image.fromarray((img.permute(1, 2, 0).numpy() * 255).astype("uint8")).save(out / f"{i}.png")
    return out


def test_cell_records_queries_and_plots_them(tmp_path: Path, folder: Path, capsys: pytest.CaptureFixture) -> None:
    from advbench.quality.iqa.iqa_report import render_iqa

    part = iqa_cell(spec(tmp_path, folder, MetricAttackSpec(MetricSquare(n_queries=25), ("n_queries",))), Rounded())
    frame = pd.read_parquet(part)
    assert frame["queries"].tolist() == [25] * 4 and frame["iterations"].tolist() == [25] * 4
    gain = frame["score_attacked"] - frame["score_clean"]
    assert (gain >= 0).all() and (gain > 0).any()
    assert "ε=8/255" in capsys.readouterr().out
    written = render_iqa(frame, tmp_path / "plots")
    assert tmp_path / "plots" / "gain_vs_queries.png" in written


def test_gradient_attack_on_such_a_metric_is_one_line(tmp_path: Path, folder: Path) -> None:
    with pytest.raises(AdvbenchError, match="not differentiable.*attack=square"):
        iqa_cell(spec(tmp_path, folder, MetricAttackSpec(MetricFGSM())), Rounded())
