"""The daemon with the trace source, as a process: its instance, its fallback, a loop
device, and a real QEMU's writes.

Where tracefs cannot be used these tests fail with the reason (the
``tracefs_root`` fixture), never skip.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest

from tests.support.images import evict
from tests.support.pagecache import data_image
from tests.support.qemu_vm import QemuVM
from tests.support.replay import disk_cycles, read_record
from tests.support.tracing import tracefs_root  # noqa: F401
from tests.support.daemon_proc import DaemonProc
from tests.support.procfs import vmlck
from vmdisktouch.system import libc
from vmdisktouch.daemon.sources import instance_name

MiB, PAGE = 1 << 20, 4096


def reader_thread(path, first, last, stop, random_access=False):
    """A guest reading [first, last) in 4 KiB steps, over and over, until ``stop``.

    ``random_access``: ``POSIX_FADV_RANDOM``, no readahead, so the pages it
    caches are single-page folios (see ``test_every_part_qemu_writes...``).
    """
    def run():
        fd = os.open(path, os.O_RDONLY)
        if random_access:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        try:
            while not stop.is_set():
                for off in range(first, last, 64 * 1024):
                    os.pread(fd, PAGE, off)
                stop.wait(0.05)
        finally:
            os.close(fd)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def instance_dir(root, image):
    return os.path.join(root, "instances", instance_name(image))


def test_sigkill_leaves_the_instance_and_the_next_start_removes_it(tmp_path, tracefs_root):  # noqa: F811
    image = data_image(tmp_path / "disk.img", 64 * MiB)
    where = instance_dir(tracefs_root, image)
    d = DaemonProc(tmp_path, image, "--uri", "", max_hold="8M", interval=0.2)
    try:
        d.wait_output("cycle 1:")
        assert os.path.isdir(where)
        assert "access source: trace" in d.output()
        os.kill(d.pid, signal.SIGKILL)              # not d.kill(): its cleanup removes it
        d.proc.wait(30)
        assert os.path.isdir(where)                 # nothing runs at a SIGKILL
    finally:
        d.cleanup()
    d = DaemonProc(tmp_path, image, "--uri", "", max_hold="8M", interval=0.2,
                   status="status2.json", log="daemon2.log")
    try:
        st = d.wait_status(lambda s: s["cycle"] >= 2, "two cycles")
        assert st["access_source"] == "trace" and os.path.isdir(where)
        assert os.listdir(os.path.join(tracefs_root, "instances")).count(
            os.path.basename(where)) == 1
        assert d.stop() == 0
        assert not os.path.exists(where)            # removed at a clean exit
    finally:
        d.cleanup()


def test_an_image_tracing_cannot_see_falls_back_to_mincore_or_is_refused(tmp_path):
    """tmpfs reads do not pass the filemap tracepoints: the start-up read finds nothing."""
    shm = "/dev/shm"
    image = data_image(os.path.join(shm, f"vdt-trace-{os.getpid()}.img"), 16 * MiB)
    try:
        d = DaemonProc(tmp_path, image, "--uri", "", max_hold="4M", interval=0.2)
        try:
            st = d.wait_status(lambda s: s["cycle"] >= 1, "a cycle")
            assert st["access_source"] == "mincore" and st["events_lost"] == 0
            lines = [x for x in d.output().splitlines() if "access source" in x]
            assert len(lines) == 1 and "access source: mincore (tracing is not usable:" \
                in lines[0], lines
            assert d.stop() == 0
        finally:
            d.cleanup()
        d = DaemonProc(tmp_path, image, "--uri", "", "--access-source", "trace",
                       max_hold="4M", interval=0.2, status="s2.json", log="d2.log")
        try:
            assert d.proc.wait(30) == 78
            out = d.output().strip().splitlines()
            assert "Traceback" not in d.output()
            assert out[-1].startswith("vmdisktouch: access_source trace: tracing is not usable"), out
        finally:
            d.cleanup()
    finally:
        os.unlink(image)


def test_a_loop_device_is_traced_on_its_bdev_inode_and_its_read_zone_held(tmp_path, loop_device_of,
                                                                        tracefs_root):  # noqa: F811
    loop_device = loop_device_of(64 * MiB)
    stop = threading.Event()
    d = DaemonProc(tmp_path, loop_device, "--uri", "", max_hold="16M", interval=0.3)
    try:
        st = d.wait_status(lambda s: s["cycle"] >= 1, "a cycle")
        assert st["access_source"] == "trace"
        rdev = os.stat(loop_device).st_rdev
        assert st["trace"]["target"].startswith(
            f"block device {os.major(rdev)}:{os.minor(rdev)} (bdev inode "), st["trace"]
        reader_thread(loop_device, 24 * MiB, 32 * MiB, stop)
        st = d.wait_status(lambda s: any(o <= 24 * MiB and o + n >= 32 * MiB
                                         for o, n in s["regions"]), "the read zone held")
        assert st["events_lost"] == 0
    finally:
        stop.set()
        assert d.stop() == 0
        d.cleanup()


@pytest.mark.qemu
@pytest.mark.timeout(120)
def test_every_part_qemu_writes_is_reported_and_an_idle_image_none(tmp_path, tracefs_root):  # noqa: F811
    """QEMU (cache=writethrough) writes one page in each of 24 parts of held blocks.

    The kernel names a write by the folio it dirties (``writeback_dirty_folio``
    carries the folio's first page): exact to the page for single-page
    folios, which the guest here makes by reading without readahead. In a
    large folio (readahead's, up to 2 MiB) a write is credited to the part
    of the folio's first page (docs/architecture.md).
    """
    image = data_image(tmp_path / "disk.img", 64 * MiB)
    record = tmp_path / "record.jsonl.gz"
    stop = threading.Event()
    with QemuVM(image) as vm:
        d = DaemonProc(tmp_path, image, "--uri", "", max_hold="16M", interval=0.5,
                       env={**os.environ, "VMDISKTOUCH_RECORD": str(record)})
        try:
            reader_thread(image, 8 * MiB, 16 * MiB, stop, random_access=True)
            st = d.wait_status(lambda s: any(o <= 8 * MiB and o + n >= 16 * MiB
                                             for o, n in s["regions"]), "the zone held")
            idle_from = st["cycle"]
            st = d.wait_status(lambda s: s["cycle"] >= idle_from + 4, "four idle cycles")
            before = st["cycle"]
            written = {}                                  # block -> parts written, once each
            for i in range(24):
                block = 8 + i % 8
                part = 5 * (i // 8) + (i % 8) % 5
                off = block * MiB + part * (MiB // 16) + (i % 4) * PAGE
                vm.write(off, PAGE, pattern=0x40 + i)
                written.setdefault(block, set()).add(part)
            write_cycle = d.read_status()["cycle"]
            d.wait_status(lambda s: s["cycle"] >= write_cycle + 3, "three more cycles")
        finally:
            stop.set()
            assert d.stop() == 0
            d.cleanup()
    cycles = disk_cycles(read_record(record))                  # line k: cycle k + 1
    seen: dict[int, float] = {}
    for k, c in enumerate(cycles):
        blocks, values = c["rewritten"]
        if idle_from < k + 1 <= before:
            assert blocks == [], (k + 1, blocks)        # idle: no false positives
        if k + 1 > before:
            for b, v in zip(blocks, values):
                seen[b] = seen.get(b, 0) + v
    assert sorted(seen) == sorted(written)
    for b, parts in written.items():
        assert seen[b] == pytest.approx(len(parts) / 16), (b, seen[b], parts)


def test_past_the_budget_the_next_hottest_zone_is_cached_not_locked(tmp_path, tracefs_root):  # noqa: F811
    """A zone read all over, twice the budget: half held, the other half spilled, read back
    into the cache after an eviction, and never locked. ``--min-free 0``: the spill reads
    only into memory nobody uses (``MemFree`` above the floor), and late in a full run the
    machine's page cache leaves less than the default 1 GiB of it free. ``--decay 0.05``
    (20 s): the zone stays hot well past the reader's stop and the eviction; at the
    default 10 s it cooled below the threshold first when a loaded machine was slow to
    read it back."""
    image = data_image(tmp_path / "disk.img", 64 * MiB)
    stop = threading.Event()
    d = DaemonProc(tmp_path, image, "--uri", "", "--min-free", "0", "--decay", "0.05",
                   max_hold="8M", interval=0.3)
    fd = os.open(image, os.O_RDONLY)
    try:
        d.wait_status(lambda s: s["cycle"] >= 1, "a cycle")
        reader = reader_thread(image, 16 * MiB, 32 * MiB, stop)
        d.wait_status(lambda s: s["held_bytes"] == 8 * MiB
                      and s["spill"]["target_bytes"] >= 4 * MiB, "half held, half spilled")
        stop.set()
        reader.join(10)           # its pass ends first: a read after the eviction caches
        evict(image)              # the guest's cache and the spill go; the held half stays
        st = d.wait_status(lambda s: s["spill"]["read_bytes"] >= 4 * MiB
                           or s["spill"]["stopped"] is not None, "the spill read again")
        assert st["spill"]["stopped"] is None, st["spill"]
        assert st["spill"]["read_bytes"] >= 4 * MiB and st["held_bytes"] <= 8 * MiB
        assert vmlck(d.pid) <= 8 * MiB
        held = np.zeros(64 * MiB // PAGE, dtype=bool)
        for off, n in st["regions"]:
            held[off // PAGE:(off + n) // PAGE] = True
        deadline = time.monotonic() + 5
        while True:          # WILLNEED's reads complete after it returns
            vec = resident_map(fd, 64 * MiB)
            spilled = int((vec & ~held)[16 * MiB // PAGE:32 * MiB // PAGE].sum())
            if spilled * PAGE >= 0.9 * st["spill"]["read_bytes"] or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert spilled * PAGE >= 0.9 * st["spill"]["read_bytes"], spilled
        assert not (vec & ~held)[:16 * MiB // PAGE].any()      # nothing outside the zone
    finally:
        stop.set()
        os.close(fd)
        assert d.stop() == 0
        d.cleanup()


def resident_map(fd: int, length: int) -> np.ndarray:
    """Per page of [0, length): in the page cache (mincore on a fresh mapping)."""
    addr = libc.mmap_file(fd, 0, length)
    try:
        vec = np.zeros(length // PAGE, dtype=np.uint8)
        return (libc.mincore(addr, length, vec) & 1).astype(bool)
    finally:
        libc.munmap(addr, length)


def test_a_cold_disk_holds_its_hot_zone_seconds_after_the_first_reads(tmp_path,  # noqa: F811
                                                                       tracefs_root):
    """At the default interval (5 s), the first drain of reads outside what is held starts a
    cycle (issue 33): the zone is held well before the next scheduled cycle."""
    image = data_image(tmp_path / "disk.img", 64 * MiB)
    d = DaemonProc(tmp_path, image, "--uri", "", "--access-source", "trace",
                   max_hold="24M", status="st.json")
    stop = threading.Event()
    try:
        d.wait_status(lambda s: s["cycle"] >= 1, "the first cycle", timeout=30)
        t0 = time.monotonic()
        reader_thread(image, 16 * MiB, 32 * MiB, stop)
        st = d.wait_status(lambda s: sum(n for o, n in s["regions"]
                                         if 16 * MiB <= o and o + n <= 36 * MiB)
                           >= 0.9 * 16 * MiB, "the zone held", timeout=20)
        took = time.monotonic() - t0
        assert took < 3.5, f"held {took:.1f} s after the first reads\n{d.log_tail(10)}"
        assert st["cycle"] >= 2 and st["trace"]["early_cycles"] >= 1
    finally:
        stop.set()
        d.stop()


def test_the_curve_says_what_an_lru_cache_of_each_size_would_serve(tmp_path, tracefs_root):  # noqa: F811
    """A guest reading a 16 MiB zone over and over, page by page in order: an LRU cache of
    the zone or more serves all but the first pass; one of half the zone serves nothing (a
    loop evicts each page just before it comes back). The curve, from the kernel's sample
    of the reads, says so; a mincore daemon has none and says why."""
    image = data_image(tmp_path / "disk.img", 64 * MiB)
    d = DaemonProc(tmp_path, image, "--uri", "", max_hold="4M", interval=0.3)
    fd = os.open(image, os.O_RDONLY)
    try:
        d.wait_status(lambda s: s["cycle"] >= 1, "a cycle")
        for _ in range(12):
            for off in range(8 * MiB, 24 * MiB, PAGE):
                os.pread(fd, PAGE, off)
        # The gain is counted while the cycle's reads are drained, the held bytes after
        # its holds are applied: a cycle that still loads says two helds. Take one whose
        # holds stood still, so "one GiB more" is measured from the held it reports.
        st = d.wait_status(lambda s: s["mrc"]["reads"] >= 0.9 * 12 * 4096
                           and s["gain"]["next_gib"]["bytes"] == s["held_bytes"] + 1024 * MiB,
                           "the reads in its curve, and a cycle whose holds stood still")
        curve = dict(st["curve"])
        assert st["trace"]["reads_counted_in_kernel"] and st["mrc"]["samples_lost"] == 0
        assert len(curve) == 12 and max(curve) == 64 * MiB
        assert curve[32 * MiB] == pytest.approx(11 / 12, abs=0.03)
        assert curve[64 * MiB] == pytest.approx(11 / 12, abs=0.03)
        assert curve[8 * MiB] <= 0.03 and curve[MiB] <= 0.03
        # What the curve wants: the zone (a GiB more past it serves nothing more).
        assert 12 * MiB <= st["gain"]["wants_bytes"] <= 20 * MiB
        nxt = st["gain"]["next_gib"]
        assert nxt["bytes"] == st["held_bytes"] + 1024 * MiB
        assert nxt["hit_ratio"] == pytest.approx(11 / 12, abs=0.03)
        # It wants no more than that, and a miss on this disk was timed.
        assert st["wanted_bytes"] <= st["gain"]["wants_bytes"]
        cost = st["miss_cost"]
        assert 0 < cost["seconds"] < 1 and cost["probes"] + cost["misses"] > 0
    finally:
        os.close(fd)
        assert d.stop() == 0
    (tmp_path / "mincore").mkdir()
    d = DaemonProc(tmp_path / "mincore", image, "--uri", "", "--access-source", "mincore",
                   max_hold="4M", interval=0.3)
    try:
        st = d.wait_status(lambda s: s["cycle"] >= 1, "a cycle")
        assert st["curve"] is None and "mincore" in st["mrc"]["none"]
    finally:
        assert d.stop() == 0
