"""The two reasons a host of real daemons can only show with the kernel's help: the lock
limit (a daemon without CAP_IPC_LOCK whose RLIMIT_MEMLOCK is lowered) and the cgroup (a
guest in a memory-limited group keeps re-reading a zone, which is ceded to its own cache).
Each runs ``vmdisktouch run A B`` (a host of two disks) and reads the host status file.
The others are tests/system/test_host_reasons.py."""

from __future__ import annotations

import resource
import sys
import time

import pytest

from tests.support.common import require_tool
from tests.support.pagecache import GUEST_MAPPER, data_image, read_range
from tests.support.daemon_proc import DaemonProc

MiB = 1 << 20
FAST = ("--uri", "", "--min-free", "0", "--interval", "0.3", "--decay", "1",
        "--access-source", "mincore")


def disk(st: dict, path: str) -> dict:
    return next(d for d in st.get("disks", []) if d["path"] == path)


def test_the_lock_limit_in_host_mode(tmp_path):
    a = data_image(tmp_path / "a.img", 32 * MiB)
    b = data_image(tmp_path / "b.img", 32 * MiB)
    hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
    limit = 8 * MiB if hard == resource.RLIM_INFINITY else min(8 * MiB, hard // MiB * MiB)
    assert limit >= 4 * MiB, f"RLIMIT_MEMLOCK hard limit {hard} is too low for this test"
    prefix = [require_tool("prlimit"), f"--memlock={limit}:{limit}",
              require_tool("setpriv"), "--inh-caps=-ipc_lock", "--bounding-set=-ipc_lock"]
    d = DaemonProc(tmp_path, [a, b], "--max-hold", str(limit), *FAST, prefix=prefix)
    try:
        d.wait_output("cycle 1:")
        import subprocess
        subprocess.run([require_tool("prlimit"), "--pid", str(d.pid),
                        f"--memlock={2 * MiB}:{2 * MiB}"], check=True)

        def drive():
            read_range(a, 0, 6 * MiB)
            read_range(b, 0, 6 * MiB)
        st = d.wait_status(lambda s: any(x.get("limited_by") == "lock_limit"
                                         for x in s.get("disks", [])),
                           "a disk limited by the lock limit", drive=drive)
        lim = [x for x in st["disks"] if x["limited_by"] == "lock_limit"]
        assert "refused to lock more" in lim[0]["not_held_reason"]
        assert st["host"]["held_bytes"] <= 2 * MiB
        line = next(x for x in st["host"]["disks"] if x["path"] == lim[0]["path"])
        assert line["limited_by"] == "lock_limit"
    finally:
        assert d.stop() == 0, d.output()[-2000:]


MAPPER = GUEST_MAPPER


def test_the_cgroup_in_host_mode(tmp_path):
    from tests.support.cgroup import MemoryCgroup
    a = data_image(tmp_path / "a.img", 64 * MiB)
    b = data_image(tmp_path / "b.img", 32 * MiB)
    cg = MemoryCgroup("reasons-host", 128 * MiB).create()
    try:
        cg.popen([sys.executable, "-c", MAPPER, str(a), str(8 * MiB), str(16 * MiB)])
        time.sleep(1.5)                                  # the zone is the guest's cache now
        d = DaemonProc(tmp_path, [a, b], "--max-hold", "32M", *FAST)
        try:
            st = d.wait_status(lambda s: disk(s, a).get("limited_by") == "cgroup",
                               "the guest's zone ceded to its own cache",
                               drive=lambda: read_range(b, 0, 4 * MiB))
            assert "its memory cgroup keeps re-reading" in disk(st, a)["not_held_reason"]
            assert "stays its own cache" in d.output()
        finally:
            assert d.stop() == 0, d.output()[-2000:]
    finally:
        cg.cleanup()
