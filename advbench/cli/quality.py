"""`advbench uap train | eval | stability | ablation`: the UAP side of the tool.

`train`, `eval` and `stability` forward their arguments to Hydra apps (configs
`conf/uap_train.yaml`, `conf/uap_eval.yaml`, `conf/uap_stability.yaml`), so `-m` sweeps and
launcher plugins work; the tasks below are plain functions of the composed config.
`ablation` is a plain command that draws what a sweep of `train` wrote.

Outputs (relative to the working directory unless `out_dir` is absolute):

* train: `<out_dir>/<metric>/<data>-seed<S>-n<N>-ep<E>.{pt,png}` (the UAP; <data> is the image
  folder's name or `photos`) and `.parquet` (per-image gains on held-out images, the ablation records);
* eval: `<out_dir>/<metric>/table1_<uap>.{md,csv}` and `table1_<uap>.parquet` (per image);
* stability: RD records under `<out_dir>` (see `advbench.quality.rd`), drawn by `advbench plot`.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import click
import pandas as pd
import torch
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.table import Table

from advbench.cli.commands import HYDRA_ARGS, hydra_command, one_line_errors
from advbench.core.errors import AdvbenchError
from advbench.core.terminal import print_table


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
    hydra_command("uap_train", "advbench.cli.quality.train_main", "advbench uap train")(args)


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
    hydra_command("uap_eval", "advbench.cli.quality.eval_main", "advbench uap eval")(args)


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
    hydra_command("uap_stability", "advbench.cli.quality.stability_main", "advbench uap stability")(args)


@uap.command()
@click.argument("records", nargs=-1, type=click.Path(path_type=Path))
@click.option("--out", "out", type=click.Path(path_type=Path), default=Path("results/uap_ablation.png"),
              show_default=True, help="Figure file (PNG, SVG or PDF).")
@click.option("--amplitude", type=float, default=None, help="Amplitude to show (default: the largest recorded).")
def ablation(records: tuple[Path, ...], out: Path, amplitude: float | None) -> None:
    """Draw the spread of per-image gains across the runs of an ablation sweep of `uap train`."""
    from advbench.core.records import read_records
    from advbench.quality.uap import plot_ablation

    @one_line_errors
    def draw() -> Path:
        frame = read_records(records or (Path("advbench-out/uap"),), kinds=("uap_train",), skip=("uap_eval",))
        return plot_ablation(frame, out, amplitude)

    Console().print(f"wrote {draw()}")


@uap.command()
@click.argument("published", type=click.Path(path_type=Path))
@click.option("--out", "out_dir", type=click.Path(path_type=Path), default=Path("results/table2_published"),
              show_default=True, help="Folder for table2.md/.csv and one gain-vs-loss figure per source.")
@click.option("--srcc", type=click.Path(path_type=Path), default=None,
              help="CSV with a `metric` column and SRCC columns to add to the table.")
def table2(published: Path, out_dir: Path, srcc: Path | None) -> None:
    """Table 2 from the seed's published RD data (scores/, real_bitrates/, areas_under_rd_curves/).

    Computes the stability scores twice, from the stored per-video areas and from a clean
    recomputation of the raw scores and real bitrates; the `source` column says which is which.
    """
    from advbench.quality.report import (
        plot_gain_vs_loss,
        published_table2,
        write_table2,
    )
    from advbench.quality.stability import load_srcc

    @one_line_errors
    def make() -> list[Path]:
        table, curves = published_table2(published, load_srcc(srcc) if srcc else None)
        written = write_table2(table, out_dir)
        for source, part in curves.groupby("source"):
            written.append(plot_gain_vs_loss(part, out_dir / f"gain_vs_loss_{str(source).replace(' ', '_')}.png"))
        return written

    for path in make():
        Console().print(f"wrote {path}")


def metric_name(cfg: DictConfig) -> str:
    """The metric option the user chose (`metric=...`), outside Hydra the config's `name`."""
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized():
        return str(HydraConfig.get().runtime.choices["metric"])
    return str(cfg.metric.get("name", "metric"))


def trained_uap(out_dir: str | Path, name: str) -> Path:
    """The newest UAP `uap train` wrote for a metric, or a one-line error saying what to do."""
    folder = Path(out_dir).expanduser() / name
    found = sorted(folder.glob("*.pt"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise AdvbenchError(f"no trained UAP for '{name}' in '{folder}'; run `advbench uap train metric={name}` "
                            "or pass perturbation=PATH (.pt or .png)")
    return found[-1]


def _uap_path(cfg: DictConfig, name: str) -> Path:
    return Path(cfg.perturbation).expanduser() if cfg.perturbation else trained_uap(cfg.uap_dir, name)


def _build(cfg: DictConfig) -> tuple[str, Any, torch.device]:
    from advbench.quality.metrics.registry import build_metric
    from advbench.quality.uap import device_of

    return metric_name(cfg), build_metric(cfg.metric), device_of(cfg.device)


def _source(data: Any) -> str:
    return str(data) if data else "sample-photos"


def train_main(cfg: DictConfig) -> Path:
    """Train, save (.pt + .png), measure throughput, record held-out gains; returns the .pt path."""
    from advbench.core.records import write_part
    from advbench.quality.images import as_batch, uap_images
    from advbench.quality.uap import (
        evaluate_uap,
        metric_throughput,
        save_uap,
        signed_gain,
        train_uap,
    )

    name, metric, device = _build(cfg)
    hp = cfg.uap
    images = uap_images(cfg.data, split="train", size=hp.size, limit=cfg.subset)
    start = time.perf_counter()
    p = train_uap(metric, images, size=hp.size, clamp=hp.clamp, lr=hp.lr, epochs=hp.epochs,
                  batch_size=hp.batch_size, seed=cfg.seed, device=device, progress=cfg.progress)
    seconds = time.perf_counter() - start
    train_rate = hp.epochs * len(images) / seconds
    limit_rate = metric_throughput(metric, as_batch(images, hp.batch_size), device=device)
    data_tag = Path(str(cfg.data)).name if cfg.data else "photos"
    base = Path(cfg.out_dir).expanduser() / name / f"{data_tag}-seed{cfg.seed}-n{len(images)}-ep{hp.epochs}"
    meta = {"metric": name, "data": _source(cfg.data), "n_train": len(images), "seed": cfg.seed,
            **OmegaConf.to_container(hp, resolve=True), "train_seconds": seconds, "device": device.type}
    pt, png = save_uap(p, base, meta)

    val = as_batch(uap_images(cfg.validate.data, split="test", size=hp.size, limit=cfg.validate.n_images))
    clean, attacked, _ = evaluate_uap(metric, val, p, cfg.validate.amplitudes, batch_size=hp.batch_size, device=device)
    gains = signed_gain(metric, clean, attacked)
    amps = torch.tensor(list(cfg.validate.amplitudes), dtype=torch.float64)
    records = pd.DataFrame({
        "metric": name, "data": _source(cfg.data), "seed": cfg.seed, "n_train": len(images), "epochs": hp.epochs,
        "lr": hp.lr, "batch_size": hp.batch_size, "device": device.type,
        "amplitude": amps.repeat_interleave(len(val)).numpy(),
        "image": torch.arange(len(val)).repeat(len(amps)).numpy(),
        "score_clean": clean.repeat(len(amps)).numpy(), "score_attacked": attacked.flatten().numpy(),
        "gain": gains.flatten().numpy(), "train_seconds": seconds,
        "train_images_per_s": train_rate, "metric_images_per_s": limit_rate,
    })
    parquet = write_part(records, base.with_suffix(".parquet"))

    console = Console()
    console.print(f"trained UAP for [bold]{name}[/] on {len(images)} images ({_source(cfg.data)}), "
                  f"{hp.epochs} epochs, {seconds:.1f} s on {device.type}")
    console.print(f"throughput: UAP training {train_rate:.1f} images/s; metric forward+backward "
                  f"{limit_rate:.1f} images/s (batch {hp.batch_size})")
    summary = Table(title=f"held-out gain ({len(val)} images)")
    for a in amps.tolist():
        summary.add_column(f"a={a:g}", justify="right")
    summary.add_row(*(f"{g:.3f}" for g in gains.mean(1).tolist()))
    console.print(summary)
    for path in (pt, png, parquet):
        console.print(f"wrote {path}")
    return pt


def _seconds(seconds: float) -> str:
    """Attack time in one unit with three significant digits: '0.0373 s' next to '124 s'."""
    if seconds <= 0:
        return "0 s"
    decimals = max(0, 2 - math.floor(math.log10(seconds)))
    return f"{seconds:.{decimals}f} s"


def table1_display(table: pd.DataFrame, amplitude_columns: list[str]) -> pd.DataFrame:
    """Table 1 as printed: amplitude columns headed 'a = 0.02', gains with two decimals."""
    gains = {c: table[c].map("{:.2f}".format) for c in amplitude_columns}
    return table.assign(**gains).rename(columns={c: f"a = {c}" for c in amplitude_columns})


def table1_markdown(table: pd.DataFrame, caption: str) -> str:
    """The seed's Table 1 layout: one row per attack, amplitudes then time as columns."""
    cols = list(table.columns)
    lines = [caption, "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in table.itertuples(index=False):
        lines.append("| " + " | ".join(str(v) for v in row) + " |")
    return "\n".join(lines) + "\n"


def eval_main(cfg: DictConfig) -> pd.DataFrame:
    """Table 1: mean gain per amplitude for the UAP and MADC, with attack time on the device used."""
    from advbench.core.records import write_part
    from advbench.quality.images import as_batch, uap_images
    from advbench.quality.madc import madc_attack
    from advbench.quality.uap import check_amplitude, evaluate_uap, load_uap, score, signed_gain

    methods = [str(m).lower() for m in cfg.methods]
    unknown = sorted(set(methods) - {"uap", "madc"})
    if unknown or not methods:
        raise AdvbenchError(f"unknown method '{unknown[0] if unknown else ''}'; valid: madc, uap")
    amplitudes = [check_amplitude(a) for a in cfg.amplitudes]
    name, metric, device = _build(cfg)
    path = _uap_path(cfg, name)
    delta = load_uap(path)
    images = as_batch(uap_images(cfg.data, split="test", size=cfg.size, limit=cfg.n_images))
    clean, attacked_uap, uap_seconds = evaluate_uap(metric, images, delta, amplitudes, csf=cfg.csf,
                                                     batch_size=cfg.batch_size, device=device)
    attacked = {"UAP": (attacked_uap, uap_seconds)} if "uap" in methods else {}
    if "madc" in methods:
        runs = [madc_attack(metric, images, a, steps=cfg.madc.steps, lr=cfg.madc.lr, mse_power=cfg.madc.mse_power,
                            batch_size=cfg.batch_size, device=device, progress=cfg.progress) for a in amplitudes]
        scores = torch.stack([score(metric, adv, cfg.batch_size, device) for adv, _ in runs])
        attacked["MADC"] = (scores, sum(s for _, s in runs))

    time_col = f"{'GPU' if device.type == 'cuda' else 'CPU'} time"
    rows, records = [], []
    for method, (scores, seconds) in attacked.items():
        gains = signed_gain(metric, clean, scores)
        rows.append({"attack": method, **{f"{a:g}": round(float(g), 2) for a, g in zip(amplitudes, gains.mean(1))},
                     time_col: _seconds(seconds), "seconds": seconds})
        for i, a in enumerate(amplitudes):
            records.append(pd.DataFrame({"metric": name, "uap": str(path), "attack": method, "amplitude": a,
                                         "image": range(len(images)), "score_clean": clean.numpy(),
                                         "score_attacked": scores[i].numpy(), "gain": gains[i].numpy(),
                                         "device": device.type, "attack_seconds": seconds}))
    table = pd.DataFrame(rows)
    out = Path(cfg.out_dir).expanduser() / name
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"table1_{path.stem}"
    shown = table1_display(table.drop(columns="seconds"), [f"{a:g}" for a in amplitudes])
    flipped = "" if metric.higher_better else " (lower-better: sign flipped)"
    caption = (f"Table 1 · {name}: mean gain{flipped} at each amplitude a, {len(images)} images; UAP {path.name}; "
               f"MADC {cfg.madc.steps} steps, MSE <= a^{cfg.madc.mse_power:g}")
    stem.with_suffix(".md").write_text(table1_markdown(shown, caption), encoding="utf-8")
    table.to_csv(stem.with_suffix(".csv"), index=False)
    write_part(pd.concat(records, ignore_index=True), stem.with_suffix(".parquet"))

    console = _show_table1(shown, caption)
    if {"UAP", "MADC"} <= attacked.keys():
        uap_gain, madc_gain = (signed_gain(metric, clean, attacked[k][0]).mean() for k in ("UAP", "MADC"))
        share = float(uap_gain / madc_gain) if float(madc_gain) else float("nan")
        console.print(f"UAP reaches {100 * share:.0f}% of MADC's mean gain in "
                      f"{100 * uap_seconds / max(attacked['MADC'][1], 1e-12):.3f}% of its time")
    for suffix in (".md", ".csv", ".parquet"):
        console.print(f"wrote {stem.with_suffix(suffix)}")
    return table


def _show_table1(shown: pd.DataFrame, caption: str) -> Console:
    """Print Table 1 on the terminal; the console, for the lines that follow it."""
    rich_table = Table(title=caption)
    for col in shown.columns:
        rich_table.add_column(col, justify="left" if col == "attack" else "right")
    for row in shown.itertuples(index=False):
        rich_table.add_row(*map(str, row))
    console = Console()
    print_table(rich_table, console)
    return console


def _videos(cfg: DictConfig) -> list[Path]:
    """The videos to test: a folder's video files, one file, or synthetic clips when videos is null."""
    from advbench.quality.clips import MOTIONS, make_synthetic_videos

    if cfg.videos is None:
        s = cfg.synthetic
        return make_synthetic_videos(Path(cfg.out_dir).expanduser() / "videos", n=s.n, size=tuple(s.size),
                                     frames=s.frames, motions=tuple(s.get("motions", MOTIONS)))
    source = Path(cfg.videos).expanduser()
    if source.is_file():
        return [source]
    if not source.is_dir():
        raise AdvbenchError(f"videos '{source}' does not exist: expected a folder of videos or one video file")
    suffixes = {".y4m", ".yuv", ".mp4", ".mkv", ".avi", ".mov", ".webm"}
    found = sorted(p for p in source.iterdir() if p.suffix.lower() in suffixes)
    if not found:
        raise AdvbenchError(f"no videos in '{source}': expected files ending in {', '.join(sorted(suffixes))}")
    return found


def stability_main(cfg: DictConfig) -> Any:
    """Perturb, encode and score every video x amplitude x bitrate; RD records to parquet."""
    from advbench.quality.digests import tensor_digest
    from advbench.quality.rd import run_rd
    from advbench.quality.uap import apply_uap, check_amplitude, load_uap
    from advbench.quality.video import RawFormat

    amplitudes = [check_amplitude(a) for a in cfg.amplitudes]
    name, metric, device = _build(cfg)
    delta = load_uap(_uap_path(cfg, name)).to(device)
    raw = RawFormat(cfg.raw.width, cfg.raw.height, cfg.raw.pix_fmt, cfg.raw.fps) if cfg.raw.width else None
    videos = _videos(cfg)

    def perturb(frames: torch.Tensor, amplitude: float) -> torch.Tensor:
        return apply_uap(frames, delta, amplitude, csf=cfg.csf)

    perturbation_key = f"uap={tensor_digest(delta)} csf={bool(cfg.csf)}"
    result = run_rd(videos, metric, perturb, Path(cfg.out_dir).expanduser(), metric_name=name,
                    perturbation_key=perturbation_key, amplitudes=amplitudes,
                    bitrates_kbps=list(cfg.bitrates_kbps), preset=cfg.preset, psnr_kind=cfg.psnr, raw=raw,
                    max_frames=cfg.max_frames, batch_size=cfg.batch_size, device=device, force=cfg.force,
                    progress=cfg.progress)
    stale = f", {len(result.stale)} of them replacing points made with other settings" if result.stale else ""
    Console().print(f"{name}: {len(result.written)} RD points written{stale}, {len(result.skipped)} already there "
                    f"(run {result.run_id}); next: advbench plot {cfg.out_dir}")
    return result
