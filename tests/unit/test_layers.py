"""The layers, read from the source with ``ast``: what each folder may import, and what
crosses a module.

The folders are the layers, lowest first (``LAYERS``): a module may import its
own layer and those below it, never one above. A layer may hold sub-folders,
one per mechanism (``system/trace``, ``adapters/libvirt``...): they are rooms
of that layer, under its rules.

* ``vmdisktouch/core`` is pure: numpy and a few pure standard modules, and
  other core modules. No OS, clock, signal, process, image or PIL module.
* the shared modules at the top level (``errors``, ``sizes``, ``unitname``)
  know nothing else of the package;
* ``system`` (the OS layer) < ``config`` (the settings) < ``adapters`` (the
  world outside the kernel) < ``daemon`` (the cycle, the one runtime) <
  ``commands`` (the CLI).
* The package's import graph has no cycle, function-level imports included.
* ``system/libc.py`` is the one ctypes binding.
* No private name crosses a module: ``_name`` is imported, or read as
  ``module._name``, only inside its own module. A module's size is a guide
  (STYLE), not a rule: splitting one idea at a line count made private names
  cross, the defect this rule catches.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

pytestmark = pytest.mark.repo     # the repository's files and tools: the same on every Python

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "vmdisktouch"
CORE_ALLOWED = {"__future__", "bisect", "collections", "dataclasses", "enum", "functools",
                "heapq", "itertools", "math", "numpy", "typing"}
# lowest first; "" is the package's top level (the shared modules)
LAYERS = ["", "core", "system", "config", "adapters", "daemon", "commands"]


def modules(folder: str = "") -> list[pathlib.Path]:
    return sorted((PACKAGE / folder).rglob("*.py") if folder else PACKAGE.rglob("*.py"))


def module_name(path: pathlib.Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


KNOWN = {module_name(p) for p in modules()}


def imports(path: pathlib.Path) -> set[str]:
    """Every module ``path`` imports, at any depth (function-level imports too), dotted;
    ``from pkg import mod`` names the module ``pkg.mod`` when it is one."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import"
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names
                       if f"{node.module}.{a.name}" in KNOWN)
    return out


def layer(name: str) -> str:
    """The layer of a vmdisktouch module name: its folder, or "" at the top level."""
    parts = name.split(".")
    return parts[1] if len(parts) > 2 and parts[1] in LAYERS else ""


def test_every_folder_is_a_layer_or_a_room_of_one():
    folders = {p.relative_to(PACKAGE).parts[0] for p in modules() if p.parent != PACKAGE}
    assert folders <= set(LAYERS), folders - set(LAYERS)
    rooms = {p.parent.relative_to(PACKAGE).as_posix() for p in modules()
             if len(p.relative_to(PACKAGE).parts) > 2}
    assert all(r.count("/") == 1 for r in rooms), rooms      # one level of rooms
    for r in rooms:
        assert (PACKAGE / r / "__init__.py").exists(), r
    top = {p.stem for p in PACKAGE.glob("*.py")}
    assert top == {"__init__", "__main__", "errors", "report", "sizes", "unitname"}


@pytest.mark.parametrize("path", modules("core"), ids=lambda p: p.name)
def test_the_core_imports_nothing_but_numpy_pure_stdlib_and_the_core(path):
    for name in imports(path):
        if name.startswith("vmdisktouch"):
            assert name.startswith("vmdisktouch.core"), f"{path.name} imports {name}"
        else:
            assert name.split(".")[0] in CORE_ALLOWED, f"{path.name} imports {name}"


@pytest.mark.parametrize("path", [p for p in modules() if p.name != "__main__.py"],
                         ids=lambda p: p.relative_to(PACKAGE).as_posix())
def test_no_module_imports_a_higher_layer(path):
    own = LAYERS.index(layer(module_name(path)) if path.parent != PACKAGE else "")
    for name in imports(path):
        if name.startswith("vmdisktouch.") and name in KNOWN:
            assert LAYERS.index(layer(name)) <= own, f"{module_name(path)} imports {name}"


def test_the_import_graph_has_no_cycle():
    graph = {module_name(p): {n for n in imports(p) if n in KNOWN and n != module_name(p)}
             for p in modules()}
    cycle = find_cycle(graph)
    assert cycle is None, " -> ".join(cycle)


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` (a list of nodes, the first repeated last), or None."""
    state: dict[str, int] = {}       # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_libc_is_the_one_ctypes_binding():
    users = [p.relative_to(PACKAGE).as_posix() for p in modules()
             if any(n.split(".")[0] == "ctypes" for n in imports(p))]
    assert users == ["system/libc.py"]


def private_crossings(path: pathlib.Path) -> list[str]:
    """The private names of other vmdisktouch modules ``path`` uses: ``from m import _x``,
    or ``m._x`` where ``m`` is a vmdisktouch module it imported (dunders are public)."""
    def private(name: str) -> bool:
        return name.startswith("_") and not name.startswith("__")

    tree = ast.parse(path.read_text(), str(path))
    bound, out = {}, []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("vmdisktouch"):
            for a in node.names:
                if private(a.name):
                    out.append(f"{node.module}.{a.name}")
                bound[a.asname or a.name] = f"{node.module}.{a.name}"
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("vmdisktouch"):
                    bound[a.asname or a.name.split(".")[0]] = a.name
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and node.value.id in bound and private(node.attr):
            out.append(f"{bound[node.value.id]}.{node.attr}")
    return out


@pytest.mark.parametrize("path", modules(), ids=lambda p: p.relative_to(PACKAGE).as_posix())
def test_no_private_name_crosses_a_module(path):
    assert private_crossings(path) == []


def test_the_rules_catch_what_they_are_for(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import numpy as np\n\ndef f():\n    import time\n    return time.time()\n")
    assert "time" in imports(bad) and "time" not in CORE_ALLOWED
    assert layer("vmdisktouch.system.image") == "system" and layer("vmdisktouch.errors") == ""
    assert LAYERS.index(layer("vmdisktouch.daemon.host")) > LAYERS.index("adapters")
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    bad.write_text("from vmdisktouch.core.regions import _Ranked, Rules\n"
                   "from vmdisktouch.core import heat\n"
                   "x = heat._fold(1) + heat.__name__\n")
    assert private_crossings(bad) == ["vmdisktouch.core.regions._Ranked",
                                      "vmdisktouch.core.heat._fold"]


def test_the_daemon_runs_without_scipy(tmp_path):
    """scipy is a test dependency only: every module of the package imports with scipy
    made unimportable, and a snapshot with a PNG runs."""
    import subprocess
    import sys
    img = tmp_path / "d.raw"
    img.write_bytes(b"\0" * (1 << 20))
    code = (
        "import sys, pkgutil, importlib, runpy\n"
        "sys.modules['scipy'] = None\n"
        "import vmdisktouch\n"
        "for m in pkgutil.walk_packages(vmdisktouch.__path__, 'vmdisktouch.'):\n"
        "    if m.name != 'vmdisktouch.__main__':\n"
        "        importlib.import_module(m.name)\n"
        f"sys.argv = ['vmdisktouch', 'snapshot', {str(img)!r}, '--png', "
        f"{str(tmp_path / 'm.png')!r}]\n"
        "runpy.run_module('vmdisktouch', run_name='__main__')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path / "m.png").exists() and "Resident Pages" in r.stdout
