"""The tests run the libraries an operator's apt installs: Debian 12's python3-numpy,
python3-pil, python3-xxhash, python3-libvirt and python3-prometheus-client (the
package's Depends and Recommends), not newer copies from pip that could hide a
difference (numpy 1.24 refuses ``np.uint64 & int`` where numpy 2 does not: the VM tier
found the daemon dying of it at start). scripts/install-deps.sh makes the venv so."""

from __future__ import annotations

import importlib
import subprocess

import pytest

pytestmark = pytest.mark.repo

# module -> the Debian package that ships it
DEBIAN = {"numpy": "python3-numpy", "PIL": "python3-pil", "xxhash": "python3-xxhash",
          "libvirt": "python3-libvirt", "prometheus_client": "python3-prometheus-client",
          "systemd.journal": "python3-systemd", "scipy": "python3-scipy"}


@pytest.mark.parametrize("module", sorted(DEBIAN))
def test_each_library_is_debian_s(module):
    path = importlib.import_module(module).__file__
    owner = subprocess.run(["dpkg-query", "-S", path], capture_output=True, text=True)
    assert owner.returncode == 0 and owner.stdout.split(":")[0] == DEBIAN[module], \
        f"{module} is imported from {path}, not from Debian's {DEBIAN[module]}: run `make deps`"
