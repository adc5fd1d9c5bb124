"""The documentation: generated option tables are fresh, the README stays short, links resolve."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOC_PAGES = sorted((ROOT / "docs").glob("*.md"))


def _catalog_tables() -> ModuleType:
    path = ROOT / "scripts" / "catalog_tables.py"
    spec = importlib.util.spec_from_file_location("catalog_tables", path)
    assert spec and spec.loader, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


catalog_tables = _catalog_tables()


def test_every_generated_group_has_a_block_on_its_page() -> None:
    for group, page in catalog_tables.PAGES.items():
        found = [g for g, _ in catalog_tables.blocks((ROOT / page).read_text(encoding="utf-8"))]
        assert group in found, f"{page} has no <!-- catalog:{group} --> block"


@pytest.mark.parametrize("page", DOC_PAGES, ids=lambda p: p.name)
def test_catalog_blocks_equal_the_rendered_tables(page: Path) -> None:
    for group, content in catalog_tables.blocks(page.read_text(encoding="utf-8")):
        assert content == catalog_tables.render(group), (
            f"docs/{page.name}: catalog:{group} is stale; run python scripts/catalog_tables.py --write")


def test_rendered_table_lists_every_option_once() -> None:
    from advbench.core.catalog import describe, group_options

    table = catalog_tables.render("attack").splitlines()
    assert table[:2] == ["| option | description |", "| --- | --- |"]
    options = group_options("attack")
    assert [row.split("`")[1] for row in table[2:]] == options
    assert all(row.count(" | ") == 1 for row in table[2:]), "a description broke out of its cell"
    assert describe("attack", "bim").split(",")[0] in table[2 + options.index("bim")]


def test_check_mode_names_a_stale_block(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    for page in set(catalog_tables.PAGES.values()):
        (tmp_path / page).write_text((ROOT / page).read_text(encoding="utf-8"), encoding="utf-8")
    assert catalog_tables.stale(tmp_path) == []
    page = tmp_path / catalog_tables.PAGES["threat"]
    text = page.read_text(encoding="utf-8")
    page.write_text(text.replace("| `linf` |", "| `linf_old` |"), encoding="utf-8")
    assert catalog_tables.stale(tmp_path) == [f"{catalog_tables.PAGES['threat']}: catalog:threat is stale"]
    assert catalog_tables.write(tmp_path) == [page]
    assert catalog_tables.stale(tmp_path) == []
    assert catalog_tables.main(["--check"]) == 0, "the shipped docs are stale"


def test_readme_is_a_front_door() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; move detail into docs/"


def test_the_architecture_page_stays_a_map() -> None:
    """It grew back to 337 lines once its length was no longer watched: a map of the code is read
    whole, so repetition is cut and each module keeps one row, not a paragraph."""
    lines = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 300, f"docs/architecture.md has {len(lines)} lines; condense it to at most 300"


_FENCE = re.compile(r"^(```|~~~).*?^\1", re.DOTALL | re.MULTILINE)
_CODE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE = re.compile(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.MULTILINE)


def relative_links(text: str) -> list[str]:
    """Targets of the Markdown links and images outside code, without URLs or pure anchors."""
    text = _CODE.sub("", _FENCE.sub("", text))
    targets = _LINK.findall(text) + _REFERENCE.findall(text)
    return [t for t in targets if not re.match(r"^([a-z][a-z0-9+.-]*:|#|//)", t, re.IGNORECASE)]


def test_relative_links_skip_code_urls_and_anchors() -> None:
    text = "[a](docs/x.md#part) ![b](../results/y.png) [c](https://e.org) [d](#top) `[e](f.md)`\n```\n[g](h.md)\n```\n"
    assert relative_links(text) == ["docs/x.md#part", "../results/y.png"]


@pytest.mark.parametrize("page", [README, *DOC_PAGES], ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_point_to_existing_files(page: Path) -> None:
    missing = []
    for target in relative_links(page.read_text(encoding="utf-8")):
        path = target.split("#", 1)[0].split("?", 1)[0]
        if path and not (page.parent / path).exists():
            missing.append(target)
    assert not missing, f"{page.relative_to(ROOT)} links to missing files: {missing}"
