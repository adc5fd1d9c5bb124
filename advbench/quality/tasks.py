"""The Hydra tasks of `advbench uap train | eval | stability`: a composed config in, files and records out.

They live with the quality half, not the command line, so `advbench --help` imports neither torch
nor pandas; the click commands forward their arguments here through `cli.commands.hydra_command`.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.table import Table

from advbench.core.digests import tensor_digest
from advbench.core.errors import AdvbenchError
from advbench.core.paths import no_links
from advbench.core.records import write_part
from advbench.core.terminal import print_table
from advbench.quality.clips import MOTIONS, make_synthetic_videos
from advbench.quality.images import as_batch, uap_images
from advbench.quality.madc import madc_attack
from advbench.quality.metrics.registry import build_metric
from advbench.quality.rd import run_rd
from advbench.quality.uap import (
    apply_uap,
    check_amplitude,
    device_of,
    evaluate_uap,
    load_uap,
    metric_throughput,
    save_uap,
    score,
    signed_gain,
    train_uap,
)
from advbench.quality.video import RawFormat


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

    return metric_name(cfg), build_metric(cfg.metric), device_of(cfg.device)


def _source(data: Any) -> str:
    return str(data) if data else "sample-photos"


def train_main(cfg: DictConfig) -> Path:
    """Train, save (.pt + .png), measure throughput, record held-out gains; returns the .pt path."""

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

    if cfg.videos is None:
        s = cfg.synthetic
        out_dir = Path(cfg.out_dir).expanduser()
        return make_synthetic_videos(no_links(out_dir / "videos", out_dir), n=s.n, size=tuple(s.size),
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
