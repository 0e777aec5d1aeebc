"""Arriving without losing trace events (issue 40): when QEMU takes a VM in (a restore, a
migration) it drops the image from the page cache with one ``POSIX_FADV_DONTNEED`` over
the whole file (FIELD-NOTES, turn 4), which deletes every cached page the daemon does not
hold in one system call on one CPU. The daemon sizes its trace buffer for that burst
beforehand (``TraceSource.brace``), so none of it is lost.

A 1 GiB data image with saved heat over 512 MiB and a 256M budget: the daemon's first
cycle holds 256 MiB and spills (reads unlocked) the next 256 MiB, 65,536 pages, far more
delete events than the default 1 MiB per-CPU buffer keeps. Then the image is dropped from
outside as QEMU does; the status must show no event lost, and its ``trace.lost_at`` none.

The same through a real ``virsh restore`` (a libvirtd of the test's own,
``tests.support.private_libvirt.PrivateLibvirtd``): a host service with the trace source serves the
domain's 1 GiB image with the same saved heat and budget (256 MiB held, 256 MiB spilled);
``virsh save`` (the disk is closed, its 512 MiB left cached); ``virsh restore`` from a FIFO
fed over 4 s, so the host service opens the arriving disk and runs cycles on it before
QEMU's drop at the end of the incoming. The arrival's trace instance may lose no more
events than the same daemon's cold start on that image did (measured first: none).
The daemons run this checkout's code, or the tree in ``VDT_ARRIVAL_TREE`` (a ``git
worktree`` of 550c5fe, the code before issue 40: there the restore loses tens of thousands).
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid

import numpy as np
import pytest

from tests.support.arrival_env import SlowFeed, vsh
from tests.support.libvirt_env import PREFIX, disk_xml, domain_xml, libvirt_daemons  # noqa: F401
from tests.support.pagecache import data_image
from tests.support.private_libvirt import own_libvirtd  # noqa: F401
from tests.support.common import ROOT
from tests.support.daemon_proc import DaemonProc
from tests.support.images import evict, resident_bytes
from vmdisktouch.adapters import warm_state
from vmdisktouch.system.image import open_image

MiB = 1 << 20
HOT = (256 * MiB, 512 * MiB)
TREE = os.environ.get("VDT_ARRIVAL_TREE", ROOT)
FEED_SECONDS = 4.0


def save_heat(image, state) -> None:
    """Saved heat (``warm_state``) over ``HOT``: the daemon's first selection wants it."""
    img = open_image(str(image))
    try:
        heat = np.zeros(img.block_count(MiB), dtype=np.float32)
        heat[HOT[0] // MiB:(HOT[0] + HOT[1]) // MiB] = 1.0
        warm_state.save(str(state), img, MiB, heat, np.zeros_like(heat), [], time.time())
    finally:
        img.close()


def drop_as_qemu_does(path) -> None:
    """``raw_co_invalidate_cache``: fdatasync, then DONTNEED over the whole image."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


@pytest.mark.timeout(180)
def test_the_arrival_s_cache_drop_loses_no_trace_event(tmp_path):
    image = data_image(tmp_path / "disk.img", 1024 * MiB)
    state = tmp_path / "state"
    save_heat(image, state)
    evict(image)
    d = DaemonProc(tmp_path, image, "--max-hold", "256M", "--min-free", "0", "--uri", "",
                   "--interval", "2", "--access-source", "trace", "--state-dir", str(state))
    try:
        st = d.wait_status(lambda s: s["held_bytes"] >= 250 * MiB and
                           s["spill"]["read_bytes"] + s["cycle"] > 1, "held and spilled",
                           timeout=60)
        cached = resident_bytes(str(image))
        assert cached >= 500 * MiB, f"only {cached >> 20} MiB cached: nothing to delete"
        drop_as_qemu_does(str(image))
        assert resident_bytes(str(image)) <= st["held_bytes"] + 8 * MiB
        cycle = st["cycle"]
        st = d.wait_status(lambda s: s["cycle"] > cycle, "the cycle after the drop",
                           timeout=60)
        assert st["events_lost"] == 0 and st["trace"].get("lost_at", 0) is None, st["trace"]
        assert st["trace"].get("lost_at_start", 0) == 0, st["trace"]     # none at start either
        assert st["cycle"] == cycle + 1 and st["trace"]["events"]["delete"] >= 60_000, \
            st["trace"]             # the spilled 256 MiB deleted, one event per page
        assert st["trace"]["buffer_kb"] > 1024, st["trace"]
    finally:
        assert d.stop() == 0, d.output()[-3000:]


def disk_status(st, path) -> dict | None:
    return next((d for d in st.get("disks", []) if d["path"] == path), None)


@pytest.mark.timeout(300)
def test_a_real_restore_loses_no_more_trace_events_than_a_cold_start(tmp_path, own_libvirtd):
    lv = own_libvirtd
    image = str(data_image(tmp_path / "disk.img", 1024 * MiB))
    work = tmp_path / "host"
    work.mkdir()
    state = work / "state"
    save_heat(image, state)
    evict(image)
    dom = f"{PREFIX}lossless-{uuid.uuid4().hex[:8]}"
    xml = tmp_path / f"{dom}.xml"
    xml.write_text(domain_xml(dom, [disk_xml("vda", image)]))   # QEMU unchecked
    vsh(lv.uri, "define", str(xml))
    vsh(lv.uri, "start", dom, "--paused")
    d = DaemonProc(work, [], "--libvirt", "--uri", lv.uri, "--carry-heat", "off",
                   "--min-free", "0", "--state-dir", str(state), "--access-source", "trace",
                   max_hold="256M", interval=1, status="host.json", cwd=TREE)
    try:
        # the cold start: the saved heat held and spilled (the spill's figure is its cycle's
        # only, so what it left cached is waited for), then two more cycles
        st = d.wait_status(lambda s: (disk_status(s, image) or {}).get("held_bytes", 0)
                           >= 250 * MiB and disk_status(s, image)["resident_bytes"] >= 500 * MiB,
                           "held and spilled", timeout=60)
        cycle = disk_status(st, image)["cycle"]
        st = d.wait_status(lambda s: (disk_status(s, image) or {}).get("cycle", 0) >= cycle + 2,
                           "two cycles more", timeout=30)
        cold = disk_status(st, image)
        assert cold["access_source"] == "trace", cold
        cached = resident_bytes(image)
        assert cached >= 500 * MiB, f"only {cached >> 20} MiB cached: nothing to delete"
        saved = tmp_path / "dom.save"
        vsh(lv.uri, "save", dom, str(saved))
        d.wait_status(lambda s: disk_status(s, image) is None, "the saved domain's disk closed",
                      timeout=30)
        cached = resident_bytes(image)
        assert cached >= 500 * MiB, f"only {cached >> 20} MiB cached after the save"
        feed = SlowFeed(saved, tmp_path / "dom.fifo", FEED_SECONDS)
        seen: dict[int, dict] = {}          # the arriving disk's statuses, by cycle
        restore = subprocess.Popen(["virsh", "-c", lv.uri, "restore", str(feed.path),
                                    "--paused"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True)
        try:
            while restore.poll() is None:
                st = d.read_status() or {}
                if (disk := disk_status(st, image)) is not None:
                    seen[disk["cycle"]] = disk
                assert d.alive(), d.output()[-3000:]
                time.sleep(0.005)    # a cycle's status may last 50 ms
            _, err = restore.communicate()
        finally:
            if restore.poll() is None:
                restore.kill()
                restore.wait()
            feed.join()
        assert restore.returncode == 0, f"virsh restore: {err.strip()}\n{d.log_tail(20)}"
        assert seen, f"the host service never served the arriving disk\n{d.log_tail(20)}"
        assert max(x["resident_bytes"] for x in seen.values()) >= 500 * MiB, \
            f"the arriving disk's trace did not start before QEMU's drop\n{d.log_tail(20)}"
        dropped = resident_bytes(image)
        # two of the disk's cycles after the restore: the drop's events drained
        last = max(seen) + 2
        deadline = time.monotonic() + 30
        while True:
            if (disk := disk_status(d.read_status() or {}, image)) is not None:
                seen[disk["cycle"]] = disk
                if disk["cycle"] >= last:
                    break
            assert d.alive(), d.output()[-3000:]
            assert time.monotonic() < deadline, f"no cycle {last}: {disk}\n{d.log_tail(20)}"
            time.sleep(0.005)    # a cycle's status may last 50 ms
        deleted = sum(s["trace"].get("events", {}).get("delete", 0) for s in seen.values())
        # every loss, the start's sizing's included (``trace.lost_at_start``)
        lost, cold_lost = (x["events_lost"] + x["trace"].get("lost_at_start", 0)
                           for x in (disk, cold))
        assert lost <= cold_lost, \
            f"the restore lost {lost} trace events (a cold start: {cold_lost}); " \
            f"buffer {disk['trace']['buffer_kb']} KiB, cached {dropped >> 20} MiB just after" \
            f" the restore, {deleted} deletes seen\n{d.log_tail(20)}"
        assert cold_lost > 0 or disk["trace"].get("lost_at") is None, disk["trace"]
        # the drop deleted the 512 MiB left cached, traced: its cycle's status is seen, unless
        # the next cycle came too soon after it (a cycle skipped: the figures above stand)
        missed = set(range(min(seen), max(seen) + 1)) - set(seen)
        cycles = {c: (x["trace"].get("events"), x["resident_bytes"]) for c, x in seen.items()}
        assert deleted >= 100_000 or missed, \
            f"only {deleted} deletes seen over the arrival (cycle: events, resident: " \
            f"{cycles}): QEMU's drop of the 512 MiB left cached was not traced\n" \
            f"{d.log_tail(20)}"
    finally:
        assert d.stop() == 0, d.output()[-3000:]
