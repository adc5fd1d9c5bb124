"""A wrong option name is answered in one line before torch is imported.

torch's import took 33 of the 36.5 s `advbench run attack=nonexistent` needed on a loaded
machine; the option names are checked (and the config composed) before anything imports it.
A fresh interpreter per case, with `-X importtime`, so every module the command loads is seen.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

CASES = [
    (["run", "attack=nonexistent"], "unknown attack 'nonexistent'"),
    (["run", "dataset=nope"], "unknown dataset 'nope'"),
    (["run", "defense=nope"], "unknown defense 'nope'"),
    (["run", "attack=pgd", "defense=natural", "model=nope"], "unknown model 'nope'"),
    (["run", "-m", "attack=fgsm,nonexistent"], "unknown attack 'nonexistent'"),
    (["train", "defense=nope"], "unknown defense 'nope'"),
]


def _run(args: list[str]) -> tuple[int, list[str], set[str]]:
    """Exit status, the lines the command wrote (stdout and stderr), and the modules it imported."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "advbench", *args],
                          capture_output=True, text=True, timeout=120)
    imported = {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    said = [line for line in proc.stdout.splitlines() + proc.stderr.splitlines()
            if line.strip() and not line.startswith("import time:")]
    return proc.returncode, said, imported


@pytest.mark.parametrize(("args", "message"), CASES, ids=[" ".join(a) for a, _ in CASES])
def test_a_bad_option_name_is_one_line_before_torch(args: list[str], message: str) -> None:
    code, said, imported = _run(args)
    assert code != 0
    assert len(said) == 1 and message in said[0] and "valid: " in said[0], said
    heavy = sorted(m for m in imported if m.split(".")[0] in ("torch", "torchvision", "pandas", "pyarrow"))
    assert heavy == [], f"imported before the option name was checked: {heavy[:5]}"


def test_the_check_sees_torch_when_it_is_imported() -> None:
    """The probe can fail: a run that gets as far as its task does import torch."""
    code, _, imported = _run(["run", "--cfg", "job", "attack=fgsm", "dataset.n_samples=nope"])
    assert code != 0
    assert "torch" in imported


def test_in_process_a_bad_option_leaves_torch_unimported() -> None:
    probe = """
import sys
import click
from advbench.cli.main import main
try:
    main(["run", "attack=nonexistent"], standalone_mode=False)
except click.ClickException as exc:
    print(exc.format_message())
print("torch" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.splitlines() == [out.stdout.splitlines()[0], "False"]
    assert out.stdout.startswith("unknown attack 'nonexistent'; valid: ")
