"""Generate the option catalogue tables of docs/ from the shipped option YAML.

Each table sits between two marker comments in a docs page:

    <!-- catalog:attack -->
    | option | description |
    ...
    <!-- /catalog:attack -->

    python scripts/catalog_tables.py           # print every table
    python scripts/catalog_tables.py --write   # rewrite the marked blocks in docs/
    python scripts/catalog_tables.py --check   # exit 1 and name the blocks that are stale

The descriptions are those of `advbench list` (`advbench.core.catalog.describe`), so the docs,
the command line and the YAML cannot disagree. Printed tables list the user's options too
(`ADVBENCH_CONF`); `--write` and `--check` keep the docs to the shipped ones and refuse to run
while `ADVBENCH_CONF` is set.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from advbench.core.catalog import USER_CONF, conf_dir, describe, group_options, groups, user_conf_dirs

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

#: The page that carries each generated table.
PAGES: dict[str, str] = {
    "attack": "docs/attacks.md",
    "defense": "docs/defenses.md",
    "threat": "docs/threat-models.md",
    "experiment": "docs/getting-started.md",
    "metric": "docs/quality.md",
    "model": "docs/getting-started.md",
    "dataset": "docs/getting-started.md",
    "iqa/attack": "docs/iqa.md",
    "iqa/experiment": "docs/iqa.md",
    "iqa/defense": "docs/iqa.md",
}

BLOCK = re.compile(r"(<!-- catalog:([\w/-]+) -->\n)(.*?)(<!-- /catalog:\2 -->)", re.DOTALL)


def _cell(text: str) -> str:
    """A description as one Markdown table cell: no line breaks, no stray markup."""
    text = " ".join(text.split())
    for char, escaped in (("\\", "\\\\"), ("|", "\\|"), ("*", "\\*"), ("~", "\\~"), ("<", "\\<")):
        text = text.replace(char, escaped)
    return text


def render(group: str) -> str:
    """The Markdown table (option | description) of one config group, ending in a newline."""
    if group not in groups():
        raise SystemExit(f"unknown config group {group!r}; groups in {conf_dir()}: {', '.join(groups())}")
    rows = ["| option | description |", "| --- | --- |"]
    rows += [f"| `{option}` | {_cell(describe(group, option))} |" for option in group_options(group)]
    return "\n".join(rows) + "\n"


def blocks(text: str) -> list[tuple[str, str]]:
    """(group, current content) of every marked block in a page."""
    return [(m.group(2), m.group(3)) for m in BLOCK.finditer(text)]


def refresh(text: str) -> str:
    """The page with every marked block replaced by its freshly rendered table."""
    return BLOCK.sub(lambda m: m.group(1) + render(m.group(2)) + m.group(4), text)


def stale(root: Path = ROOT) -> list[str]:
    """One line per block that is missing or differs from the rendered table."""
    problems: list[str] = []
    for group, page in PAGES.items():
        path = root / page
        found = dict(blocks(path.read_text(encoding="utf-8"))) if path.exists() else {}
        if group not in found:
            problems.append(f"{page}: no <!-- catalog:{group} --> block")
    for path in sorted((root / "docs").glob("*.md")):
        for group, content in blocks(path.read_text(encoding="utf-8")):
            if content != render(group):
                problems.append(f"{path.relative_to(root)}: catalog:{group} is stale")
    return problems


def write(root: Path = ROOT) -> list[Path]:
    """Rewrite the marked blocks of every docs page; the pages that changed."""
    changed = []
    for path in sorted((root / "docs").glob("*.md")):
        text = path.read_text(encoding="utf-8")
        new = refresh(text)
        if new != text:
            path.write_text(new, encoding="utf-8")
            changed.append(path)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="rewrite the marked blocks in docs/")
    mode.add_argument("--check", action="store_true", help="exit 1 if a marked block is stale or missing")
    args = parser.parse_args(argv)
    if (args.write or args.check) and user_conf_dirs():
        print(f"unset {USER_CONF}: the docs tables list the shipped options only", file=sys.stderr)
        return 2
    if args.write:
        for path in write():
            print(f"wrote {path.relative_to(ROOT)}")
        missing = stale()
        for line in missing:
            print(line, file=sys.stderr)
        return 1 if missing else 0
    if args.check:
        problems = stale()
        for line in problems:
            print(line, file=sys.stderr)
        if problems:
            print("run: python scripts/catalog_tables.py --write", file=sys.stderr)
            return 1
        print(f"catalogue tables up to date ({len(PAGES)} groups)")
        return 0
    for group in PAGES:
        print(f"<!-- catalog:{group} -->\n{render(group)}<!-- /catalog:{group} -->\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
