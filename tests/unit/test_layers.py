"""The layers, read from the source with ``ast``: what each folder may import, and module sizes.

* ``vmdisktouch/core`` is pure: numpy and a few pure standard modules, and
  other core modules. No OS, clock, signal, process, image or PIL module,
  and nothing from ``system``, ``adapters`` or the app modules.
* ``vmdisktouch/system`` (the OS layer) does not know the adapters or the
  app; ``vmdisktouch/adapters`` do not know the app.
* ``system/libc.py`` is the one ctypes binding.
* No module is longer than ``MAX_LINES``.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "vmdisktouch"
MAX_LINES = 400
CORE_ALLOWED = {"__future__", "bisect", "collections", "dataclasses", "enum", "functools",
                "heapq", "itertools", "math", "numpy", "typing"}
APP = {"build", "watcher", "recharge", "report", "record", "run", "snapshot", "cli"}


def modules(folder: str = "") -> list[pathlib.Path]:
    return sorted((PACKAGE / folder).rglob("*.py") if folder else PACKAGE.rglob("*.py"))


def imports(path: pathlib.Path) -> set[str]:
    """Every module ``path`` imports, at any depth (function-level imports too), dotted."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import"
            out.add(node.module)
            if node.module == "vmdisktouch":                 # from vmdisktouch import x
                out.update(f"vmdisktouch.{a.name}" for a in node.names)
    return out


def layer(name: str) -> str:
    """The layer of a vmdisktouch module name: core, system, adapters, app or common."""
    parts = name.split(".")
    if len(parts) > 1 and parts[1] in ("core", "system", "adapters"):
        return parts[1]
    return "app" if len(parts) > 1 and parts[1] in APP else "common"


@pytest.mark.parametrize("path", modules("core"), ids=lambda p: p.name)
def test_the_core_imports_nothing_but_numpy_pure_stdlib_and_the_core(path):
    for name in imports(path):
        if name.startswith("vmdisktouch"):
            assert name.startswith("vmdisktouch.core"), f"{path.name} imports {name}"
        else:
            assert name.split(".")[0] in CORE_ALLOWED, f"{path.name} imports {name}"


@pytest.mark.parametrize("folder, forbidden", [("system", {"adapters", "app"}),
                                               ("adapters", {"app"})])
def test_lower_layers_do_not_import_higher_ones(folder, forbidden):
    for path in modules(folder):
        for name in imports(path):
            if name.startswith("vmdisktouch."):
                assert layer(name) not in forbidden, f"{folder}/{path.name} imports {name}"


def test_libc_is_the_one_ctypes_binding():
    users = [p.relative_to(PACKAGE).as_posix() for p in modules()
             if any(n.split(".")[0] == "ctypes" for n in imports(p))]
    assert users == ["system/libc.py"]


@pytest.mark.parametrize("path", modules(), ids=lambda p: p.relative_to(PACKAGE).as_posix())
def test_no_module_is_longer_than_the_limit(path):
    assert len(path.read_text().splitlines()) <= MAX_LINES


def test_the_rule_catches_a_core_module_that_reads_the_clock(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import numpy as np\n\ndef f():\n    import time\n    return time.time()\n")
    assert "time" in imports(bad) and "time" not in CORE_ALLOWED
    assert layer("vmdisktouch.system.image") == "system" and layer("vmdisktouch.build") == "app"


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
