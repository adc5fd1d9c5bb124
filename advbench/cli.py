"""Command-line entry point: `advbench run | train | plot | list | uap`.

`run`, `train` and the `uap` jobs hand their arguments to Hydra (sweeps with `-m`, launcher
plugins, `--cfg job`); `plot` and `list` are plain commands. Library errors become a single
`error: ...` line and exit status 1.
"""

from __future__ import annotations

from pathlib import Path

import click

from advbench import __version__
from advbench.commands import HYDRA_ARGS, hydra_command, one_line_errors
from advbench.errors import AdvbenchError
from advbench.iqa.cli import uap

@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="advbench")
def main() -> None:
    """Measure how robust image models are, and how stable quality metrics are.

    \b
    advbench run attack=bim defense=trades            one benchmark cell
    advbench run -m attack=fgsm,bim defense=natural,pgd_at   a sweep
    advbench run -m experiment=benchmark              the default digits benchmark
    advbench plot advbench-out/records --out results  curves and tables
    advbench list attack                              what can be chosen
    """


@main.command(context_settings=HYDRA_ARGS)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def run(args: tuple[str, ...]) -> None:
    """Run benchmark cells: attack x defense x threat model, records to parquet.

    ARGS are Hydra overrides (group=option, key=value) and Hydra flags: -m/--multirun for
    sweeps (hydra/launcher=joblib runs them in parallel), --cfg job to print the config,
    --force (as force=true) to redo cells whose records exist. Groups: dataset, model,
    defense, attack, threat, experiment; see `advbench list`.
    """
    args = tuple("force=true" if a == "--force" else a for a in args)
    hydra_command("config", "advbench.engine.run_main", "advbench run")(args)


@main.command(context_settings=HYDRA_ARGS)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def train(args: tuple[str, ...]) -> None:
    """Train a defense checkpoint (dataset=, model=, defense=) and save it with metadata.

    ARGS are Hydra overrides, e.g. `advbench train defense=pgd_at dataset=digits`.
    """
    hydra_command("train", "advbench.defenses.training.train_main", "advbench train")(args)


@main.command()
@click.argument("records", nargs=-1, type=click.Path(path_type=Path))
@click.option("--out", "out_dir", type=click.Path(path_type=Path), default=Path("results"), show_default=True,
              help="Folder for figures (PNG, SVG) and tables (Markdown, CSV).")
@one_line_errors
def plot(records: tuple[Path, ...], out_dir: Path) -> None:
    """Turn record files or folders into robustness curves, stability plots and tables."""
    from rich.console import Console

    from advbench.records import read_kind

    kind, frame = read_kind(records or (Path("advbench-out/records"),), kinds=("benchmark", "rd"))
    console = Console()
    if kind.name == "rd":
        from advbench.iqa.report import render_stability

        written = render_stability(frame, out_dir)
    else:
        from advbench.curves import summary_table
        from advbench.plot import print_tables, render_all

        written = render_all(frame, out_dir)
        print_tables(summary_table(frame), console)
    for path in written:
        console.print(f"wrote {path}")


@main.command(name="list")
@click.argument("group", required=False)
@one_line_errors
def list_options(group: str | None) -> None:
    """List config groups, or the options of GROUP with one-line descriptions."""
    from rich.table import Table

    from advbench.config import describe, group_options, groups
    from advbench.terminal import print_table

    names = groups()
    if group is not None and group not in names:
        raise AdvbenchError(f"unknown group '{group}'; valid: {', '.join(names)}")
    table = Table(show_header=True, header_style="bold")
    table.add_column("group")
    table.add_column("option")
    table.add_column("description")
    for g in [group] if group else names:
        for option in group_options(g):
            table.add_row(g, option, describe(g, option))
    print_table(table)


main.add_command(uap)
