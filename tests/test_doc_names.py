"""Every dotted `advbench.…` name the docs give resolves: a module that imports, or an attribute
of one. A renamed or deleted function then fails here, by name, instead of sending a reader
to code that is not there."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
DOTTED = re.compile(r"\badvbench(?:\.[A-Za-z_][A-Za-z0-9_]*)+")


def _names() -> list[tuple[str, str]]:
    found = {(page.relative_to(ROOT).as_posix(), name.rstrip("."))
             for page in PAGES for name in DOTTED.findall(page.read_text(encoding="utf-8"))}
    return sorted(found)


def resolves(name: str) -> bool:
    """Whether `name` is a module, or an attribute path below the longest module prefix that imports."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


@pytest.mark.parametrize(("page", "name"), _names(), ids=lambda v: v)
def test_a_dotted_name_in_the_docs_resolves(page: str, name: str) -> None:
    assert resolves(name), f"{page} names {name}, which does not import or resolve"


def test_the_check_can_fail() -> None:
    assert resolves("advbench.core.digests.code_digest")
    assert not resolves("advbench.core.digests.no_such_function")
    assert not resolves("advbench.no_such_module.name")
