"""Arriving without losing trace events (issue 40): when QEMU takes a VM in (a restore, a
migration) it drops the image from the page cache with one ``POSIX_FADV_DONTNEED`` over
the whole file (FIELD-NOTES, turn 4), which deletes every cached page the daemon does not
hold in one system call on one CPU. The daemon sizes its trace buffer for that burst
beforehand (``TraceSource.brace``), so none of it is lost.

A 1 GiB data image with saved heat over 512 MiB and a 256M budget: the daemon's first
cycle holds 256 MiB and spills (reads unlocked) the next 256 MiB, 65,536 pages, far more
delete events than the default 1 MiB per-CPU buffer keeps. Then the image is dropped from
outside as QEMU does; the status must show no event lost, and its ``trace.lost_at`` none.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from tests.pagecache import data_image
from tools.daemon_proc import DaemonProc
from tools.images import evict, resident_bytes
from vmdisktouch.adapters import warm_state
from vmdisktouch.system.image import open_image

MiB = 1 << 20
HOT = (256 * MiB, 512 * MiB)


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
    img = open_image(str(image))
    try:
        heat = np.zeros(img.block_count(MiB), dtype=np.float32)
        heat[HOT[0] // MiB:(HOT[0] + HOT[1]) // MiB] = 1.0
        warm_state.save(str(state), img, MiB, heat, np.zeros_like(heat), [], time.time())
    finally:
        img.close()
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
        assert st["cycle"] == cycle + 1 and st["trace"]["events"]["delete"] >= 60_000, \
            st["trace"]             # the spilled 256 MiB deleted, one event per page
        assert st["trace"]["buffer_kb"] > 1024, st["trace"]
    finally:
        assert d.stop() == 0, d.output()[-3000:]
