"""Fixtures shared by the system and end-to-end tests."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

import pytest

from tests.support.common import require_tool
from tests.support.images import make_image

# A daemon started with no --status writes one in the runtime directory (/run/vmdisktouch):
# every test's daemons write it here instead, never on the host's (adapters/runtime_dir.py).
if not os.environ.get("VMDISKTOUCH_RUNTIME_DIR"):
    import atexit
    os.environ["VMDISKTOUCH_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="vmdt-runtime-")
    atexit.register(shutil.rmtree, os.environ["VMDISKTOUCH_RUNTIME_DIR"], True)


@pytest.fixture
def loop_device_of(tmp_path):
    """Makes loop devices over new sparse files of a given size; all detached at teardown."""
    losetup = require_tool("losetup")
    made: list[str] = []

    def make(size: int) -> str:
        backing = make_image(tmp_path / f"loop{len(made)}.raw", size)
        dev = subprocess.run([losetup, "--find", "--show", backing], check=True,
                             capture_output=True, text=True).stdout.strip()
        made.append(dev)
        return dev

    yield make
    for dev in made:
        subprocess.run([losetup, "-d", dev], check=True)


@pytest.fixture
def shared_dir():
    """A world-searchable directory (0755) under /var/tmp, for a test that runs a command
    as an unprivileged user: tmp_path's parents are 0700."""
    d = tempfile.mkdtemp(prefix="vmdt-shared-", dir="/var/tmp")
    os.chmod(d, 0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d)
