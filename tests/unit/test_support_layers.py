"""The code outside the package, read with ``ast``: one home for what is shared, no loop.

* ``tests/support`` holds what the tests, the tools and the benchmarks share:
  it imports ``vmdisktouch`` and itself, never a test module, ``tools`` or
  ``benchmarks``; and it holds no test.
* ``tools/`` holds entry points only (``python -m tools.NAME``): from the
  tests they import ``tests.support``, never a test module nor a benchmark.
* ``benchmarks/`` import ``tests.support`` from the tests, never a test
  module, nor a tool.
* Every import of these modules (and of ``vmdisktouch``) names a module that
  exists, and each name it takes from one is there.
"""

from __future__ import annotations

import ast
import importlib
import pathlib

import pytest

pytestmark = pytest.mark.repo     # the repository's files and tools: the same on every Python

ROOT = pathlib.Path(__file__).resolve().parents[2]
OURS = ("tests", "tools", "benchmarks", "vmdisktouch")


def files(folder: str) -> list[pathlib.Path]:
    return sorted((ROOT / folder).glob("*.py"))


def imported(path: pathlib.Path) -> list[tuple[str, list[str]]]:
    """(module, names taken from it) of every import of ``path``, function-level too;
    ``from pkg import mod`` is named ``pkg.mod`` when ``mod`` is a module."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.extend((a.name, []) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import"
            out.append((node.module, [a.name for a in node.names]))
            out.extend((f"{node.module}.{a.name}", []) for a in node.names
                       if is_module(f"{node.module}.{a.name}"))
    return out


def is_module(name: str) -> bool:
    base = ROOT.joinpath(*name.split("."))
    return base.with_suffix(".py").is_file() or base.is_dir()       # benchmarks/: no __init__


def ours(path: pathlib.Path) -> set[str]:
    return {m for m, _ in imported(path) if m.split(".")[0] in OURS}


def is_test_module(name: str) -> bool:
    """A module of tests/ other than tests/support (a test, a conftest, a test's helper)."""
    return name == "tests" or (name.startswith("tests.") and not name.startswith("tests.support"))


def under(name: str, top: str) -> bool:
    return name == top or name.startswith(top + ".")


@pytest.mark.parametrize("path", files("tests/support"), ids=lambda p: p.name)
def test_support_imports_no_test_module_tool_or_benchmark(path):
    bad = {m for m in ours(path)
           if is_test_module(m) or under(m, "tools") or under(m, "benchmarks")}
    assert not bad, f"{path.name} imports {sorted(bad)}"


def test_support_holds_no_test():
    for path in files("tests/support"):
        assert not path.name.startswith("test_"), path
        tree = ast.parse(path.read_text())
        tests = [n.name for n in tree.body
                 if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name.startswith(("test_", "Test"))]
        assert not tests, f"{path.name}: {tests}"


@pytest.mark.parametrize("path", files("tools"), ids=lambda p: p.name)
def test_tools_import_only_the_support_of_the_tests(path):
    bad = {m for m in ours(path) if is_test_module(m) or under(m, "benchmarks")}
    assert not bad, f"{path.name} imports {sorted(bad)}"


@pytest.mark.parametrize("path", files("benchmarks"), ids=lambda p: p.name)
def test_benchmarks_import_only_the_support_of_the_tests(path):
    bad = {m for m in ours(path) if is_test_module(m) or under(m, "tools")}
    assert not bad, f"{path.name} imports {sorted(bad)}"


def test_tools_keep_only_entry_points():
    names = {p.stem for p in files("tools")} - {"__init__"}
    assert names == {"cli_docs", "curve_example", "demo", "golden_replan", "host_example",
                     "readme_pictures", "rules_doc"}, names


@pytest.mark.parametrize("folder", ["tests/support", "tools", "benchmarks"])
def test_every_import_of_ours_resolves(folder):
    """Each module imported from tests, tools, benchmarks or vmdisktouch exists, and
    each name taken from it is there (a moved name would fail only when its script runs)."""
    missing = []
    for path in files(folder):
        for module, names in imported(path):
            if module.split(".")[0] not in OURS or not is_module(module):
                if module.split(".")[0] in OURS and not is_module(module):
                    missing.append(f"{path.name}: no module {module}")
                continue
            if not names:
                continue
            mod = importlib.import_module(module)
            missing.extend(f"{path.name}: {module}.{n}" for n in names
                           if not hasattr(mod, n) and not is_module(f"{module}.{n}"))
    assert not missing, missing
