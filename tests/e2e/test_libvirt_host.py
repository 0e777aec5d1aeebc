"""`vmdisktouch run --libvirt` against a real libvirtd: every eligible disk of every running
domain served under one budget and followed live (start, destroy, save, restore, QEMU's own
shutdown, hot-plug, unplug), the
ineligible ones listed with their reason, the budget never exceeded (VmLck every 0.2 s);
the resync finds a change without any event; a second daemon is refused on a served image."""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.support.libvirt_env import (URI, VmLck, disk_xml, domain_state,  # noqa: F401
                               domains, libvirt_daemons, qemu_io, virsh)
from tests.support.pagecache import data_image
from tests.support.daemon_proc import DaemonProc
from vmdisktouch.adapters.libvirt.libvirt_watch import LibvirtWatch, wanted
from vmdisktouch.system import image_lock
from vmdisktouch.unitname import escape_path

MiB = 1 << 20
INTERVAL = 1.0


def served(status) -> set[str]:
    return {d["path"] for d in status["host"]["disks"]}


@pytest.mark.timeout(300)
def test_domains_and_disks_are_followed_live_under_one_budget(domains, tmp_path):  # noqa: F811
    a1, a2, b1, plug = (data_image(tmp_path / f"{n}.raw", 32 * MiB)
                        for n in ("a1", "a2", "b1", "plug"))
    direct = data_image(tmp_path / "direct.raw", 8 * MiB)
    iso = data_image(tmp_path / "install.iso", 8 * MiB)
    dom_a = domains.define([disk_xml("vda", a1), disk_xml("vdb", a2),
                            disk_xml("vdc", direct, cache="none", io="native"),
                            disk_xml("sda", iso, device="cdrom", readonly=True)], tag="hostA")
    dom_b = domains.define([disk_xml("vda", b1)], start=False, tag="hostB")
    d = DaemonProc(tmp_path, [], "--libvirt", "--uri", URI, "--min-free", "0",
                   "--interval", str(INTERVAL), max_hold="24M", status="host.json")
    lck = VmLck(d)
    try:
        st = d.wait_status(lambda s: {a1, a2} <= served(s), "domain A's disks", timeout=60)
        assert not served(st) & {direct, iso, b1}
        skipped = {(x["domain"], x["target"]): x["reason"] for x in st["host"]["skipped"]}
        assert "O_DIRECT" in skipped[(dom_a, "vdc")] and "read-only" in skipped[(dom_a, "sda")]

        qemu_io(dom_a, "read 0 16M")                     # the guest reads: something is held
        d.wait_status(lambda s: s["host"]["held_bytes"] > 0, "a hold", timeout=30)

        t0 = time.monotonic()
        virsh("start", dom_b, "--paused")
        d.wait_status(lambda s: b1 in served(s), "domain B started", timeout=30)
        assert time.monotonic() - t0 <= INTERVAL + 3          # within a cycle (+ start-up)

        virsh("attach-disk", dom_a, plug, "sdb", "--targetbus", "usb", "--driver", "qemu",
              "--subdriver", "raw", "--cache", "writethrough", "--live")
        d.wait_status(lambda s: plug in served(s), "the hot-plugged disk", timeout=30)
        virsh("detach-disk", dom_a, "sdb", "--live")
        d.wait_status(lambda s: plug not in served(s), "the unplugged disk", timeout=30)

        t0 = time.monotonic()
        virsh("destroy", dom_b)
        st = d.wait_status(lambda s: b1 not in served(s), "domain B destroyed", timeout=30)
        assert time.monotonic() - t0 <= INTERVAL + 3
        assert {a1, a2} <= served(st) and st["host"]["failed"] == []

        second = DaemonProc(tmp_path, a1, "--uri", "", max_hold="8M", status="second.json",
                            log="second.log")
        second.proc.wait(30)
        assert second.returncode() == 78 and f"pid {d.pid}" in second.output()
    finally:
        lck.stop.set()
        assert d.stop() == 0, d.output()[-3000:]
    assert lck.worst <= 24 * MiB, lck.worst
    out = d.output()
    assert "serving" in out and "no running domain uses it any more" in out


@pytest.mark.timeout(240)
def test_a_domain_saved_or_shut_down_by_qemu_is_released_and_a_restored_one_served(
        domains, tmp_path):  # noqa: F811
    """The stops that are not a destroy: ``virsh managedsave`` (what libvirt-guests does
    at host shutdown; libvirt's STOPPED event, detail SAVED) and QEMU shutting down on
    its own (QMP ``quit``: a SHUTDOWN event, then the process exits, as when the guest
    powers off). Restoring the saved domain (``virsh start``) serves its disk again."""
    img = data_image(tmp_path / "c.raw", 16 * MiB)
    name = domains.define([disk_xml("vda", img)], tag="stops")
    d = DaemonProc(tmp_path, [], "--libvirt", "--uri", URI, "--min-free", "0",
                   "--interval", str(INTERVAL), max_hold="8M", status="host.json")
    try:
        d.wait_status(lambda s: img in served(s), "the domain's disk", timeout=60)
        qemu_io(name, "read 0 8M")
        d.wait_status(lambda s: s["host"]["held_bytes"] > 0, "a hold", timeout=30)

        t0 = time.monotonic()
        virsh("managedsave", name)
        st = d.wait_status(lambda s: img not in served(s), "the saved domain", timeout=30)
        assert time.monotonic() - t0 <= INTERVAL + 3 and st["host"]["held_bytes"] == 0
        assert domain_state(name) == "shut off"

        virsh("start", name)                              # restored from the save, paused
        d.wait_status(lambda s: img in served(s), "the restored domain", timeout=30)

        t0 = time.monotonic()
        # QEMU exits before it answers: virsh reports the monitor's reset, not a failure
        virsh("qemu-monitor-command", name, '{"execute": "quit"}', check=False)
        st = d.wait_status(lambda s: img not in served(s), "QEMU shut down", timeout=30)
        assert time.monotonic() - t0 <= INTERVAL + 3 and st["host"]["held_bytes"] == 0
        assert domain_state(name) == "shut off"
    finally:
        assert d.stop() == 0, d.output()[-3000:]


def test_the_resync_finds_a_started_domain_with_no_event(domains, tmp_path):  # noqa: F811
    img = data_image(tmp_path / "quiet.raw", 8 * MiB)
    name = domains.define([disk_xml("vda", img)], start=False, tag="resync")
    f = LibvirtWatch(URI, wake=None)                    # nobody listens to the events
    try:
        assert img not in wanted(f.disks()).serve
        virsh("start", name, "--paused")
        assert wanted(f.disks()).serve[img].domain == name   # the next cycle's resync
        virsh("destroy", name)
        assert img not in wanted(f.disks()).serve
    finally:
        f.close()


@pytest.mark.timeout(120)
def test_per_domain_and_per_disk_overrides_from_the_config(domains, tmp_path):  # noqa: F811
    c1, c2 = (data_image(tmp_path / f"{n}.raw", 16 * MiB) for n in ("c1", "c2"))
    name = domains.define([disk_xml("vda", c1), disk_xml("vdb", c2)], tag="override")
    conf = tmp_path / "host.toml"
    conf.write_text(f'max_hold = "24M"\n[domain."{name}"]\ncap = "4M"\nweight = 3\n'
                    f'[domain."{name}".vdb]\nexclude = true\n')
    d = DaemonProc(tmp_path, [], "--libvirt", "--uri", URI, "--min-free", "0",
                   "--interval", str(INTERVAL), "--config", conf, status="host.json")
    try:
        st = d.wait_status(lambda s: c1 in served(s), "vda served", timeout=60)
        assert c2 not in served(st)
        skipped = {(x["domain"], x["target"]): x["reason"] for x in st["host"]["skipped"]}
        assert skipped[(name, "vdb")] == "excluded by the config file"
        [disk] = [x for x in st["host"]["disks"] if x["path"] == c1]
        assert disk["cap_bytes"] == 4 * MiB and disk["weight"] == 3.0
        qemu_io(name, "read 0 12M")
        st = d.wait_status(lambda s: s["host"]["held_bytes"] > 0, "a hold", timeout=30)
        time.sleep(3 * INTERVAL)
        st = d.read_status()
        assert 0 < [x for x in st["host"]["disks"] if x["path"] == c1][0]["held_bytes"] <= 4 * MiB
    finally:
        assert d.stop() == 0, d.output()[-3000:]


@pytest.mark.timeout(300)
def test_a_disk_no_longer_served_takes_its_pictures_and_lock_along(domains, tmp_path):  # noqa: F811
    """Unplugged, its domain destroyed, excluded at a reload: a disk's PNGs and its lock
    file go with it; at the daemon's stop every disk's PNGs go, the status file stays."""
    a1, a2, b1, plug = (data_image(tmp_path / f"{n}.raw", 16 * MiB)
                        for n in ("a1", "a2", "b1", "plug"))
    dom_a = domains.define([disk_xml("vda", a1), disk_xml("vdb", a2)], tag="picsA")
    dom_b = domains.define([disk_xml("vda", b1)], tag="picsB")
    conf = tmp_path / "host.toml"
    conf.write_text('max_hold = "24M"\n')
    pngs = tmp_path / "png"
    pngs.mkdir()
    d = DaemonProc(tmp_path, [], "--libvirt", "--uri", URI, "--min-free", "0",
                   "--interval", str(INTERVAL), "--config", conf, "--map-png",
                   pngs / "{disk}.map.png", "--heat-png", pngs / "{disk}.heat.png",
                   status="host.json")

    def pictures(path) -> list:
        return [pngs / f"{escape_path(path)}.{k}.png" for k in ("map", "heat")]

    def locks(path) -> list:
        return [n for n in os.listdir(image_lock.lock_dir())
                if n == image_lock.lock_name(os.stat(path))]

    def drawn(*paths):
        return lambda s: (set(paths) <= served(s)
                          and all(p.exists() for x in paths for p in pictures(x)))

    try:
        d.wait_status(drawn(a1, a2, b1), "every disk drawn", timeout=60)
        assert all(locks(x) for x in (a1, a2, b1))
        virsh("attach-disk", dom_a, plug, "sdb", "--targetbus", "usb", "--driver", "qemu",
              "--subdriver", "raw", "--cache", "writethrough", "--live")
        d.wait_status(drawn(plug), "the hot-plugged disk drawn", timeout=30)
        virsh("detach-disk", dom_a, "sdb", "--live")
        d.wait_status(lambda s: plug not in served(s), "the unplugged disk", timeout=30)
        assert [p for p in pictures(plug) if p.exists()] == [] and locks(plug) == []

        virsh("destroy", dom_b)
        d.wait_status(lambda s: b1 not in served(s), "domain B destroyed", timeout=30)
        assert [p for p in pictures(b1) if p.exists()] == [] and locks(b1) == []

        conf.write_text(f'max_hold = "24M"\n[domain."{dom_a}".vdb]\nexclude = true\n')
        d.signal(signal.SIGHUP)
        d.wait_status(lambda s: a2 not in served(s), "vdb excluded at the reload", timeout=30)
        assert [p for p in pictures(a2) if p.exists()] == [] and locks(a2) == []
        assert all(p.exists() for p in pictures(a1))
    finally:
        assert d.stop() == 0, d.output()[-3000:]
    assert sorted(os.listdir(pngs)) == [] and locks(a1) == []
    assert d.read_status() is not None                    # the status file stays
