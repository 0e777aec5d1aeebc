"""The layers, read from the source with ``ast``: what each folder may import, and module sizes.

The folders are the layers, lowest first (``LAYERS``): a module may import its
own layer and those below it, never one above.

* ``vmdisktouch/core`` is pure: numpy and a few pure standard modules, and
  other core modules. No OS, clock, signal, process, image or PIL module.
* the shared modules at the top level (``errors``, ``sizes``, ``unitname``)
  know nothing else of the package;
* ``system`` (the OS layer) < ``config`` (the settings) < ``adapters`` (the
  world outside the kernel) < ``daemon`` (the cycle, the one runtime) <
  ``commands`` (the CLI).
* The package's import graph has no cycle, function-level imports included.
* ``system/libc.py`` is the one ctypes binding.
* No module has more than ``MAX_CODE_LINES`` lines of code: prose (docstrings,
  comments) does not count, so it never forces a split.
"""

from __future__ import annotations

import ast
import io
import pathlib
import tokenize

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "vmdisktouch"
MAX_CODE_LINES = 300
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


def test_every_folder_is_a_layer():
    folders = {p.parent.name for p in modules() if p.parent != PACKAGE}
    assert folders <= set(LAYERS), folders - set(LAYERS)
    top = {p.stem for p in PACKAGE.glob("*.py")}
    assert top == {"__init__", "__main__", "errors", "sizes", "unitname"}


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


def code_lines(text: str) -> int:
    """Lines that hold code: not blank, not only a comment, not part of a docstring."""
    lines = set()
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT,
                        tokenize.DEDENT, tokenize.ENDMARKER):
            continue
        lines.update(range(tok.start[0], tok.end[0] + 1))
    for node in ast.walk(ast.parse(text)):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            lines -= set(range(body[0].lineno, body[0].end_lineno + 1))
    return len(lines)


@pytest.mark.parametrize("path", modules(), ids=lambda p: p.relative_to(PACKAGE).as_posix())
def test_no_module_has_more_code_than_the_limit(path):
    assert code_lines(path.read_text()) <= MAX_CODE_LINES


def test_the_rules_catch_what_they_are_for(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import numpy as np\n\ndef f():\n    import time\n    return time.time()\n")
    assert "time" in imports(bad) and "time" not in CORE_ALLOWED
    assert layer("vmdisktouch.system.image") == "system" and layer("vmdisktouch.errors") == ""
    assert LAYERS.index(layer("vmdisktouch.daemon.host")) > LAYERS.index("adapters")
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    text = '"""Doc\n\nmore doc."""\n# a comment\n\nx = 1\n\n\ndef f():\n    """Doc."""\n' \
           '    return (x +\n            1)\n'
    assert code_lines(text) == 4


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
