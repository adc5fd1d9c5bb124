"""Command-line entry point: `advbench run | train | plot | report | check | list | weights | uap | iqa`.

`run`, `train`, the `uap` jobs and `iqa run` hand their arguments to Hydra (sweeps with `-m`, launcher
plugins, `--cfg job`); `plot`, `check` and `list` are plain commands. Library errors become a single
`error: ...` line and exit status 1.
"""

from __future__ import annotations

import contextlib
import os
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

import click

from advbench.cli.commands import HYDRA_ARGS, hydra_command, one_line_errors
from advbench.cli.quality import iqa, uap
from advbench.core.errors import AdvbenchError, plain_warnings
from advbench.core.version import __version__

if TYPE_CHECKING:
    from advbench.cli.weights import Published

PLOTS = "advbench-out/plots"
REPORT = "advbench-out/report"
"""`advbench report`'s default folder, beside the plots."""
"""`advbench plot`'s default folder: next to the records `advbench run` writes, never committed."""
PIPE_WIDTH = 100
"""Columns a table gets when stdout is not a terminal and COLUMNS does not say otherwise."""


def _pipe_width() -> int | None:
    """The width for a table in a pipe or file (COLUMNS, else PIPE_WIDTH); None on a terminal."""
    from rich.console import Console

    if Console().is_terminal:
        return None
    columns = os.environ.get("COLUMNS", "")
    return int(columns) if columns.isdigit() and int(columns) > 0 else PIPE_WIDTH


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="advbench")
def main() -> None:
    """Measure how robust image models are, and how stable quality metrics are.

    \b
    advbench run attack=bim defense=trades            one benchmark cell
    advbench run -m attack=fgsm,bim defense=natural,pgd_at   a sweep
    advbench run -m experiment=benchmark              the default digits benchmark
    advbench plot advbench-out/records                curves and tables (advbench-out/plots)
    advbench report advbench-out/records              worst case, attack optimality, signs of failure
    advbench check advbench-out/records --min-accuracy 0.4   a CI gate
    advbench list attack                              what can be chosen
    advbench weights fetch nima                       a metric's published weights
    advbench iqa run -m experiment=iqa_offline        attacks on quality metrics
    """
    plain_warnings()


@main.command(context_settings=HYDRA_ARGS)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def run(args: tuple[str, ...]) -> None:
    """Run benchmark cells: attack x defense x threat model, records to parquet.

    \b
    Examples:
      advbench run attack=pgd defense=trades                       one cell on the digits set
      advbench run attack=pgd checkpoint=ckpt/trades.pt device=cuda   your own weights, on a GPU
      advbench run -m attack=fgsm,bim seed=0,1 out_dir=runs/a        a sweep: every combination
      advbench run attack=bim defense=trades label=mine            name the model in the records

    \b
    Everyday keys:
      checkpoint=PATH   a checkpoint file to attack (default: the cached one for dataset/model/defense)
      device=DEVICE     cpu (default), cuda, cuda:N or auto
      out_dir=DIR       where records go: DIR/records (default advbench-out)
      label=NAME        the model's name in the records (default: the defense)
      seed=N            the random seed (default 0)
      -m                a sweep: comma-separated values run every combination

    ARGS are Hydra overrides (group=option, key=value) and Hydra flags: -m/--multirun for
    sweeps (hydra/launcher=joblib runs them in parallel), --cfg job to print the config,
    --force (as force=true) to redo cells whose records exist. Groups: dataset, model,
    defense, attack, threat, experiment; see `advbench list`. gate.min_accuracy=0.4,
    gate.max_asr=0.1 and/or gate.min_certified=0.25 judge each cell after it runs (as
    `advbench check`): failing cells print one line each and the command exits 1 once every
    cell of the sweep has run.
    """
    args = tuple("force=true" if a == "--force" else a for a in args)
    hydra_command("config", "advbench.cli.spec_builder.run_main", "advbench run", around=_gate_verdicts,
                  before=_state_cost)(args)


def _state_cost(cfgs: list, overrides: list[str]) -> None:
    """A sweep's declared cost, printed before its jobs where its config says `state_cost: true`
    (`experiment=full_eval`); imported only then: it builds the attacks, which imports torch."""
    if any(bool(cfg.get("state_cost")) for cfg in cfgs):
        from advbench.cli.presets import state_cost

        state_cost(overrides)


def _gate_verdicts() -> contextlib.AbstractContextManager[None]:
    """`sweep_verdicts` around `advbench run`'s jobs, imported only once the arguments are checked:
    the gate imports pandas (0.4 s), and a wrong option name is answered before that (and torch)."""
    from advbench.robustness.report.gate import sweep_verdicts

    return sweep_verdicts()


@main.command(context_settings=HYDRA_ARGS)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def train(args: tuple[str, ...]) -> None:
    """Train a defense checkpoint (dataset=, model=, defense=) and save it with metadata.

    ARGS are Hydra overrides, e.g. `advbench train defense=pgd_at dataset=digits`.
    """
    hydra_command("train", "advbench.cli.spec_builder.train_main", "advbench train")(args)


@main.command()
@click.argument("records", nargs=-1, type=click.Path(path_type=Path))
@click.option("--out", "out_dir", type=click.Path(path_type=Path), default=Path(PLOTS), show_default=True,
              help="Folder for figures (PNG, SVG) and tables (Markdown, CSV); the default sits next to "
                   "advbench-out/records, outside the repository's committed results/.")
@click.option("--group-by", type=click.Choice(["defense", "category"]), default="defense", show_default=True,
              help="Colour benchmark curves per defense, or per defense category (the legend and the tables' "
                   "defense columns then list defenses by category).")
@click.option("--baseline", default=None, help="Corruption records: the model row whose errors scale the others' "
              "(corruption error ce and its mean mce, as Hendrycks & Dietterich's mCE against AlexNet).")
@one_line_errors
def plot(records: tuple[Path, ...], out_dir: Path, group_by: str, baseline: str | None) -> None:
    """Turn record files or folders into robustness curves, stability plots and tables.

    Records of `advbench iqa run` give the MSU score table, the metric ranking and gain curves,
    and with judges the transfer matrix between metrics.

    Score- and decision-based attacks get accuracy-vs-queries figures (log axis) beside the
    accuracy-vs-ε ones. Benchmark and corruption records may share the folders: each kind is drawn.
    """
    from rich.console import Console

    from advbench.cli.draw import render
    from advbench.core.paths import writable_folder
    from advbench.core.records import KINDS_BY_NAME, read_kinds

    found = read_kinds(records or (Path("advbench-out/records"),), kinds=("benchmark", "rd", "iqa", "corruption"),
                       together=("benchmark", "corruption"))
    writable_folder(out_dir, "--out")
    if baseline is not None and "corruption" not in found:
        raise AdvbenchError(f"--baseline applies to corruption records (advbench run threat=corruptions), not "
                            f"{KINDS_BY_NAME[next(iter(found))].label}")
    console, written = Console(), []
    for name, frame in found.items():
        written += render(name, frame, out_dir, group_by, baseline, console)
    for path in written:
        console.print(f"wrote {path}")


@main.command()
@click.argument("records", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--out", "out_dir", type=click.Path(path_type=Path), default=Path(REPORT), show_default=True,
              help="Folder for report.json (the evaluation card) and report.html (one self-contained page).")
@one_line_errors
def report(records: tuple[Path, ...], out_dir: Path) -> None:
    """Audit benchmark records: worst case per sample, attack optimality, signs of a failed evaluation.

    For every model row and threat in RECORDS (record files or folders): the best-known robust
    accuracy (the worst case over every attack, per sample), each attack's optimality against it
    and its cost, and the signs that the evaluation failed (a single-step or black-box attack
    beating the iterative white-box ones, accuracy not falling to 0 or rising with the budget,
    masked or random gradients, probabilities instead of logits, ...), each with its evidence,
    what to do and its source. Prints one verdict line per model row and threat: the number, and
    whether a sign says it may be too optimistic. Corruption records (threat=corruptions) among them
    add each row's mean accuracy over corruptions × severities beside its verdicts, with no verdict.
    Writes report.json and report.html; see docs/report.md.

    \b
    advbench report advbench-out/defenses/records --out advbench-out/report
    """
    import json

    from advbench.core.paths import writable_folder
    from advbench.core.records import read_kinds
    from advbench.robustness.audit import REPORT_JSON, write_report
    from advbench.robustness.audit.card import verdict_lines

    frames = read_kinds(records, kinds=("benchmark",), together=("benchmark", "corruption"))
    written = write_report(frames["benchmark"], writable_folder(out_dir, "--out"), records, frames.get("corruption"))
    card = json.loads(next(p for p in written if p.name == REPORT_JSON).read_text(encoding="utf-8"))
    for line in verdict_lines(card):
        click.echo(line)
    for path in written:
        click.echo(f"wrote {path}")


@main.command()
@click.argument("records", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--min-accuracy", type=float, default=None, metavar="FRACTION",
              help="Lowest robust accuracy at the budget an untargeted cell may have, e.g. 0.4.")
@click.option("--max-asr", type=float, default=None, metavar="FRACTION",
              help="Highest targeted attack success rate at the budget a targeted cell may have, e.g. 0.1.")
@click.option("--min-certified", type=float, default=None, metavar="FRACTION",
              help="Lowest certified accuracy (IBP, ℓ∞) at the budget a cell with a bound may have, e.g. 0.25.")
@one_line_errors
def check(records: tuple[Path, ...], min_accuracy: float | None, max_asr: float | None,
          min_certified: float | None) -> None:
    """Gate CI on benchmark records: exit 1 with one line per cell below the threshold.

    RECORDS are record files or folders (`advbench run` writes them under
    advbench-out/records). Untargeted cells are judged by accuracy at the budget, targeted
    cells by targeted ASR, cells with an interval bound also by certified accuracy; a cell with
    no threshold it can be judged by is not judged. All cells passing prints one summary line
    and exits 0. See docs/ci.md.

    \b
    advbench check advbench-out/smoke/records --min-accuracy 0.4
    """
    from advbench.robustness.report.gate import check_records
    from advbench.robustness.specs import Thresholds, check_fraction

    check_fraction("--min-accuracy", min_accuracy)
    check_fraction("--max-asr", max_asr)
    check_fraction("--min-certified", min_certified)
    if min_accuracy is None and max_asr is None and min_certified is None:
        raise AdvbenchError("give a threshold: --min-accuracy (untargeted cells), --max-asr (targeted cells) "
                            "and/or --min-certified (cells with a certified bound)")
    limits = Thresholds(min_accuracy, max_asr, min_certified)
    verdict = check_records(records, limits)
    for line in verdict.failures:
        click.echo(line, err=True)
    if not verdict.passed:
        n = len(verdict.failures)
        raise click.ClickException(f"gate failed: {n} of {verdict.judged} cell{'s' if verdict.judged != 1 else ''} "
                                   f"below the threshold")
    click.echo(verdict.summary(limits))


@main.command(name="list")
@click.argument("group", required=False)
@click.option("--full", is_flag=True, help="Every description whole, in a pipe or file too (lines as long as they need).")
@one_line_errors
def list_options(group: str | None, full: bool) -> None:
    """List config groups, or the options of GROUP with their descriptions.

    In a pipe or file the table fits 100 columns (COLUMNS=N to change it), one option per line
    with its description cut to fit (so `grep` finds an option with its description); --full
    prints every description whole.
    """
    from rich.console import Console
    from rich.table import Table

    from advbench.core.catalog import describe, group_options, groups, hidden_user_options
    from advbench.core.terminal import print_table

    hidden = {(g, path.stem): path for g, path in hidden_user_options()}

    def described(g: str, option: str) -> str:  # led by the user's file of that name the shipped option hides
        return (f"(shipped; ignores {hidden[g, option]}) " if (g, option) in hidden else "") + describe(g, option)

    names = groups()
    if group is not None and group not in names:
        raise AdvbenchError(f"unknown group '{group}'; valid: {', '.join(names)}")
    width = None if full else _pipe_width()
    table = Table(show_header=True, header_style="bold")
    rows = [(g, option, described(g, option)) for g in ([group] if group else names) for option in group_options(g)]
    table.add_column("group")
    table.add_column("option")
    table.add_column("description", no_wrap=width is not None, overflow="ellipsis")
    room = (width or 0) - max(len("group"), *(len(r[0]) for r in rows)) \
        - max(len("option"), *(len(r[1]) for r in rows)) - 10  # borders, padding
    for g, option, text in rows:
        table.add_row(g, option, textwrap.shorten(text, max(room, 20), placeholder=" …") if width else text)
    if width is None:
        print_table(table)
        return
    Console(width=width).print(table)
    click.echo(f"whole descriptions: advbench list {group or 'GROUP'} --full")


@main.group()
def weights() -> None:
    """Published weights of the quality metrics and ImageNet models: list them, fetch them."""


@weights.command(name="list")
@one_line_errors
def weights_list() -> None:
    """Each file's name, where the config expects it, its published source, whether it is there and how it was checked.

    "checked" says what `advbench weights fetch` verified of the file now present (a published
    SHA-256, or only that every key and shape fits the architecture); "not checked" marks a file
    put there by hand or changed since it was fetched.
    """
    from rich.console import Console
    from rich.table import Table

    from advbench.cli.weights import CHECKED_NOTE, rows
    from advbench.core.terminal import print_table

    table = Table(show_header=True, header_style="bold")
    for column in ("name", "present", "checked", "size", "file", "source"):
        table.add_column(column, overflow="fold")
    listed = list(rows())
    for entry, target, present, checked in listed:
        how = entry.url if entry.direct else f"{entry.url} (web page: download by hand)"
        table.add_row(entry.name, "yes" if present else "no", checked, _file_size(entry, target, present),
                      str(target), f"{entry.source}\n{how}")
    width = _pipe_width()
    if width is None:
        print_table(table)
        Console().print(CHECKED_NOTE, highlight=False, markup=False)
        return
    for entry, target, present, checked in listed:  # a pipe or file: one short block per file
        how = entry.url if entry.direct else f"{entry.url} (web page: download by hand)"
        click.echo(f"{entry.name}  present: {'yes' if present else 'no'}  checked: {checked}  "
                   f"size: {_file_size(entry, target, present)}")
        click.echo(f"  file:   {target}\n  source: {entry.source}\n          {how}")
    click.echo(textwrap.fill(CHECKED_NOTE, width))


def _file_size(entry: Published, target: Path, present: bool) -> str:
    """The file's size (the published one where it is absent; '?' where none is known), in kB below
    1 MB: NIQE's 12 kB parameter file would read '0.0 MB', as if it were empty."""
    size = target.stat().st_size / 1e6 if present else entry.size_mb
    if size is None:
        return "?"
    return f"{size * 1e3:.1f} kB" if size < 1 else f"{size:.1f} MB"


@weights.command(name="fetch")
@click.argument("names", nargs=-1, required=True)
@click.option("--mirror", metavar="URL", default=None,
              help="Fetch each file by its published name from this server instead (an internal mirror).")
@click.option("--force", is_flag=True, help="Download again even when the file is present.")
@click.option("--dataset", default="cifar10", show_default=True, help="robustbench:<name>: RobustBench's data set.")
@click.option("--threat", default="Linf", show_default=True, help="robustbench:<name>: Linf, L2 or corruptions.")
@one_line_errors
def weights_fetch(names: tuple[str, ...], mirror: str | None, force: bool, dataset: str, threat: str) -> None:
    """Download NAMES into the weights folder, resuming partial files, and check each loads.

    A file is checked by loading it into its architecture with every key and shape matching
    (and torchvision's SHA-256 prefix); only then does it take its final name. An interrupted
    download resumes when the command runs again. See `advbench weights list` for NAMES;
    robustbench:<name> fetches a RobustBench zoo model with RobustBench's downloader (for
    model=robustbench model.name=<name>).
    """
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TransferSpeedColumn,
    )

    from advbench.cli.weights import ROBUSTBENCH, fetch, fetch_robustbench, lookup

    for spec in (n for n in names if n.startswith(ROBUSTBENCH)):
        files = fetch_robustbench(spec, dataset, threat, force)
        click.echo(f"{spec}: {', '.join(map(str, files))} (use it with model=robustbench model.name={spec[len(ROBUSTBENCH):]})")
    console = Console(stderr=True)
    for entry in lookup(tuple(n for n in names if not n.startswith(ROBUSTBENCH))):
        columns = (TextColumn(entry.name), BarColumn(), DownloadColumn(), TransferSpeedColumn())
        with Progress(*columns, console=console, transient=True) as bar:
            task = bar.add_task(entry.name, total=None)
            path = fetch(entry, mirror, force, lambda done, total: bar.update(task, completed=done, total=total))
        use = f" (use it with model={entry.model} model.weights_path={path})" if entry.model else ""
        click.echo(f"{entry.name}: {path}{use}")


main.add_command(uap)
main.add_command(iqa)
