"""The daemon on a kernel without cachestat(2) (Debian 12's 6.1): its residency scans go
through mincore(2), and it says so once, not every cycle.

The kernel here has cachestat, so the daemon runs under a seccomp filter that answers
syscall 451 with ENOSYS, as a kernel before 6.5 does (python3-seccomp, as the sandbox
emulation uses it). tests/vm runs the same daemon on a real 6.1 kernel.
"""

from __future__ import annotations

import errno
import sys

import pytest

from tests.support.daemon_proc import DaemonProc
from tests.support.images import make_image
from tests.support.pagecache import held

pytestmark = [pytest.mark.root, pytest.mark.timeout(120)]

MiB = 1 << 20
CACHESTAT = 451  # x86_64 and the generic table
NO_CACHESTAT = f"""
import os, sys, seccomp
f = seccomp.SyscallFilter(defaction=seccomp.ALLOW)
f.add_rule(seccomp.ERRNO({errno.ENOSYS}), {CACHESTAT})
f.load()
os.execv(sys.argv[1], sys.argv[1:])
"""
LINE = "cachestat(2), added in Linux 6.5; scanning with mincore(2) instead"


@pytest.mark.parametrize("enosys", [True, False], ids=["no-cachestat", "cachestat"])
def test_the_fallback_to_mincore_is_logged_once(tmp_path, enosys):
    image = make_image(tmp_path / "disk.raw", 32 * MiB, sparse=False)
    prefix = [sys.executable, "-c", NO_CACHESTAT] if enosys else []
    with held(image, [(0, 8 * MiB)]):
        d = DaemonProc(tmp_path, image, "--access-source", "mincore", max_hold="16M",
                       interval=0.3, prefix=prefix)
        try:
            status = d.wait_status(lambda st: st["cycle"] >= 4, "4 cycles")
        finally:
            d.stop()
    out = d.output()
    assert out.count(LINE) == (1 if enosys else 0), out[-3000:]
    # The scans still see the 8 MiB the test holds resident.
    assert status["disks"][0]["resident_bytes"] >= 8 * MiB, status
