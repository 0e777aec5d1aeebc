"""The libvirt side of the daemon against a real libvirtd: owner look-up, the eligibility
check, the libvirt watch (events, resync, reconnection), and guest-like I/O through libvirt's own QEMU.

Domains are started paused (no guest OS); I/O is driven with ``virsh
qemu-monitor-command --hmp 'qemu-io -d ...'``. Residency is measured right
after the I/O (the kernel here pages idle cache out on its own, FIELD-NOTES).
"""

from __future__ import annotations

import os
import stat
import subprocess
import threading
import time

import pytest

from tests.support.libvirt_env import (URI, disk_xml, domains, libvirt_daemons,  # noqa: F401
                               qemu_io, restart_libvirtd, started_libvirtd, virsh)
from tests.support.images import evict
from tests.support.pagecache import PAGE, data_image, fincore_pages
from vmdisktouch.adapters.libvirt import libvirt_disks as ld
from vmdisktouch.adapters.libvirt import libvirt_watch as lw

MiB = 1 << 20


def image(path, size=32 * MiB) -> str:
    return data_image(path, size)


@pytest.fixture
def conn(libvirt_daemons):  # noqa: F811
    c = ld.connect(URI)
    yield c
    c.close()


# -- owner look-up ------------------------------------------------------------


def owner(conn, path):
    found = lw.owners(ld.list_disks(conn, with_units=False), path)
    return found[0] if found else None


def test_the_owner_of_a_path_a_symlink_and_a_hard_link(domains, conn, tmp_path):  # noqa: F811
    img = image(tmp_path / "vm.raw")
    name = domains.define([disk_xml("vda", img)], start=False, tag="owner")
    link = tmp_path / "link.raw"
    link.symlink_to(img)
    hard = tmp_path / "hard.raw"
    os.link(img, hard)
    for p in (img, str(link), str(hard)):
        disk = owner(conn, p)
        assert disk is not None, p
        assert disk.domain == name and disk.target == "vda" and disk.source == img
        assert (disk.state, disk.active) == ("shutoff", False)
    assert owner(conn, image(tmp_path / "other.raw")) is None


def test_the_owner_of_a_block_device_by_device_number(domains, conn, tmp_path):  # noqa: F811
    backing = image(tmp_path / "backing.raw")
    loop = subprocess.run(["losetup", "-f", "--show", backing], check=True, capture_output=True,
                          text=True).stdout.strip()
    try:
        name = domains.define([disk_xml("vda", loop, dtype="block")], start=False, tag="blk")
        alias = tmp_path / "alias-node"      # another device node: other path, same st_rdev
        os.mknod(alias, 0o600 | stat.S_IFBLK, os.stat(loop).st_rdev)
        disk = owner(conn, str(alias))
        assert disk.domain == name and disk.type == "block" and disk.source == loop
        assert owner(conn, backing) is None   # the file under it is not the disk
    finally:
        subprocess.run(["losetup", "-d", loop], check=False)


# -- eligibility check for `run` ------------------------------------------------


def test_require_eligible(domains, conn, tmp_path):  # noqa: F811
    good = image(tmp_path / "wt.raw")
    bad = image(tmp_path / "none.raw")
    domains.define([disk_xml("vda", good, cache="writethrough"),
                    disk_xml("vdb", bad, cache="none")], start=False, tag="elig")
    listed = ld.list_disks(conn, with_units=False)
    lw.require_eligible(lw.owners(listed, good), good)
    lw.require_eligible([], image(tmp_path / "free.raw"))     # not under libvirt
    with pytest.raises(lw.IneligibleDiskError) as e:
        lw.require_eligible(lw.owners(listed, bad), bad)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{bad}: domain ") and "cache=none" in msg
    assert "O_DIRECT" in msg and "--force" in msg
    lw.require_eligible(lw.owners(listed, bad), bad, force=True)


# -- the watch: events wake, the resync tells, a lost libvirtd is reconnected -------


def test_the_watch_wakes_on_lifecycle_events_and_the_resync_tells_the_state(
        domains, tmp_path):  # noqa: F811
    img = image(tmp_path / "vm.raw")
    name = domains.define([disk_xml("vda", img)], tag="watch")
    wake = threading.Event()
    watch = lw.LibvirtWatch(URI, wake=wake)
    try:
        assert owner_of(watch, img).active is True
        wake.clear()
        virsh("destroy", name)
        assert wake.wait(15.0), "no event woke the loop"
        assert owner_of(watch, img).active is False
        wake.clear()
        virsh("start", name, "--paused")
        assert wake.wait(15.0)
        assert owner_of(watch, img).active is True
    finally:
        watch.close()


def owner_of(watch, path):
    found = lw.owners(watch.disks(), path)
    return found[0] if found else None


def test_the_watch_of_an_unreachable_libvirt_says_none(libvirt_daemons):  # noqa: F811
    watch = lw.LibvirtWatch("qemu:///nonexistent")
    try:
        assert watch.disks() is None and watch.disks() is None
    finally:
        watch.close()


def test_the_watch_reconnects_after_libvirtd_restarts(domains, tmp_path):  # noqa: F811
    if started_libvirtd() is None:
        pytest.skip("libvirtd was already running before the tests: not restarting a "
                    "daemon these tests do not own")
    img = image(tmp_path / "vm.raw")
    name = domains.define([disk_xml("vda", img)], tag="reconnect")
    wake = threading.Event()
    watch = lw.LibvirtWatch(URI, wake=wake)
    try:
        assert owner_of(watch, img).active is True
        restart_libvirtd(tmp_path)
        deadline = time.monotonic() + 30
        while watch.disks() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        wake.clear()
        virsh("destroy", name)               # seen only through the new connection
        assert wake.wait(15.0), "no event through the new connection"
        assert owner_of(watch, img).active is False
    finally:
        watch.close()


# -- guest-like I/O through libvirt's QEMU ------------------------------------------


def test_qemu_io_through_libvirt_lands_in_the_page_cache(domains, tmp_path):  # noqa: F811
    img = image(tmp_path / "wt.raw")
    name = domains.define([disk_xml("vda", img, cache="writethrough")], tag="io")
    evict(img)
    before = fincore_pages(img)
    qemu_io(name, "write -P 0xab 8M 4M")
    written = fincore_pages(img) - before
    assert written >= 0.9 * 4 * MiB // PAGE, written
    with open(img, "rb") as f:
        f.seek(8 * MiB)
        assert f.read(4096) == b"\xab" * 4096

    evict(img)
    qemu_io(name, "read 16M 4M")
    assert fincore_pages(img) >= 0.9 * 4 * MiB // PAGE


def test_qemu_io_with_cache_none_bypasses_the_page_cache(domains, tmp_path):  # noqa: F811
    img = image(tmp_path / "none.raw")
    name = domains.define([disk_xml("vda", img, cache="none")], tag="direct")
    evict(img)
    qemu_io(name, "write -P 0xcd 8M 4M")
    qemu_io(name, "read 16M 4M")
    assert fincore_pages(img) < 64    # O_DIRECT: nothing of the 8 MiB goes through the cache
