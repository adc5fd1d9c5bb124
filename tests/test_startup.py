"""Commands that only read the catalogue or print help start without the heavy libraries.

A fresh interpreter per case, so modules other tests imported do not hide an import.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "torchvision", "pandas", "pyarrow", "sklearn", "hydra", "matplotlib")
PROBE = """
import contextlib, io, json, sys
from advbench.cli.main import main
with contextlib.redirect_stdout(io.StringIO()):
    try:
        main(sys.argv[1:], standalone_mode=False)
    except SystemExit:
        pass
print(json.dumps(sorted({m.split(".")[0] for m in sys.modules} & set(%r))))
""" % (HEAVY,)


@pytest.mark.parametrize("args", [["--help"], ["list"], ["list", "attack"], ["run", "--help"], ["plot", "--help"],
                                  ["check", "--help"], ["uap", "--help"], ["weights", "--help"],
                                  ["iqa", "--help"], ["iqa", "run", "--help"], ["list", "iqa/attack"],
                                  ["weights", "list"]], ids=" ".join)
def test_help_and_list_import_no_heavy_library(args: list[str]) -> None:
    out = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_the_probe_sees_an_import() -> None:
    """The check can fail: a command that does import the model stack is caught."""
    out = subprocess.run([sys.executable, "-c", PROBE.replace("from advbench.cli.main import main",
                                                               "import torch\nfrom advbench.cli.main import main"),
                          "--help"], capture_output=True, text=True, check=True)
    assert "torch" in json.loads(out.stdout.strip().splitlines()[-1])
