"""No descriptor on an image without ``O_NOATIME``, and an image's atime unchanged.

On a small ext4 file system of its own (a loop device under ``tmp_path``)
mounted ``strictatime``, where every read of a file moves its atime (tmpfs
would keep atime too, but has no ``O_DIRECT``, and the probes are O_DIRECT):
the daemon serves an image, and ``advise`` watches it twice, through the page
cache (its miss probe) and as a ``cache=none`` disk (its direct-I/O tracer,
whose start reads the image with O_DIRECT), for 30 s. Every descriptor any of
them holds on the image carries ``O_NOATIME`` (``/proc/PID/fdinfo``; the test
runs as root, the owner, so it is permitted), the probes' ``O_DIRECT`` ones
among them, and the image's atime has not moved at the end.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time

import pytest

from tests.support.common import ROOT, require_tool
from tests.support.daemon_proc import DaemonProc
from tests.support.images import evict, make_image

pytestmark = pytest.mark.root

MiB = 1 << 20
O_NOATIME = 0o1000000             # asm-generic/fcntl.h, as /proc/PID/fdinfo prints flags
RUN_S = 30


@contextlib.contextmanager
def strictatime_ext4(tmp_path, size: int = 128 * MiB):
    """A new ext4 file system on a loop device, mounted ``strictatime`` under
    ``tmp_path``: (its mount point); unmounted and detached at the end."""
    backing = make_image(tmp_path / "fs.raw", size)
    subprocess.run([require_tool("mkfs.ext4"), "-q", "-F", backing], check=True)
    dev = subprocess.run([require_tool("losetup"), "--find", "--show", backing], check=True,
                         capture_output=True, text=True).stdout.strip()
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:
        subprocess.run([require_tool("mount"), "-t", "ext4", "-o", "strictatime", dev,
                        str(mnt)], check=True)
        try:
            yield mnt
        finally:
            subprocess.run([require_tool("umount"), str(mnt)], check=True)
    finally:
        subprocess.run([require_tool("losetup"), "-d", dev], check=True)


def descriptors_on(pid: int, st: os.stat_result) -> dict[int, int]:
    """fd -> flags of the descriptors of ``pid`` open on the file of ``st``."""
    out = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            got = os.stat(f"/proc/{pid}/fd/{fd}")
            with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                flags = int(f.read().split("flags:")[1].split()[0], 8)
        except (OSError, IndexError, ValueError):
            continue                              # closed meanwhile
        if (got.st_dev, got.st_ino) == (st.st_dev, st.st_ino):
            out[int(fd)] = flags
    return out


def advise(image: str, cache: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "vmdisktouch", "advise", image,
                             "--duration", f"{RUN_S}", "--cache", cache, "--save", ""],
                            cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_every_descriptor_on_an_image_has_o_noatime_and_its_atime_stays(tmp_path):
    with strictatime_ext4(tmp_path) as mnt:
        image = make_image(mnt / "disk.raw", 48 * MiB, sparse=False)
        evict(image)
        st = os.stat(image)
        assert st.st_uid == os.geteuid()           # the owner: O_NOATIME is permitted
        # the file system moves atime on every read (strictatime): a control read
        probe = make_image(mnt / "control.raw", MiB, sparse=False)
        before = os.stat(probe).st_atime_ns
        time.sleep(0.01)
        with open(probe, "rb") as f:
            f.read(4096)
        assert os.stat(probe).st_atime_ns != before, "the mount does not update atime"

        atime = os.stat(image).st_atime_ns
        seen: dict[str, dict[int, int]] = {"run": {}, "advise writethrough": {},
                                           "advise none": {}}
        d = DaemonProc(tmp_path, image, "--uri", "", max_hold="16M", interval=1)
        procs = {}
        try:
            d.wait_status(lambda s: (s.get("miss_cost") or {}).get("probes", 0) > 0,
                          "a miss probe of the daemon")
            procs = {"advise writethrough": advise(image, "writethrough"),
                     "advise none": advise(image, "none")}
            pids = {"run": d.pid, **{k: p.pid for k, p in procs.items()}}
            deadline = time.monotonic() + RUN_S
            while time.monotonic() < deadline:
                for who, pid in pids.items():
                    if who == "run" or procs[who].poll() is None:
                        seen[who].update(descriptors_on(pid, st))
                time.sleep(0.5)
            results = {k: p.communicate(timeout=60) + (p.returncode,)
                       for k, p in procs.items()}
            status = d.read_status()
        finally:
            for p in procs.values():
                if p.poll() is None:
                    p.kill()
                    p.wait()
            d.stop()
        for who, (out, err, rc) in results.items():
            assert rc in (0, 3), f"{who}: exit {rc}: {err[-2000:]}"
            assert "Traceback" not in err, err[-2000:]
        assert (status.get("miss_cost") or {}).get("probes", 0) >= 8, status
        for who, fds in seen.items():
            assert fds, f"{who} held no descriptor on the image"
            bare = {fd: f"{flags:o}" for fd, flags in fds.items() if not flags & O_NOATIME}
            assert not bare, f"{who} holds descriptors on the image without O_NOATIME " \
                             f"(fd: flags): {bare}"
        for who in ("run", "advise writethrough"):         # the miss probes' own
            assert any(f & os.O_DIRECT for f in seen[who].values()), (who, seen[who])
        assert os.stat(image).st_atime_ns == atime, "the image's atime moved"
