"""The package tier's shared fixtures: the .deb, built once by scripts/build-deb.sh as
`make deb` builds it, and a clean Debian 12 root, made once by mmdebstrap; each is
removed when the last test of tests/package is done."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import pytest

from tests.package import debroot


@dataclasses.dataclass(frozen=True)
class Build:
    """What scripts/build-deb.sh made and said."""

    outdir: Path
    returncode: int
    stdout: str
    stderr: str

    def one(self, pattern: str) -> Path:
        """The one file of the output directory that matches ``pattern``."""
        found = sorted(self.outdir.glob(pattern))
        assert len(found) == 1, f"{pattern} in {self.outdir}: {[p.name for p in found]}"
        return found[0]

    def log_tail(self) -> str:
        logs = sorted(self.outdir.glob("*.build"))
        return logs[0].read_text()[-4000:] if logs else "(no build log)"


@pytest.fixture(scope="package")
def build():
    """scripts/build-deb.sh run into a new directory: the build, its lintian run and all."""
    outdir = debroot.scratch_dir("vmdt-deb-")
    try:
        out = subprocess.run(["bash", str(debroot.REPO / "scripts" / "build-deb.sh"),
                              str(outdir)], capture_output=True, text=True, timeout=900)
        yield Build(outdir, out.returncode, out.stdout, out.stderr)
    finally:
        debroot.remove_tree(outdir)


@pytest.fixture(scope="package")
def deb(build) -> Path:
    """The built .deb (the build must have succeeded, lintian included)."""
    assert build.returncode == 0, (f"build-deb.sh exited {build.returncode}: "
                                   f"{build.stderr.strip()}\n{build.stdout[-3000:]}\n"
                                   f"{build.log_tail()}")
    return build.one("vmdisktouch_*_all.deb")


@pytest.fixture(scope="package")
def base_root():
    """A clean Debian 12 root (minbase, systemd, man-db, bash-completion) from the
    machine's apt sources; copy it before changing anything in it."""
    debroot.require_root()
    top = debroot.scratch_dir("vmdt-base-")
    try:
        debroot.mmdebstrap(top / "root")
        yield top / "root"
    finally:
        debroot.remove_tree(top)
