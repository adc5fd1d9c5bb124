"""The shape of the package: layers without cycles, modules with one job, functions that fit on a screen.

import-linter (`lint-imports`, run by `.ci/run`) enforces the layers; these tests hold what it
does not: no import cycle anywhere, no import deferred into a function below the command line
(where one would hide a cycle), and the size limits of the contributor guide.
"""

from __future__ import annotations

import ast
from pathlib import Path

import grimp
import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "advbench"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
SOURCES = sorted(PACKAGE.rglob("*.py"))


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    modules = sorted(graph.modules)
    edges = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in modules:
        if root in index:
            continue
        work = [(root, iter(edges[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(edges[child])))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycles() -> None:
    assert _cycles(grimp.build_graph("advbench")) == []


def test_the_cycle_finder_finds_a_cycle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "knot"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from knot import b\n")
    (pkg / "b.py").write_text("from knot import a\n")
    (pkg / "c.py").write_text("from knot import a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert _cycles(grimp.build_graph("knot")) == [["knot.a", "knot.b"]]


def _deferred_imports(path: Path) -> list[str]:
    """advbench imports inside functions, except under `if TYPE_CHECKING` (never run)."""
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for inner in ast.walk(node):
                names = [inner.module or ""] if isinstance(inner, ast.ImportFrom) else \
                    [a.name for a in inner.names] if isinstance(inner, ast.Import) else []
                found += [f"{path.relative_to(PACKAGE.parent)}:{inner.lineno} {n}" for n in names if n.startswith("advbench")]
    return found


def test_no_deferred_imports_below_the_command_line() -> None:
    """The command line (and the package root's lazy API) imports lazily so that `advbench --help`
    starts at once, and the API's `plot` loads the figures (matplotlib) only when it draws, so
    that `advbench.evaluate` does not pay for them; nothing else may."""
    lazy = {PACKAGE / "__init__.py", *(PACKAGE / "api").glob("*.py")}
    below = [p for p in SOURCES if "cli" not in p.relative_to(PACKAGE).parts and p not in lazy]
    assert [d for p in below for d in _deferred_imports(p)] == []


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_modules_and_functions_stay_small(path: Path) -> None:
    lines = path.read_text().splitlines()
    assert len(lines) <= MAX_MODULE_LINES, f"{len(lines)} lines"
    long = []
    for node in ast.walk(ast.parse("\n".join(lines))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            start = min([d.lineno for d in node.decorator_list] + [node.lineno])
            if node.end_lineno - start + 1 > MAX_FUNCTION_LINES:
                long.append(f"{node.name} ({node.end_lineno - start + 1} lines)")
    assert long == []


def test_every_package_is_installed() -> None:
    """pyproject.toml lists the packages a wheel holds: a folder left out works in an editable
    install and is missing from every other one."""
    import tomllib

    listed = set(tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {".".join(p.parent.relative_to(PACKAGE.parent).parts) for p in PACKAGE.rglob("__init__.py")}
    assert folders - listed == set()


def _private_imports(path: Path) -> list[str]:
    """`from <an advbench module> import _name` in `path`, as 'file:line module._name'."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] == "advbench"):
            found += [f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.module}.{a.name}" for a in node.names
                      if a.name.startswith("_") and not a.name.startswith("__")]
    return found


def test_no_private_name_is_imported_from_another_module() -> None:
    """A name shared between modules is part of the package's contract and says so by having no
    underscore; one imported under an underscore changes without its importers being looked at."""
    found = [line for p in SOURCES for line in _private_imports(p)]
    assert found == []


def test_the_private_import_finder_finds_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(f"{__name__}.PACKAGE", tmp_path / "advbench")
    (tmp_path / "advbench").mkdir()
    source = tmp_path / "advbench" / "user.py"
    source.write_text("from advbench.core.sample_draws import _mix, uniform\nfrom .batch import Batch, _hidden\nfrom os import _exit\n")
    assert _private_imports(source) == ["advbench/user.py:1 advbench.core.sample_draws._mix", "advbench/user.py:2 batch._hidden"]


def repeated_module_names(package: Path) -> dict[str, list[str]]:
    """Module file names used by more than one module of `package` (`__init__.py` aside)."""
    by_name: dict[str, list[str]] = {}
    for path in sorted(package.rglob("*.py")):
        if path.name != "__init__.py":
            by_name.setdefault(path.name, []).append(str(path.relative_to(package)))
    return {name: paths for name, paths in by_name.items() if len(paths) > 1}


def test_every_module_name_is_said_once() -> None:
    """A file name names one module: `base.py` in six folders makes every traceback, search and
    import line ambiguous, so each module's name says what it holds."""
    assert repeated_module_names(PACKAGE) == {}


def test_the_repeat_finder_finds_one(tmp_path: Path) -> None:
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "base.py").write_text("")
    assert repeated_module_names(tmp_path) == {"base.py": ["a/base.py", "b/base.py"]}


CONFIG_NAMES = {"open_dict", "DictConfig", "OmegaConf", "compose_config"}
"""What builds or patches a run config; the API leaves that to cli/ (`api_cells`, `api_metric_cells`)."""


def config_handling(path: Path) -> list[str]:
    """Where `path` names a config object or composes one (CONFIG_NAMES) or writes a value into an
    override string (`json.dumps`), as 'file:line name'; words in docstrings aside."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Name):
            names = [node.id]
        elif isinstance(node, ast.Attribute):
            dumps = node.attr == "dumps" and isinstance(node.value, ast.Name) and node.value.id == "json"
            names = ["json.dumps" if dumps else node.attr]
        elif isinstance(node, ast.ImportFrom):
            names = ["json.dumps" if (node.module, a.name) == ("json", "dumps") else a.name for a in node.names]
        else:
            continue
        found += [f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {name}" for name in names
                  if name in CONFIG_NAMES or name == "json.dumps"]
    return found


API_PATH = ("cli/api_cells.py", "cli/api_metric_cells.py")
"""Where cli/ meets the API: its cells come from plain data (`cli.choices`), no config patched, no value quoted."""


def test_the_api_holds_no_config_object() -> None:
    """The API hands Python values to cli/, which assembles the run config as plain data from the options'
    YAML: one place turns them into the command line's config, so the API cannot drift from it by patching
    one or quoting values."""
    path = [*sorted((PACKAGE / "api").rglob("*.py")), *(PACKAGE / p for p in API_PATH)]
    assert [line for p in path for line in config_handling(p)] == []


def test_the_config_finder_finds_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(f"{__name__}.PACKAGE", tmp_path / "advbench")
    (tmp_path / "advbench" / "api").mkdir(parents=True)
    source = tmp_path / "advbench" / "api" / "planted.py"
    source.write_text('"""Mentions OmegaConf and json.dumps in words only."""\n'
                      "import json\nfrom json import dumps\nfrom omegaconf import DictConfig, open_dict\n"
                      "import advbench.cli.config\n\n\n"
                      "def f(cfg: DictConfig) -> str:\n"
                      "    advbench.cli.config.compose_config('iqa', [])\n"
                      "    return json.dumps(omegaconf.OmegaConf.to_container(cfg))\n")
    assert config_handling(source) == [f"advbench/api/planted.py:{where}" for where in (
        "3 json.dumps", "4 DictConfig", "4 open_dict", "8 DictConfig", "9 compose_config", "10 json.dumps", "10 OmegaConf")]


TARGET_KEY_WRITERS = {"advbench/core/keys.py"}
"""Below cli/, where `_target_` may still be a key: the cell keys hash a data set's and a model's class under
the name the options give it, so keys made before the options stopped travelling below cli/ still match."""


def target_keys(path: Path) -> list[str]:
    """Where `path`'s code holds the string `_target_` (a key read or written), as 'file:line'; words in
    docstrings and messages aside."""
    return [f"{path.relative_to(PACKAGE.parent).as_posix()}:{node.lineno}" for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Constant) and node.value == "_target_"]


def test_only_the_command_line_reads_an_options_class_path() -> None:
    """An option's `_target_` is read once, in cli/ (`cli.option_targets`): below it a data set or model is a
    bound factory, an attack or metric a built object, an ensemble's members built by a builder cli/ hands it."""
    below = [p for layer in ("core", "robustness", "quality") for p in sorted((PACKAGE / layer).rglob("*.py"))
             if p.relative_to(PACKAGE.parent).as_posix() not in TARGET_KEY_WRITERS]
    assert [line for p in below for line in target_keys(p)] == []


def planted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, layer: str, source: str) -> Path:
    """`source` written as advbench/<layer>/planted.py of a package under `tmp_path`, which the finders then read."""
    monkeypatch.setattr(f"{__name__}.PACKAGE", tmp_path / "advbench")
    path = tmp_path / "advbench" / layer / "planted.py"
    path.parent.mkdir(parents=True)
    path.write_text(source)
    return path


def test_the_target_key_finder_finds_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = planted(tmp_path, monkeypatch, "quality", '"""Builds from `_target_` in words only."""\n\n\ndef f(spec):\n'
                     '    message = f"_target_ {spec} is wrong"\n    return spec.pop("_target_"), message\n')
    assert target_keys(source) == ["advbench/quality/planted.py:6"]


SPEC_SUFFIXES = ("Spec", "Settings", "Defense")
"""Dataclasses a job or a cell is made of below the command line: `CellSpec`, `CellSettings`, `MetricDefense`, ..."""
UNTYPED = ("Mapping[str, Any]", "dict[str, Any]", "Mapping[str, Mapping", "DictConfig")


def untyped_spec_fields(path: Path) -> list[str]:
    """`file:line Class.field` for each field of a spec dataclass that is a mapping of anything (or a config)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        decorated = isinstance(node, ast.ClassDef) and any("dataclass" in ast.unparse(d) for d in node.decorator_list)
        if not decorated or not node.name.endswith(SPEC_SUFFIXES):
            continue
        for item in node.body:
            if isinstance(item, ast.AnnAssign) and any(u in ast.unparse(item.annotation) for u in UNTYPED):
                found.append(f"{path.relative_to(PACKAGE.parent).as_posix()}:{item.lineno} {node.name}.{ast.unparse(item.target)}")
    return found


def test_specs_below_the_command_line_are_typed_to_their_leaves() -> None:
    """A spec field holding a mapping of anything is read by key wherever it goes, each reader with its
    own idea of the keys and defaults; typed fields are checked once, where the options are read."""
    below = [p for layer in ("core", "robustness", "quality") for p in sorted((PACKAGE / layer).rglob("*.py"))]
    assert [field for p in below for field in untyped_spec_fields(p)] == []


def test_the_untyped_field_finder_finds_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = planted(tmp_path, monkeypatch, "robustness",
                     "from dataclasses import dataclass, field\n\n\n@dataclass(frozen=True)\nclass OddSpec:\n"
                     "    name: str\n    config: Mapping[str, Any]\n    extra: dict[str, Any] = field(default_factory=dict)\n\n\n"
                     "@dataclass\nclass Record:\n    columns: dict[str, Any]\n")
    assert untyped_spec_fields(source) == ["advbench/robustness/planted.py:7 OddSpec.config",
                                           "advbench/robustness/planted.py:8 OddSpec.extra"]
