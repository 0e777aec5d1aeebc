"""The VM tier's shared fixtures: the .deb (built by scripts/build-deb.sh, as `make deb`
builds it) and its upgrade (the same package repacked with a higher version), the
cached Debian 12 image (guest_image) and one booted guest for the whole tier."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.package import debroot
from tests.vm import guest_image
from tests.vm.guest import Guest

UPGRADE_SUFFIX = "+vmtest1"


@pytest.fixture(scope="session")
def debs():
    """(the .deb, a rebuilt one with a higher version), in a scratch directory."""
    outdir = debroot.scratch_dir("vmdt-vmdeb-")
    try:
        out = subprocess.run(["bash", str(debroot.REPO / "scripts" / "build-deb.sh"),
                              str(outdir)], capture_output=True, text=True, timeout=900)
        assert out.returncode == 0, f"build-deb.sh failed: {out.stderr}\n{out.stdout[-3000:]}"
        deb = next(outdir.glob("vmdisktouch_*_all.deb"))
        yield deb, repack_higher(deb, outdir / "upgrade")
    finally:
        debroot.remove_tree(outdir)


def repack_higher(deb: Path, workdir: Path) -> Path:
    """The same package with ``UPGRADE_SUFFIX`` added to its version: what an upgrade
    to the next release installs over it (the maintainer scripts run as in one)."""
    tree = workdir / "tree"
    workdir.mkdir(parents=True, exist_ok=True)
    subprocess.run(["dpkg-deb", "-R", str(deb), str(tree)], check=True)
    control = tree / "DEBIAN" / "control"
    text = control.read_text()
    version = debroot.deb_field(deb, "Version")
    control.write_text(re.sub(r"^Version: .*$", f"Version: {version}{UPGRADE_SUFFIX}", text,
                              flags=re.M))
    out = workdir / f"vmdisktouch_{version}{UPGRADE_SUFFIX}_all.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "-b", str(tree), str(out)], check=True,
                   capture_output=True)
    debroot.remove_tree(tree)
    return out


@pytest.fixture(scope="session")
def guest(debs):
    """One booted Debian 12 guest with both .debs on its /mnt/payload."""
    debroot.require_root()
    started = time.monotonic()
    image = guest_image.cached_image(debs[0])
    work = debroot.scratch_dir("vmdt-vm-")
    try:
        payload = guest_image.payload_image(list(debs), work / "payload.img")
        with Guest(image, payload, work) as g:
            print(f"vm: ready {time.monotonic() - started:.0f} s after the tier began")
            yield g
    finally:
        debroot.remove_tree(work)
