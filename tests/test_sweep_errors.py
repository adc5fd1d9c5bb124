"""Sweeps and search paths that Hydra answers in several lines, or not at all, are one line before any job."""

from __future__ import annotations

from pathlib import Path

import pytest

from advbench.cli.config import _check_sweep_base, compose_config
from advbench.core.errors import AdvbenchError

ROW_SWEEP = ["experiment=smoke", "+experiment/blackbox_row=square,hsj"]


def test_a_key_only_the_swept_options_have_is_one_line_naming_the_fix() -> None:
    with pytest.raises(AdvbenchError) as caught:
        _check_sweep_base("config", [*ROW_SWEEP, "attack.params.seed=0"])
    message = str(caught.value)
    assert "attack.params.seed is a key of some swept options only" in message and "++attack.params.seed" in message
    assert "\n" not in message


@pytest.mark.parametrize("extra", [["++attack.params.seed=0"], ["++attack.params.max_queries=50"], []])
def test_sweeps_hydra_accepts_pass(extra: list[str]) -> None:
    _check_sweep_base("config", [*ROW_SWEEP, *extra])
    _check_sweep_base("config", ["attack=fgsm,bim", "seed=1"])


@pytest.mark.parametrize(("entry", "needle"), [
    ("pkg://nonexistent_pkg", "no installed package 'nonexistent_pkg'"),
    ("file:///nonexistent/folder", "no folder '/nonexistent/folder'"),
    ("/no/scheme", "must start with file:// (a folder) or pkg:// (a package)"),
])
def test_a_search_path_entry_hydra_would_skip_is_named(entry: str, needle: str) -> None:
    with pytest.raises(AdvbenchError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        compose_config("config", [f"hydra.searchpath=[{entry}]"])


def test_a_real_search_path_folder_is_used(tmp_path: Path) -> None:
    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "mine.yaml").write_text("# @package _global_\nseed: 7\n")
    cfg = compose_config("config", [f"hydra.searchpath=[file://{tmp_path}]", "experiment=mine"])
    assert cfg.seed == 7
