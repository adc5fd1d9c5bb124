"""Start-up time of the command line against its floor: `python -c "import torch"` plus the attack.

Runs, interleaved so that load on the machine hits every command alike, `python -c "import torch"`,
`advbench --help`, `advbench list` and `advbench run experiment=smoke`, each in a fresh temporary
folder (the smoke writes its records under the working folder). The smoke's attack time is read
from its records (`seconds` is a cell's time per sample). Prints each command's median and the
smoke's ratio to the target, 1.5 x (import torch + attack time): of the medians, and the median
of each round's own ratio (steadier on a loaded machine). `--imports` times only `import torch`
against `import advbench; advbench.evaluate` and `advbench.evaluate_metric` (the API's look-ups),
against what the API's first call imports on top of torch (`advbench.api.calls`) and against that
call's floor, the libraries every call uses (pandas for the records it returns, OmegaConf for its
config), alternating, and prints their ratios the same two ways.

Every command runs once untimed first, and the interpreters keep their compiled bytecode in a
folder of the script's own (removed at the end), as an installed package has it from its install;
where `PYTHONDONTWRITEBYTECODE` is set, advbench's modules changed since their last `.pyc` would
otherwise be compiled again in every round, while torch's bytecode is read from its install.

    python scripts/bench_startup.py --rounds 5
    python scripts/bench_startup.py --imports --rounds 9
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

ADVBENCH = [sys.executable, "-m", "advbench"]
COMMANDS = {
    "import torch": [sys.executable, "-c", "import torch"],
    "advbench.evaluate": [sys.executable, "-c", "import advbench; advbench.evaluate"],
    "advbench.evaluate_metric": [sys.executable, "-c", "import advbench; advbench.evaluate_metric"],
    "torch + the API's first call": [sys.executable, "-c", "import torch, advbench.api.calls"],
    "torch + pandas": [sys.executable, "-c", "import torch, pandas"],
    "torch + pandas + omegaconf": [sys.executable, "-c", "import torch, pandas, omegaconf"],
    "advbench --help": [*ADVBENCH, "--help"],
    "advbench list": [*ADVBENCH, "list"],
    "advbench run experiment=smoke": [*ADVBENCH, "run", "experiment=smoke"],
}
TARGET = 1.5
IMPORTS = ("import torch", "advbench.evaluate", "advbench.evaluate_metric", "torch + the API's first call",
           "torch + pandas", "torch + pandas + omegaconf")
RUN = ("import torch", "advbench.evaluate", "torch + the API's first call", "advbench --help", "advbench list",
       "advbench run experiment=smoke")


def timed(command: list[str]) -> tuple[float, Path]:
    """Wall seconds of `command` run in a fresh folder, and that folder."""
    folder = Path(tempfile.mkdtemp(prefix="bench_startup_"))
    start = time.perf_counter()
    subprocess.run(command, cwd=folder, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start, folder


def keep_bytecode() -> Path:
    """A fresh folder for the timed interpreters' bytecode (`PYTHONPYCACHEPREFIX`), bytecode writing on."""
    folder = Path(tempfile.mkdtemp(prefix="bench_startup_pyc_"))
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ["PYTHONPYCACHEPREFIX"] = str(folder)
    return folder


def attack_seconds(folder: Path) -> float:
    """The smoke cell's attack time: its records' seconds per sample times its samples."""
    frame = pd.read_parquet(folder / "advbench-out" / "smoke" / "records")
    return float(frame["seconds"].iloc[0] * len(frame))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds of the commands (at least 5 for a median)")
    parser.add_argument("--imports", action="store_true", help="only import torch against advbench.evaluate's access")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    names = IMPORTS if args.imports else RUN
    bytecode = keep_bytecode()
    for name in names:  # the untimed round: compiles the bytecode every timed round then reads
        shutil.rmtree(timed(COMMANDS[name])[1])
    times: dict[str, list[float]] = {name: [] for name in names}
    attack: list[float] = []
    for _ in range(args.rounds):
        for name in names:
            command = COMMANDS[name]
            seconds, folder = timed(command)
            times[name].append(seconds)
            if name.startswith("advbench run"):
                attack.append(attack_seconds(folder))
            shutil.rmtree(folder)
    shutil.rmtree(bytecode)
    median = {name: statistics.median(values) for name, values in times.items()}
    for name, values in times.items():
        print(f"{name:32s} median {median[name]:5.2f} s   (min {min(values):.2f}, max {max(values):.2f}, n={len(values)})")
    for name in (n for n in names[1:] if n in IMPORTS):
        ratios = (a / t for a, t in zip(times[name], times["import torch"]))
        print(f"{name} / import torch = {median[name] / median['import torch']:.2f} (medians); "
              f"median of the rounds' ratios {statistics.median(ratios):.2f}")
    if args.imports:
        return
    floor = median["import torch"] + statistics.median(attack)
    smoke = median["advbench run experiment=smoke"]
    # Each round's own ratio too: the two commands of a round ran seconds apart, under the same load.
    per_round = statistics.median(s / (t + a) for s, t, a in zip(times["advbench run experiment=smoke"],
                                                                  times["import torch"], attack))
    print(f"{'smoke attack time':32s} median {statistics.median(attack):5.2f} s")
    print(f"target {TARGET} x (import torch + attack) = {TARGET * floor:.2f} s; smoke / (import torch + attack) = "
          f"{smoke / floor:.2f} ({'within' if smoke <= TARGET * floor else 'over'} the target); "
          f"median of the rounds' ratios {per_round:.2f}")


if __name__ == "__main__":
    main()
