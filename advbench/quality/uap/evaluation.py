"""Evaluating a UAP: scores at each amplitude, and the seed's Table 1 (`advbench uap eval`).

Table 1 sets the UAP against a per-image attack, MADC (`advbench.quality.attacks.madc`): the
mean gain of each at every amplitude on held-out images, and the time each attack took on the
device used.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import pandas as pd
import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from advbench.core.errors import AdvbenchError
from advbench.core.records import write_part
from advbench.core.terminal import print_table
from advbench.quality.attacks.madc import MADC
from advbench.quality.images import as_batch, uap_images
from advbench.quality.iqa.guard import user_metric_failures
from advbench.quality.metrics.metric_contract import QualityMetric
from advbench.quality.metrics.scoring import device_of, score, signed_gain, sync_device
from advbench.quality.uap.perturbation import apply_uap, check_amplitude, load_uap, uap_file


def evaluate_uap(metric: QualityMetric, images: torch.Tensor, uap: torch.Tensor, amplitudes: Sequence[float], *,
                 csf: bool = False, batch_size: int = 8,
                 device: str | torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Clean scores (N,), attacked scores (A, N) and the seconds spent applying the UAP (not scoring)."""
    dev = device_of(device)
    levels = [check_amplitude(a) for a in amplitudes]
    clean = score(metric, images, batch_size, dev)
    attacked, seconds = [], 0.0
    for a in levels:
        outs = []
        for batch in images.split(batch_size):
            batch = batch.to(dev)
            sync_device(dev)
            start = time.perf_counter()
            adv = apply_uap(batch, uap, a, csf)
            sync_device(dev)
            seconds += time.perf_counter() - start
            outs.append(score(metric, adv, batch_size, dev))
        attacked.append(torch.cat(outs))
    return clean, torch.stack(attacked), seconds


def madc_attack(metric: QualityMetric, images: torch.Tensor, amplitude: float, *, steps: int = 1000,
                lr: float = 0.05, mse_power: float = 1.0, batch_size: int = 8,
                device: str | torch.device | None = None, progress: bool = True) -> tuple[torch.Tensor, float]:
    """Table 1's MADC: attacked copies of (N, 3, H, W) images (on CPU) within MSE <= amplitude ** mse_power,
    `steps` gradient evaluations each (the start's and `steps - 1` candidates), and the seconds it took."""
    a = check_amplitude(amplitude)
    attack = MADC(steps=steps, lr=lr, mse_power=mse_power, linf=False)
    dev = device_of(device)
    metric = metric.to(dev).eval()
    out, seconds = [], 0.0
    columns = (TextColumn(f"MADC a={a:g}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with Progress(*columns, disable=not progress) as bar:
        task = bar.add_task("madc", total=len(images))
        for batch in images.split(batch_size):
            batch = batch.to(dev)
            sync_device(dev)
            start = time.perf_counter()
            adv, _ = attack.ascend(metric, batch, torch.full((len(batch),), a, dtype=torch.float64), steps - 1)
            sync_device(dev)
            seconds += time.perf_counter() - start
            out.append(adv.cpu())
            bar.advance(task, len(batch))
    return torch.cat(out), seconds


@dataclass(frozen=True)
class MadcSettings:
    """Table 1's MADC (`madc:`): gradient evaluations per image, the first step as a fraction of the MSE ball's
    radius, and the ball MSE <= amplitude ** mse_power."""

    steps: int
    lr: float
    mse_power: float


@dataclass(frozen=True)
class Table1Spec:
    """What `advbench uap eval` runs: the plain values of its config (`conf/uap_eval.yaml`)."""

    metric: str                   # the metric option's name: folder and records
    perturbation: str | None      # a UAP file; None: the newest `uap train` wrote under uap_dir
    uap_dir: str
    data: str | None
    n_images: int | None
    size: int
    amplitudes: Sequence[float]
    methods: Sequence[str]
    csf: bool
    madc: MadcSettings
    batch_size: int
    device: str
    out_dir: str
    progress: bool

    def __post_init__(self) -> None:
        """Methods and amplitudes checked, and normalised, before any metric is built."""
        methods = tuple(str(m).lower() for m in self.methods)
        unknown = sorted(set(methods) - {"uap", "madc"})
        if unknown or not methods:
            raise AdvbenchError(f"unknown method '{unknown[0] if unknown else ''}'; valid: madc, uap")
        object.__setattr__(self, "methods", methods)
        object.__setattr__(self, "amplitudes", tuple(check_amplitude(a) for a in self.amplitudes))


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


def table1_job(spec: Table1Spec, metric: QualityMetric) -> pd.DataFrame:
    """Table 1: mean gain per amplitude for the UAP and MADC, with attack time on the device used."""
    methods, amplitudes = spec.methods, list(spec.amplitudes)
    name, device, madc = spec.metric, device_of(spec.device), spec.madc
    path = uap_file(spec.perturbation, spec.uap_dir, name)
    delta = load_uap(path)
    images = as_batch(uap_images(spec.data, split="test", size=spec.size, limit=spec.n_images))
    with user_metric_failures(metric, name, f"scoring {len(images)} images with and without UAP {path.name}"):
        clean, attacked_uap, uap_seconds = evaluate_uap(metric, images, delta, amplitudes, csf=spec.csf,
                                                         batch_size=spec.batch_size, device=device)
    attacked = {"UAP": (attacked_uap, uap_seconds)} if "uap" in methods else {}
    if "madc" in methods:
        with user_metric_failures(metric, name, f"attacking {len(images)} images with MADC"):
            runs = [madc_attack(metric, images, a, steps=madc.steps, lr=madc.lr, mse_power=madc.mse_power,
                                batch_size=spec.batch_size, device=device, progress=spec.progress) for a in amplitudes]
            scores = torch.stack([score(metric, adv, spec.batch_size, device) for adv, _ in runs])
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
    out = Path(spec.out_dir).expanduser() / name
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"table1_{path.stem}"
    shown = table1_display(table.drop(columns="seconds"), [f"{a:g}" for a in amplitudes])
    flipped = "" if metric.higher_better else " (lower-better: sign flipped)"
    caption = (f"Table 1 · {name}: mean gain{flipped} at each amplitude a, {len(images)} images; UAP {path.name}; "
               f"MADC {madc.steps} steps, MSE <= a^{madc.mse_power:g}")
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
