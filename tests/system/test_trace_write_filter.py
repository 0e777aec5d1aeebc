"""The WRITE event's filter: the bdi name besides the inode number, on real file systems.

``writeback:writeback_dirty_folio`` has no ``s_dev``, only ``ino`` and the bdi name
(``name``), so two ext4 file systems on two loop devices, each with a file of the
same inode number (a fresh ext4's first file is inode 12), tell whether a write
to the other one is taken for ours. The bdi the reader resolves (``bdi.name_of``)
is checked against the name the kernel itself reports for the image's writes (the
instance's ``trace`` file), for a file and for a block device, each on a whole
loop device and on a partition of one. Loop devices and mounts are the tests'
own, unmounted and detached at teardown, pass or fail.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import types

import pytest

from tests.support.common import require_tool
from tests.support.images import evict, make_image
from tests.support.tracing import PAGE, instance_name, tracefs_root  # noqa: F401
from vmdisktouch.system.trace import trace_reader
from vmdisktouch.system.trace.trace_reader import WRITE, TraceReader

MiB = 1 << 20


@pytest.fixture
def devices(tmp_path):
    """``loop(partitioned)``: a new loop device (its partition when ``partitioned``);
    ``ext4(dev)``: an ext4 made on it and mounted, its mount point. All unmounted and
    detached at teardown. The partition is added by ``addpart`` (BLKPG), from 1 MiB to
    the end: this kernel reads no partition table (no CONFIG_MSDOS_PARTITION)."""
    losetup, umount = require_tool("losetup"), require_tool("umount")
    loops: list[str] = []
    mounts: list[str] = []

    def loop(partitioned: bool = False) -> str:
        backing = make_image(tmp_path / f"loop{len(loops)}.raw", 32 * MiB)
        loops.append(subprocess.run([losetup, "--find", "--show", "--partscan", backing],
                                    check=True, capture_output=True, text=True).stdout.strip())
        if not partitioned:
            return loops[-1]
        subprocess.run([require_tool("addpart"), loops[-1], "1", "2048", str(31 * MiB // 512)],
                       check=True)
        assert os.path.exists(loops[-1] + "p1")
        return loops[-1] + "p1"

    def ext4(dev: str) -> str:
        subprocess.run([require_tool("mkfs.ext4"), "-q", dev], check=True)
        where = tmp_path / f"mnt{len(mounts)}"
        where.mkdir()
        subprocess.run([require_tool("mount"), dev, str(where)], check=True)
        mounts.append(str(where))
        return str(where)

    yield types.SimpleNamespace(loop=loop, ext4=ext4)
    try:
        for where in reversed(mounts):
            subprocess.run([umount, where], check=True)
    finally:
        for dev in loops:
            subprocess.run([losetup, "-d", dev], check=True)


def data_file(path: str, pages: int = 16) -> str:
    """A file of ``pages`` pages, written back and out of the page cache (clean)."""
    with open(path, "wb") as f:
        f.write(os.urandom(pages * PAGE))
    evict(path)
    return path


def writes(events) -> list[int]:
    return events.first[events.kind == WRITE].tolist()


def kernel_writes(root: str, r: TraceReader) -> list[tuple[str, int]]:
    """(bdi name, page) of each WRITE buffered in the reader's instance, as the kernel
    prints them (its ``trace`` file, which reads without consuming)."""
    with open(os.path.join(root, "instances", r.name, "trace")) as f:
        return [(m[1], int(m[2])) for m in re.finditer(
            r"writeback_dirty_folio: bdi (\S+): ino=\d+ index=(\d+)", f.read())]


def dev_name(path: str) -> str:
    rdev = os.stat(path).st_rdev
    return f"{os.major(rdev)}:{os.minor(rdev)}"


def test_a_write_to_the_same_inode_number_on_another_file_system_is_not_ours(devices,
                                                                             tracefs_root):
    ours, other = (data_file(f"{devices.ext4(devices.loop())}/img.raw") for _ in range(2))
    assert os.stat(ours).st_ino == os.stat(other).st_ino == 12
    assert os.stat(ours).st_dev != os.stat(other).st_dev
    fd = os.open(ours, os.O_RDWR)
    ofd = os.open(other, os.O_RDWR)
    r = TraceReader(fd, name=instance_name())
    try:
        r.drain()
        os.pwrite(ofd, b"o" * PAGE, 3 * PAGE)          # dirties a clean page of the other
        os.fdatasync(ofd)
        assert writes(r.drain()) == []
        os.pwrite(fd, b"m" * PAGE, 5 * PAGE)
        os.fdatasync(fd)
        assert writes(r.drain()) == [5]
    finally:
        r.close()
        os.close(fd)
        os.close(ofd)


@pytest.mark.parametrize("partitioned", [False, True], ids=["disk", "partition"])
@pytest.mark.parametrize("kind", ["file", "block"])
def test_the_bdi_resolved_is_the_one_the_kernel_names(devices, tracefs_root, kind, partitioned):
    """A file on ext4 and a block device (the loop device itself, or its partition): the
    bdi is the whole loop device's; a write through another fd is counted."""
    dev = devices.loop(partitioned)
    path = data_file(f"{devices.ext4(dev)}/img.raw") if kind == "file" else dev
    fd = os.open(path, os.O_RDONLY)
    wfd = os.open(path, os.O_RDWR)
    r = TraceReader(fd, name=instance_name())
    try:
        # The whole device: /dev/loopN of /dev/loopNp1 (not "p1" off /dev/loop1 itself).
        assert r.bdi == dev_name(dev[:-2] if partitioned else dev)
        r.drain()
        os.pwrite(wfd, b"w" * PAGE, 7 * PAGE)
        os.fdatasync(wfd)
        assert kernel_writes(tracefs_root, r) == [(r.bdi, 7)]
        assert writes(r.drain()) == [7]
    finally:
        r.close()
        os.close(fd)
        os.close(wfd)


def test_without_a_bdi_name_writes_are_told_by_inode_alone(devices, tracefs_root, monkeypatch,
                                                           caplog):
    """As on btrfs or NFS-like file systems whose bdi sysfs does not tell: traced still."""
    monkeypatch.setattr(trace_reader.bdi, "name_of", lambda st: None)
    path = data_file(f"{devices.ext4(devices.loop())}/img.raw")
    fd = os.open(path, os.O_RDWR)
    with caplog.at_level(logging.INFO, logger="vmdisktouch"):
        r = TraceReader(fd, name=instance_name())
    try:
        assert r.bdi is None and "writes told by inode number alone" in caplog.text
        with open(os.path.join(tracefs_root, "instances", r.name, "events",
                               trace_reader.DIRTY, "filter")) as f:
            assert f.read().strip() == f"ino == {os.stat(path).st_ino}"
        r.drain()
        os.pwrite(fd, b"w" * PAGE, 2 * PAGE)
        os.fdatasync(fd)
        assert writes(r.drain()) == [2]
    finally:
        r.close()
        os.close(fd)
