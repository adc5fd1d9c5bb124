"""Commands that only read the catalogue or print help start without the heavy libraries.

A fresh interpreter per case, so modules other tests imported do not hide an import.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
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


REFUSED = PROBE.replace("    except SystemExit:", "    except (SystemExit, click.ClickException):").replace(
    "import contextlib,", "import click, contextlib,")


@pytest.mark.parametrize("args", [["run", "attack=nonexistent"], ["run", "dataset=nope"], ["run", "defense=nope"],
                                  ["run", "-m", "attack=fgsm,nope"], ["train", "model=nope"]], ids=" ".join)
def test_a_bad_option_name_is_refused_with_hydra_alone(args: list[str]) -> None:
    """Composing needs Hydra; the option names are checked before torch, pandas and the rest load."""
    out = subprocess.run([sys.executable, "-c", REFUSED, *args], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == ["hydra"]


def test_the_probe_sees_an_import() -> None:
    """The check can fail: a command that does import the model stack is caught."""
    out = subprocess.run([sys.executable, "-c", PROBE.replace("from advbench.cli.main import main",
                                                               "import torch\nfrom advbench.cli.main import main"),
                          "--help"], capture_output=True, text=True, check=True)
    assert "torch" in json.loads(out.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------- the digits without scikit-learn


def test_digits_file_reads_as_sklearn_loads_it() -> None:
    from sklearn.datasets import load_digits as sklearn_digits

    from advbench.robustness.data.digits import load_digits

    images, target = load_digits()
    bunch = sklearn_digits()
    for ours, theirs in ((images, bunch.images), (target, bunch.target)):
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
        assert ours.tobytes() == theirs.tobytes()


TIED = np.repeat(np.arange(5), [7, 7, 7, 4, 4])  # equal shares: every remainder tie is broken by the RNG


@pytest.mark.parametrize(("labels", "fraction", "seed"), [
    ("digits", 0.3, 0), ("digits", 0.3, 1), ("digits", 0.25, 7), ("digits", 0.1, 3), ("digits", 0.5, 42),
    ("digits", 0.99, 0), ("tied", 0.3, 0), ("tied", 0.5, 5), ("tied", 0.37, 11), ("tied", 0.2, 2),
], ids=str)
def test_stratified_split_is_sklearns(labels: str, fraction: float, seed: int) -> None:
    from sklearn.model_selection import train_test_split

    from advbench.robustness.data.digits import load_digits, stratified_split

    y = load_digits()[1] if labels == "digits" else TIED
    ours = stratified_split(y, fraction, seed)
    theirs = train_test_split(np.arange(len(y)), test_size=fraction, stratify=y, random_state=seed)
    for mine, sk in zip(ours, theirs):
        assert mine.dtype == sk.dtype and mine.tobytes() == sk.tobytes()


@pytest.mark.parametrize("fraction", [0.0, 1.0, 1.5, 1, True, 0.001])
def test_a_bad_test_fraction_is_one_line(fraction: float) -> None:
    from advbench.core.errors import AdvbenchError
    from advbench.robustness.data.digits import Digits

    with pytest.raises(AdvbenchError, match="test_fraction"):
        Digits(test_fraction=fraction)


def test_the_digits_load_without_sklearn() -> None:
    probe = ("import sys; from advbench.robustness.data.digits import Digits; Digits(n_samples=8).eval_set(); "
             "print(sorted(m for m in ('sklearn', 'scipy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"



# ---------------------------------------------------------------- the API's first access


def _loaded(code: str, names: tuple[str, ...], cwd: Path | None = None) -> list[str]:
    """Which of `names` (top-level packages or advbench modules) a fresh interpreter holds after `code`."""
    probe = f"import json, sys\n{code}\nprint(json.dumps(sorted(m for m in {names!r} if m in sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=cwd)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_looking_up_evaluate_loads_no_heavy_library() -> None:
    """`advbench.evaluate` (and `evaluate_metric`, the quality half's) is the function itself, its signature
    and docstring; the engine (`api.calls`, `api.metric_calls`), torch, pandas and OmegaConf load on its
    first call, not on the look-up."""
    assert _loaded("import advbench; advbench.evaluate; advbench.evaluate_metric; advbench.plot; advbench.options",
                   (*HEAVY, "omegaconf", "advbench.api.calls", "advbench.api.metric_calls")) == []


def test_the_engine_loads_the_corruption_cell_only_for_corruptions() -> None:
    """`api.calls` imports the corruption cell (and torchvision with it) where a corruption cell runs."""
    names = ("torchvision", "advbench.robustness.evaluation.corruption_cell")
    assert _loaded("import advbench.api.calls", names) == []
    assert _loaded("import advbench.api.calls, advbench.robustness.evaluation.corruption_cell", names) == sorted(names)


def test_the_api_still_answers_every_name() -> None:
    """Every function looked up hands the body it calls all its parameters, by name (the bodies take
    keyword-only parameters, so a parameter one side lacks fails), and a wrong name fails as before."""
    import inspect

    import advbench
    from advbench.api import calls, metric_calls

    for name, body in [*((n, getattr(calls, n)) for n in ("evaluate", "evaluate_preset", "preset_cost", "plot",
                                                          "report", "summary", "options")),
                       ("evaluate_metric", metric_calls.evaluate_metric)]:
        said = inspect.signature(getattr(advbench, name)).parameters
        taken = inspect.signature(body).parameters
        assert list(said) == list(taken), name
        assert all(p.kind is p.KEYWORD_ONLY for p in taken.values()), name
    assert list(inspect.signature(advbench.evaluate_metric).parameters)[:2] == ["metric", "images"]
    with pytest.raises(AttributeError, match="evaluat"):
        advbench.api.evaluat  # noqa: B018
    assert advbench.options("attack")["fgsm"]


def test_an_lp_run_leaves_the_corruption_cell_out(tmp_path: Path) -> None:
    """`advbench run` on an ℓp cell does not import the corruption cell, nor torchvision with it (about 1 s)."""
    code = ("from advbench.cli.main import main\ntry:\n    main(['run', 'experiment=smoke', 'dataset.n_samples=8'], "
            "standalone_mode=False)\nexcept SystemExit:\n    pass")
    names = ("torchvision", "advbench.robustness.evaluation.corruption_cell", "advbench.robustness.evaluation.cell")
    assert _loaded(code, names, cwd=tmp_path) == ["advbench.robustness.evaluation.cell"]
