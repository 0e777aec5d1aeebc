"""The console script that pip and the Debian package install names a function that
exists: a module move once left ``vmdisktouch`` an ImportError while ``python -m``
still worked, and every test ran through ``python -m``."""

from __future__ import annotations

import importlib
import importlib.metadata
import pathlib
import subprocess
import sys

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11
    import tomli as tomllib

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _scripts() -> dict[str, str]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]


def test_the_console_script_names_the_cli_main():
    target = _scripts()["vmdisktouch"]
    module, _, attr = target.partition(":")
    main = getattr(importlib.import_module(module), attr)
    assert main is importlib.import_module("vmdisktouch.commands.cli").main


def test_the_installed_console_script_runs(tmp_path):
    # the venv's script is made from pyproject.toml by `pip install -e`

    exe = pathlib.Path(sys.executable).with_name("vmdisktouch")
    out = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith(importlib.metadata.version("vmdisktouch"))
