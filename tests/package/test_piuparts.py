"""piuparts on the .deb: installed into a copy of the clean Debian 12 root, purged, and
the root compared before and after by piuparts' own rules (docs/packaging.md)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.package import debroot

pytestmark = [pytest.mark.root, pytest.mark.timeout(900)]


def test_piuparts_install_and_purge_pass(base_root, deb):
    piuparts = shutil.which("piuparts")
    assert piuparts, "piuparts is not installed: run `make test`, which installs it"
    work = debroot.scratch_dir("vmdt-piu-")
    log = work / "piuparts.log"
    try:
        # -e: a copy of the root conftest made (piuparts copies it, never changes it);
        # --keep-sources-list: its apt sources, the machine's Debian 12 ones; no upgrade
        # test: no earlier version is in the archive. In a mount namespace of its own,
        # so its /proc, /dev/pts and /dev/shm mounts end with it, whatever happens.
        out = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "--",
             piuparts, "-e", str(base_root), "-d", debroot.SUITE, "--keep-sources-list",
             "--no-upgrade-test", "-l", str(log), str(deb)],
            capture_output=True, text=True, timeout=840, env={**debroot.ENV, "TMPDIR": str(work)})
        text = log.read_text() if log.exists() else out.stdout + out.stderr
        assert out.returncode == 0 and "PASS: All tests." in text, text[-5000:]
        assert "PASS: Installation and purging test." in text
    finally:
        debroot.remove_tree(work)
