"""`advbench uap train | eval | stability | ablation`: the UAP side of the tool.

`train`, `eval` and `stability` forward their arguments to Hydra apps (configs
`conf/uap_train.yaml`, `conf/uap_eval.yaml`, `conf/uap_stability.yaml`), so `-m` sweeps and
launcher plugins work; their tasks (`advbench.cli.quality_tasks`) turn the composed config
into the quality half's plain job specs.
`ablation` is a plain command that draws what a sweep of `train` wrote.

Outputs (relative to the working directory unless `out_dir` is absolute):

* train: `<out_dir>/<metric>/<data>-seed<S>-n<N>-ep<E>.{pt,png}` (the UAP; <data> is the image
  folder's name or `photos`) and `.parquet` (per-image gains on held-out images, the ablation records);
* eval: `<out_dir>/<metric>/table1_<uap>.{md,csv}` and `table1_<uap>.parquet` (per image);
* stability: RD records under `<out_dir>` (see `advbench.quality.stability.rd`), drawn by `advbench plot`.
"""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console

from advbench.cli.commands import HYDRA_ARGS, hydra_command, one_line_errors


@click.group(name="uap", context_settings={"help_option_names": ["-h", "--help"]})
def uap() -> None:
    """Universal perturbations against no-reference quality metrics (the UAP seed paper).

    \b
    advbench uap train metric=niqe                     train a UAP (seed hyperparameters)
    advbench uap train metric=cnnqa data=~/coco/val    ... on your own images
    advbench uap train -m seed=0,1,2 subset=16,64      an ablation sweep
    advbench uap ablation advbench-out/uap/cnnqa       its figure
    advbench uap eval metric=niqe madc.steps=100       Table 1: UAP vs MADC gains and time
    advbench uap stability metric=cnnqa videos=DIR     RD records for the stability score
    """


@uap.command(context_settings=HYDRA_ARGS)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def train(args: tuple[str, ...]) -> None:
    """Train a 256x256 UAP that raises METRIC's scores (Adam lr 1e-3, 5 epochs, batch 8, |p| <= 0.1).

    ARGS are Hydra overrides: metric=NAME (see `advbench list metric`), data=FOLDER (any image
    folder; default: crops of the scikit-image sample photos), subset=N, seed=S, uap.epochs=E,
    uap=quick (1 epoch), device=cpu|cuda, out_dir=DIR. Writes the UAP as .pt and .png (seed
    convention) plus per-image gains on held-out images. Ablations are sweeps:
    `advbench uap train -m seed=0,1,2,3,4`, `-m subset=16,32,64`, `-m uap.epochs=1,3,5`;
    then `advbench uap ablation <out_dir>/<metric>`.
    """
    hydra_command("uap_train", "advbench.cli.quality_tasks.train_main", "advbench uap train")(args)


@uap.command(name="eval", context_settings=HYDRA_ARGS)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def eval_(args: tuple[str, ...]) -> None:
    """Table 1 of the seed: mean metric gain of the UAP and of a per-image MADC attack.

    Amplitudes 0.02 0.04 0.06 0.08 0.1 0.2 0.4 0.6 on held-out 256x256 images, plus the
    attack time on the device used. ARGS are Hydra overrides: metric=NAME,
    perturbation=PATH (.pt or .png; default: the newest UAP `uap train` wrote for the metric),
    data=FOLDER, n_images=N, madc.steps=1000, methods=[uap], csf=true, device=cpu|cuda.
    Writes Markdown, CSV and per-image parquet to <out_dir>/<metric>/.
    """
    hydra_command("uap_eval", "advbench.cli.quality_tasks.eval_main", "advbench uap eval")(args)


@uap.command(context_settings=HYDRA_ARGS)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def stability(args: tuple[str, ...]) -> None:
    """Apply a UAP to videos before H.264 and record RD points for the stability score.

    ARGS are Hydra overrides: metric=NAME, videos=DIR (or one file; default: 16 clips of 30
    frames at 256x384, a panning, zooming or shaking camera over each sample photo), perturbation=PATH, amplitudes=[...],
    bitrates_kbps=[200,1000,5000,12000], raw.width=/raw.height= for .yuv, csf=true,
    max_frames=N, psnr=rgb|luma, out_dir=DIR. Resumes: points finished with the same settings
    (UAP content, csf, metric, preset, max_frames, psnr, video bytes) are skipped unless
    force=true; points made with other settings are recomputed.
    Then `advbench plot <out_dir>` computes Table 2 and the gain-vs-loss figure.
    """
    hydra_command("uap_stability", "advbench.cli.quality_tasks.stability_main", "advbench uap stability")(args)


@uap.command()
@click.argument("records", nargs=-1, type=click.Path(path_type=Path))
@click.option("--out", "out", type=click.Path(path_type=Path), default=Path("advbench-out/plots/uap_ablation.png"),
              show_default=True, help="Figure file (PNG, SVG or PDF); under advbench-out/plots/ unless given, so a run "
              "from the clone never overwrites the committed results/.")
@click.option("--amplitude", type=float, default=None, help="Amplitude to show (default: the largest recorded).")
def ablation(records: tuple[Path, ...], out: Path, amplitude: float | None) -> None:
    """Draw the spread of per-image gains across the runs of an ablation sweep of `uap train`."""
    from advbench.core.records import read_records
    from advbench.quality.uap.ablation import plot_ablation

    @one_line_errors
    def draw() -> Path:
        frame = read_records(records or (Path("advbench-out/uap"),), kinds=("uap_train",), skip=("uap_eval",))
        return plot_ablation(frame, out, amplitude)

    Console().print(f"wrote {draw()}")


@uap.command()
@click.argument("published", type=click.Path(path_type=Path))
@click.option("--out", "out_dir", type=click.Path(path_type=Path), default=Path("advbench-out/plots/table2_published"),
              show_default=True, help="Folder for table2.md/.csv and one gain-vs-loss figure per source; under "
              "advbench-out/plots/ unless given (the committed results/table2_published/ is made with --out).")
@click.option("--srcc", type=click.Path(path_type=Path), default=None,
              help="CSV with a `metric` column and SRCC columns to add to the table.")
def table2(published: Path, out_dir: Path, srcc: Path | None) -> None:
    """Table 2 from the seed's published RD data (scores/, real_bitrates/, areas_under_rd_curves/).

    Computes the stability scores twice, from the stored per-video areas and from a clean
    recomputation of the raw scores and real bitrates; the `source` column says which is which.
    """
    from advbench.quality.stability.report import plot_gain_vs_loss, published_table2, write_table2
    from advbench.quality.stability.scores import load_srcc

    @one_line_errors
    def make() -> list[Path]:
        table, curves = published_table2(published, load_srcc(srcc) if srcc else None)
        written = write_table2(table, out_dir)
        for source, part in curves.groupby("source"):
            written.append(plot_gain_vs_loss(part, out_dir / f"gain_vs_loss_{str(source).replace(' ', '_')}.png"))
        return written

    for path in make():
        Console().print(f"wrote {path}")


@click.group(name="iqa", context_settings={"help_option_names": ["-h", "--help"]})
def iqa() -> None:
    """Per-image attacks on no-reference quality metrics, scored like the MSU robustness benchmark.

    \b
    advbench iqa run metric=niqe attack=korhonen        one cell: every budget of `eps`
    advbench iqa run -m metric=niqe,cnnqa attack=fgsm,ifgsm,madc judges=[niqe,cnnqa]
    advbench iqa run -m experiment=iqa_offline          the offline benchmark (1–8 min a cell on 2 cores)
    advbench plot advbench-out/iqa_offline/records      MSU scores, gain curves, ranking, transfer
    """


@iqa.command(name="run", context_settings=HYDRA_ARGS)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def iqa_run(args: tuple[str, ...]) -> None:
    """Attack METRIC with ATTACK at every budget of `eps`; per-image records to parquet.

    ARGS are Hydra overrides: metric=NAME (`advbench list metric`), attack=fgsm|ifgsm|mifgsm|amifgsm|
    korhonen|madc|uap|cumulative_uap|square, eps=[...] (ℓ∞ on [0, 1] images), attack.params.<key>=V (the
    attack's hyperparameters, e.g. attack.params.steps=20 or attack.params.n_queries=500), data=FOLDER
    (default: the sample photos' test crops), n_images=N, size=256, device=cpu|cuda, out_dir=DIR,
    judges=[niqe,cnnqa] (metrics that score every clean and attacked image: transfer between metrics),
    defense=jpeg|bit_depth|median|blur|resize|crop_flip (the metric behind a defense, attacked adaptively;
    defense.bpda=false or defense.eot=1 for the naive attack, defense.backward=identity for plain BPDA).
    A preset is a sweep and needs -m: `advbench iqa run -m experiment=iqa_offline` (or iqa_msu, iqa_defenses). Cells resume after
    a kill and are skipped when their records exist (force=true to redo). Then `advbench plot <out_dir>/records`.
    """
    hydra_command("iqa", "advbench.cli.quality_tasks.iqa_main", "advbench iqa run")(args)
