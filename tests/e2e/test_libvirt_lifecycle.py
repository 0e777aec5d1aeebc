"""The libvirt side of the daemon against a real libvirtd: owner look-up, the eligibility
check, the lifecycle watcher, and guest-like I/O through libvirt's own QEMU.

Domains are started paused (no guest OS); I/O is driven with ``virsh
qemu-monitor-command --hmp 'qemu-io -d ...'``. Residency is measured right
after the I/O (the kernel here pages idle cache out on its own, FIELD-NOTES).
"""

from __future__ import annotations

import os
import stat
import subprocess
import threading

import pytest

from tests.libvirt_env import (URI, disk_xml, domains, libvirt_daemons,  # noqa: F401
                               qemu_io, restart_libvirtd, started_libvirtd, virsh)
from tests.pagecache import PAGE, data_image, evict, fincore_pages
from vmdisktouch.adapters import lifecycle
from vmdisktouch.adapters import libvirt_disks as ld

MiB = 1 << 20


def image(path, size=32 * MiB) -> str:
    return data_image(path, size)


@pytest.fixture
def conn(libvirt_daemons):  # noqa: F811
    c = ld.connect(URI)
    yield c
    c.close()


# -- owner look-up ------------------------------------------------------------


def test_find_disk_owner_by_path_symlink_and_hard_link(domains, conn, tmp_path):  # noqa: F811
    img = image(tmp_path / "vm.raw")
    name = domains.define([disk_xml("vda", img)], start=False, tag="owner")
    link = tmp_path / "link.raw"
    link.symlink_to(img)
    hard = tmp_path / "hard.raw"
    os.link(img, hard)
    for p in (img, str(link), str(hard)):
        found = ld.find_disk_owner(conn, p)
        assert found is not None, p
        dom, disk = found
        assert dom.name() == name and disk.target == "vda" and disk.source == img
        assert (disk.state, disk.active) == ("shutoff", False)
    assert ld.find_disk_owner(conn, image(tmp_path / "other.raw")) is None


def test_find_disk_owner_of_a_block_device_by_device_number(domains, conn, tmp_path):  # noqa: F811
    backing = image(tmp_path / "backing.raw")
    loop = subprocess.run(["losetup", "-f", "--show", backing], check=True, capture_output=True,
                          text=True).stdout.strip()
    try:
        name = domains.define([disk_xml("vda", loop, dtype="block")], start=False, tag="blk")
        alias = tmp_path / "alias-node"      # another device node: other path, same st_rdev
        os.mknod(alias, 0o600 | stat.S_IFBLK, os.stat(loop).st_rdev)
        dom, disk = ld.find_disk_owner(conn, str(alias))
        assert dom.name() == name and disk.type == "block" and disk.source == loop
        assert ld.find_disk_owner(conn, backing) is None   # the file under it is not the disk
    finally:
        subprocess.run(["losetup", "-d", loop], check=False)


# -- eligibility check for `run` ------------------------------------------------


def test_check_eligible(domains, tmp_path):  # noqa: F811
    good = image(tmp_path / "wt.raw")
    bad = image(tmp_path / "none.raw")
    domains.define([disk_xml("vda", good, cache="writethrough"),
                    disk_xml("vdb", bad, cache="none")], start=False, tag="elig")
    ok, reason = lifecycle.check_eligible(good, URI)
    assert ok and "cache=writethrough" in reason
    ok, reason = lifecycle.check_eligible(bad, URI)
    assert not ok and "cache=none" in reason and "O_DIRECT" in reason
    assert lifecycle.check_eligible(image(tmp_path / "free.raw"), URI) is None
    assert lifecycle.check_eligible(good, "qemu:///nonexistent") is None   # unreachable: as before

    lifecycle.require_eligible(good, URI)
    with pytest.raises(lifecycle.IneligibleDiskError) as e:
        lifecycle.require_eligible(bad, URI)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{bad}: domain ") and "cache=none" in msg
    assert "--force" in msg
    lifecycle.require_eligible(bad, URI, force=True)


# -- the lifecycle watcher ----------------------------------------------------------


def wait_for(watcher, wake, value, timeout=15.0):
    """Wait until domain_active() == value; the wake event must fire on the change."""
    woke = wake.wait(timeout)
    wake.clear()
    assert woke, f"wake event not set; domain_active() is {watcher.domain_active()}"
    assert watcher.domain_active() is value


def test_watcher_follows_destroy_and_start(domains, tmp_path):  # noqa: F811
    img = image(tmp_path / "vm.raw")
    name = domains.define([disk_xml("vda", img)], tag="watch")
    wake = threading.Event()
    # poll_interval is long: only the lifecycle events can be this quick.
    with lifecycle.LifecycleWatcher(img, URI, wake=wake, poll_interval=600) as w:
        assert w.domain_active() is True and w.domains == [name]
        wake.clear()
        virsh("destroy", name)
        wait_for(w, wake, False)
        virsh("start", name, "--paused")
        wait_for(w, wake, True)
        virsh("destroy", name)
        wait_for(w, wake, False)
        virsh("undefine", name)           # the owner vanished: still "not running"
        assert not wake.wait(2.0)
        assert w.domain_active() is False


def test_watcher_sees_a_domain_defined_later(domains, tmp_path):  # noqa: F811
    img = image(tmp_path / "vm.raw")
    wake = threading.Event()
    with lifecycle.LifecycleWatcher(img, URI, wake=wake, poll_interval=600) as w:
        assert w.domain_active() is None and w.domains == []   # not under libvirt
        name = domains.define([disk_xml("vda", img)], tag="late")
        wait_for(w, wake, True)
        assert w.domains == [name]


def test_watcher_for_a_disk_not_under_libvirt(libvirt_daemons, tmp_path):  # noqa: F811
    with lifecycle.LifecycleWatcher(image(tmp_path / "free.raw"), URI) as w:
        assert w.domain_active() is None
    with lifecycle.LifecycleWatcher(image(tmp_path / "x.raw"), "qemu:///nonexistent",
                                    retry_interval=0.2) as w:
        assert w.domain_active() is None


def test_watcher_reconnects_after_libvirtd_restarts(domains, tmp_path):  # noqa: F811
    if started_libvirtd() is None:
        pytest.skip("libvirtd was already running before the tests: not restarting a "
                    "daemon these tests do not own")
    img = image(tmp_path / "vm.raw")
    name = domains.define([disk_xml("vda", img)], tag="reconnect")
    wake = threading.Event()
    with lifecycle.LifecycleWatcher(img, URI, wake=wake, poll_interval=600,
                                    retry_interval=0.5) as w:
        assert w.domain_active() is True
        wake.clear()
        restart_libvirtd(tmp_path)
        assert w.domain_active() is True     # kept across the outage
        assert not wake.is_set()
        virsh("destroy", name)               # seen only through the new connection
        wait_for(w, wake, False)


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
