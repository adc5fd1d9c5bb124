"""What a first `advbench iqa run` met: the help's override syntax, presets without -m, no news while a
cell runs, a console gain that was not the documented one, a partial sweep ranked as if whole, figures
with one labelled panel, and a UAP bar that opened on `loss nan`."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from rich.console import Console
from rich.progress import Progress
from test_cli import assert_one_line_error, run_cli

from advbench.cli.config import compose_config
from advbench.cli.quality import iqa
from advbench.quality.iqa.iqa_report import _figures, missing_cells, ranking, render_iqa
from advbench.quality.iqa.msu_scores import msu_scores
from advbench.quality.iqa.progress import CellProgress
from advbench.quality.iqa.run import budget_label, summarize
from advbench.quality.uap.training import loss_field, progress_columns


def test_help_teaches_overrides_that_compose() -> None:
    text = " ".join(CliRunner().invoke(iqa, ["run", "--help"]).output.split())
    assert "attacks.<attack>" not in text and "attack.params.<key>=V" in text
    assert "needs -m: `advbench iqa run -m experiment=iqa_offline`" in text
    assert compose_config("iqa", ["attack=ifgsm", "attack.params.steps=3"]).attack.params.steps == 3
    assert compose_config("iqa", ["attack=square", "attack.params.n_queries=500"]).attack.params.n_queries == 500


def test_sweep_preset_without_m_is_one_line(tmp_path: Path) -> None:
    proc = run_cli("iqa", "run", "experiment=iqa_offline", cwd=tmp_path)
    assert_one_line_error(proc, "needs -m", "advbench iqa run -m experiment=iqa_offline")
    assert not (tmp_path / "advbench-out").exists()


def test_cell_progress_logs_rows_and_elapsed_off_a_terminal() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=200)
    with CellProgress("niqe/fgsm (2 images × 2 budgets)", 4, console, every=3600) as progress:
        for _ in range(4):
            progress.advance(1)
    lines = out.getvalue().splitlines()
    assert lines == ["niqe/fgsm (2 images × 2 budgets): 1/4 rows, 0s elapsed",
                     "niqe/fgsm (2 images × 2 budgets): 4/4 rows, 0s elapsed"]  # the first, then the last
    quiet = io.StringIO()
    with CellProgress("x", 2, Console(file=quiet, force_terminal=False), enabled=False) as progress:
        progress.advance(2)
    assert quiet.getvalue() == ""


def records(cells: dict[tuple[str, str], tuple[list[float], list[float]]], *, higher_better: bool = True,
            eps: float = 8 / 255, trace: int = 3) -> pd.DataFrame:
    """iqa records of (metric, attack) -> (clean scores, attacked scores), one row per image."""
    frames = []
    for (metric, attack), (clean, attacked) in cells.items():
        n = len(clean)
        frames.append(pd.DataFrame({
            "metric": metric, "attack": attack, "eps": eps, "cell_key": f"{metric}-{attack}",
            "image_id": range(n), "score_clean": clean, "score_attacked": attacked, "higher_better": higher_better,
            "psnr": 40.0, "ssim": 0.99,
            "score_trace": [np.linspace(c, a, trace) for c, a in zip(clean, attacked)]}))
    return pd.concat(frames, ignore_index=True)


@pytest.mark.parametrize("higher_better", [True, False])
def test_console_prints_the_documented_gain_and_budgets_in_levels(higher_better: bool,
                                                                  capsys: pytest.CaptureFixture) -> None:
    sign = 1 if higher_better else -1
    frame = records({("m", "fgsm"): ([0.0, 10.0 * sign], [5.0 * sign, 15.0 * sign])}, higher_better=higher_better)
    summarize(frame, "m/fgsm", Path("part.parquet"))
    out = capsys.readouterr().out
    # raw mean change 5; the documented gain scales by the clean scores' range (10): +0.5
    assert msu_scores(frame)["abs_gain"].iloc[0] == pytest.approx(0.5, rel=1e-9)
    assert "mean gain ε=8/255: +5 (+0.5 scaled, 40.0 dB); scaled: ÷ 10, the range of the cell's 2 clean scores" in out
    assert budget_label(0.01) == "2.55/255" and budget_label(1 / 255) == "1/255"


def partial() -> pd.DataFrame:
    return records({("cnnqa", "fgsm"): ([0.0, 1.0], [0.5, 1.2]), ("niqe", "fgsm"): ([0.0, 1.0], [0.1, 1.0]),
                    ("niqe", "madc"): ([0.0, 1.0], [0.9, 1.9])})


def test_partial_sweep_names_missing_cells_and_ranks_on_shared_attacks(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture) -> None:
    frame = partial()
    assert missing_cells(frame) == [("cnnqa", "madc")]
    top = ranking(msu_scores(frame))
    assert list(top.columns) == ["metric", "worst", "mean", "fgsm"]
    render_iqa(frame, tmp_path)
    err = " ".join(capsys.readouterr().err.split())
    assert "1 (metric, attack) cells have no records: cnnqa/madc" in err
    assert "over fgsm," in (tmp_path / "ranking.md").read_text()


def test_no_shared_attack_refuses_the_ranking(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    frame = records({("cnnqa", "fgsm"): ([0.0, 1.0], [0.5, 1.2]), ("niqe", "madc"): ([0.0, 1.0], [0.9, 1.9])})
    assert ranking(msu_scores(frame)).empty
    render_iqa(frame, tmp_path)
    assert "no ranking: no attack was run on every metric" in capsys.readouterr().err
    assert not (tmp_path / "ranking.md").exists() and (tmp_path / "msu_scores.md").exists()


def test_every_panel_is_titled_labelled_and_in_the_legend() -> None:
    one_step = records({("cnnqa", "fgsm"): ([0.0, 1.0], [0.5, 1.2])}, trace=1)  # FGSM's one iteration
    frame = pd.concat([one_step, partial().query("attack != 'fgsm' or metric != 'cnnqa'"),
                       records({("niqe", "fgsm"): ([0.0, 1.0], [-20.0, -30.0])}, eps=4 / 255).assign(cell_key="niqe-fgsm")],
                      ignore_index=True)
    figures = _figures(frame, msu_scores(frame), 8 / 255)
    for stem, fig in figures.items():
        axes = fig.axes
        assert [ax.get_title() for ax in axes] == ["cnnqa", "niqe"], stem
        assert all(ax.get_ylabel() for ax in axes), stem
        for ax in axes:
            assert ("symlog" in ax.get_ylabel()) == (ax.get_yscale() == "symlog"), stem
        assert sorted(t.get_text() for t in fig.legends[0].get_texts()) == ["fgsm", "madc"], stem
    assert any(ax.get_yscale() == "symlog" for ax in figures["gain_vs_eps"].axes)
    iterations = figures["gain_vs_iterations"]
    iterations.canvas.draw()
    for ax in iterations.axes:
        ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
        assert ticks and all(float(t).is_integer() for t in ticks)
    assert "gain_vs_queries" not in figures  # no score-based attack among these records


def test_uap_bar_shows_no_loss_before_the_first_step() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120)
    with Progress(*progress_columns(), console=console, auto_refresh=False) as bar:
        task = bar.add_task("uap", total=4, epoch=1, loss=loss_field(None))
        bar.refresh()
        first = out.getvalue()
        bar.update(task, advance=1, loss=loss_field(0.25))
        bar.refresh()
    assert "nan" not in first and "loss" not in first and "UAP epoch 1" in first
    assert "loss 0.2500" in out.getvalue()


def test_cnnqa_weights_do_not_depend_on_the_thread_count() -> None:
    """The cached CNNQA is trained on first use; on one or two threads the same seed gives the same weights."""
    import torch

    from advbench.quality.metrics.learned import train_cnnqa

    before = torch.get_num_threads()
    nets = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        nets.append(train_cnnqa(steps=3, progress=False).state_dict())
        assert torch.get_num_threads() == threads  # restored after training
    torch.set_num_threads(before)
    assert all(torch.equal(nets[0][k], nets[1][k]) for k in nets[0])
