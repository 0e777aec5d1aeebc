"""The daemon's cycle with the trace source, on the real tracefs and page cache.

``build`` makes a ``DiskWatcher`` on a real file exactly as ``run`` does
(``access_source`` trace), with a stepped clock (5 s per cycle, so the heat
behaves as at the default interval while the test runs in seconds). The
guest is this process: its reads come from a second thread (the daemon's own
thread is excluded from the reads and adds it traces), its writes are
``O_DSYNC`` pwrites whose pages the test logs, as a writer's own log. Where
tracefs cannot be used the tests fail with the reason, never skip.
"""

from __future__ import annotations

import os
import random
import threading
import time

import numpy as np
import pytest
from PIL import Image as PILImage

from tests.support.clocks import Stepped
from tests.support.images import evict
from tests.support.tracing import instance_name, scratch, tracefs_root  # noqa: F401
from vmdisktouch.daemon.host import host_of
from vmdisktouch.config import settings
from vmdisktouch.adapters.pictures import figure, render
from vmdisktouch.daemon.build import build
from vmdisktouch.daemon.sources import TraceSource
from vmdisktouch.system.image import open_image
from vmdisktouch.system.observe.residency_tracker import ResidencyTracker
from vmdisktouch.system.trace.trace_reader import TraceReader

PAGE, MiB = 4096, 1 << 20


@pytest.fixture
def watcher(scratch, tmp_path, tracefs_root):      # noqa: F811
    made = []

    def make(pages=64 * MiB // PAGE, budget="16M", **kw):
        path = scratch(pages)
        cfg = settings.resolve({"max_hold": budget, "interval": 5.0, "min_free": 0,
                                "access_source": "trace",
                                "status": str(tmp_path / "s.json"),
                                "map_png": str(tmp_path / "map.png"), **kw})
        clock = Stepped()
        w = build(open_image(path), cfg, clock=clock, memcg=None)
        made.append(w)
        assert isinstance(w.source, TraceSource)
        w.test_clock, w.test_path = clock, path
        return w

    yield make
    for w in made:
        name = w.source.reader.name
        w.close()
        assert not os.path.exists(os.path.join(tracefs_root, "instances", name))


def tick(w):
    """One cycle of ``w``'s host of one (the host drives every cycle)."""
    w.test_clock.t += 5.0
    if not hasattr(w, "test_host"):
        w.test_host = host_of(w)
    return w.test_host.tick()[0]


def guest_reads(path, pages):
    """Buffered reads of ``pages`` from another thread (a guest's, not the daemon's)."""
    def run():
        fd = os.open(path, os.O_RDONLY)
        try:
            for p in pages:
                os.pread(fd, PAGE, p * PAGE)
        finally:
            os.close(fd)
    t = threading.Thread(target=run)
    t.start()
    t.join()


def zone_pages(first_mib, last_mib, every=16):
    return list(range(first_mib * MiB // PAGE, last_mib * MiB // PAGE, every))


def test_a_read_only_zone_stays_held_while_read_and_goes_when_reads_stop(watcher):
    w = watcher()
    zone = zone_pages(20, 30)
    held = []
    for _ in range(24):                              # two minutes of 5 s cycles
        guest_reads(w.test_path, zone)
        r = tick(w)
        held.append(sum(min(s + n, 30 * MiB) - max(s, 20 * MiB)
                        for s, n in r.regions if s < 30 * MiB and s + n > 20 * MiB))
    assert min(held[1:]) == 10 * MiB, held           # held from the second cycle, never let go
    assert w.source.events_lost == 0
    for i in range(12):
        r = tick(w)
        if not r.held_bytes:
            break
    assert r.held_bytes == 0 and i < 10, (i, r.held_bytes)


def test_every_page_written_is_reported_and_an_idle_image_reports_none(watcher):
    w = watcher()
    zone = zone_pages(8, 24)
    guest_reads(w.test_path, zone)
    tick(w)
    tick(w)
    for _ in range(3):                              # idle: nothing written, nothing reported
        guest_reads(w.test_path, zone)
        tick(w)
        assert w.source.last_access.write_pages.size == 0
    assert w.holder.held_bytes() == 16 * MiB
    rng = random.Random(7)
    written = sorted(rng.sample(range(8 * MiB // PAGE, 24 * MiB // PAGE), 300))
    fd = os.open(w.test_path, os.O_WRONLY | os.O_DSYNC)
    try:
        for p in written:
            os.pwrite(fd, os.urandom(PAGE), p * PAGE)
    finally:
        os.close(fd)
    r = tick(w)
    assert w.source.last_access.write_pages.tolist() == written
    assert r.rewritten_blocks == len({p * PAGE // MiB for p in written})
    status = w.last_disk.to_json()
    assert status["access_source"] == "trace" and status["events_lost"] == 0
    assert status["trace"]["written_pages"] == 300


def test_refaults_show_in_the_status_and_on_the_map(watcher):
    w = watcher(blocks_per_pixel=1, width=64, scale=4)           # one row of 64 blocks
    w.hold_enabled = False                          # nothing held: the cache may evict all
    pages = zone_pages(40, 42, every=1)
    guest_reads(w.test_path, pages)
    tick(w)
    evict(w.test_path)                              # the cache loses them...
    guest_reads(w.test_path, pages)                 # ...and the guest needs them back
    tick(w)
    status = w.last_disk.to_json()
    assert status["trace"]["refaulted_pages"] >= len(pages) // 2, status["trace"]
    thrash = status["thrashing_ranges"]
    assert thrash and all(40 * MiB <= s and s + n <= 48 * MiB for s, n in thrash), thrash
    rgb = figure.grid_pixels(PILImage.open(w.config.map_png), 64, 1, 4)
    yellow = np.flatnonzero(np.all(rgb == render.THRASHING, axis=1))
    assert {40, 41} <= set(yellow.tolist()) <= set(range(40, 48)), yellow   # + readahead


def test_lost_events_make_the_cycle_reconcile_with_mincore(scratch, tracefs_root):  # noqa: F811
    path = scratch(16 * MiB // PAGE)
    image = open_image(path)
    reader = TraceReader(image.fd, name=instance_name(), buffer_kb=4, max_buffer_kb=4,
                         exclude_tid=threading.get_native_id())
    source = TraceSource(reader, ResidencyTracker(image, MiB), MiB, 16)
    try:
        held = np.zeros(16, bool)
        cfg = settings.resolve({"max_hold": "4M"})
        first = source.observe(image.size, held, cfg)       # the first cycle scans, but
        assert source.last["reconciled"] and not first.reconcile   # residency is no evidence
        quiet = source.observe(image.size, held, cfg)
        assert not quiet.reconcile and not source.last["reconciled"]
        assert reader.counting                  # reads are counted in the kernel: none lost
        guest_reads(path, list(range(0, 8 * MiB // PAGE)) * 3)
        evict(path)                             # the deletions: far more than 4 KiB holds
        guest_reads(path, list(range(0, 8 * MiB // PAGE, 4)))    # and the additions
        seen = source.observe(image.size, held, cfg)
        assert seen.reconcile and source.last["reconciled"]
        assert source.events_lost > 0 and source.status()["events_lost"] == source.events_lost
        assert source.last["reads"] >= 3 * 8 * MiB // PAGE      # counted, whatever was lost
        # residency from the mincore pass: a page in four of the 8 MiB read back (+ readahead)
        truth = ResidencyTracker(image, MiB).scan(image.size).fraction()
        assert seen.resident[:8].min() >= 0.25 and np.allclose(seen.resident, truth, atol=0.02)
    finally:
        source.close()
        image.close()


def test_between_cycles_a_quiet_disk_is_not_drained_and_a_busy_one_is(scratch, tracefs_root):  # noqa: F811,E501
    """Reads as events of the ring buffer (where eBPF is refused): a warm disk is drained
    between cycles only when its buffer may be an eighth full by now; a cold one (no
    baseline yet) whenever anything is buffered (issue 33)."""
    path = scratch(64 * MiB // PAGE)
    image = open_image(path)
    reader = TraceReader(image.fd, name=instance_name(), buffer_kb=64,
                         exclude_tid=threading.get_native_id())
    reader.counting_refused = "the test keeps reads as events"
    now = [0]
    source = TraceSource(reader, ResidencyTracker(image, MiB), MiB, 64,
                         clock_ns=lambda: now[0])
    drains = []
    real_drain = reader.drain
    reader.drain = lambda: drains.append(now[0]) or real_drain()
    try:
        held, cfg = np.zeros(64, bool), settings.resolve({"max_hold": "4M"})
        source.observe(image.size, held, cfg)
        now[0] += 10**9
        source.pump(between=True)                           # cold, nothing buffered
        assert drains == [0] and source.cold
        guest_reads(path, list(range(0, 16)))
        now[0] += 10**9
        source.pump(between=True)                           # cold, a few reads: drained
        assert drains == [0, 2 * 10**9]
        guest_reads(path, list(range(0, 8 * MiB // PAGE)))  # ~2k reads: a baseline
        now[0] += 3 * 10**9
        source.observe(image.size, held, cfg)
        source.settled(held)
        assert not source.cold
        now[0] += 5 * 10**9
        guest_reads(path, list(range(0, 64)))               # a few reads
        source.observe(image.size, held, cfg)
        assert 0 < reader.last_bytes < reader.buffer_kb * 1024 // 8
        guest_reads(path, list(range(64, 80)))
        now[0] += 10**9
        before = len(drains)
        source.pump(between=True)                           # far from an eighth full
        assert len(drains) == before
        now[0] += 4 * 10**9
        seen = source.observe(image.size, held, cfg)        # the cycle drains all the same
        assert seen.reads.blocks.tolist() == [0] and source.last["reads"] >= 16
        guest_reads(path, list(range(0, 8 * MiB // PAGE)))  # busy: ~2k reads in a cycle
        now[0] += 5 * 10**9
        source.observe(image.size, held, cfg)
        busy, eighth = reader.last_bytes, reader.buffer_kb * 1024 / 8
        now[0] += int(5e9 * eighth / busy) - 10**6           # not quite an eighth yet
        source.pump(between=True)
        assert drains[-1] != now[0]
        now[0] += 2 * 10**6                                   # an eighth expected by now
        source.pump(between=True)
        assert drains[-1] == now[0]
    finally:
        source.close()
        image.close()


def test_reads_counted_in_the_kernel_are_taken_at_every_pump(scratch, tracefs_root):  # noqa: F811,E501
    """Counted in the kernel, a warm disk's reads are taken at every pump between cycles,
    however few (a copy of the counters), and its ring buffer is left to the
    eighth-full rule."""
    path = scratch(64 * MiB // PAGE)
    guest_reads(path, list(range(0, 8 * MiB // PAGE)))      # cached: no additions to drain
    image = open_image(path)
    reader = TraceReader(image.fd, name=instance_name(), buffer_kb=64,
                         exclude_tid=threading.get_native_id())
    now = [0]
    source = TraceSource(reader, ResidencyTracker(image, MiB), MiB, 64,
                         clock_ns=lambda: now[0])
    drains = []
    real_drain = reader.drain
    reader.drain = lambda: drains.append(now[0]) or real_drain()
    try:
        assert reader.counting and source.status()["trace"]["reads_counted_in_kernel"]
        held, cfg = np.zeros(64, bool), settings.resolve({"max_hold": "4M"})
        guest_reads(path, list(range(0, 8 * MiB // PAGE)))  # ~2k reads: a baseline
        now[0] += 5 * 10**9
        source.observe(image.size, held, cfg)
        source.settled(held)
        assert not source.cold and source.last["events"]["read"] == 8 * MiB // PAGE
        now[0] += 10**9
        source.pump(between=True)                           # nothing counted
        assert drains == [5 * 10**9] and source.shift._drain == (0, 0)
        guest_reads(path, [3 * MiB // PAGE, 3 * MiB // PAGE + 1])   # two reads of block 3
        now[0] += 10**9
        source.pump(between=True)
        assert drains == [5 * 10**9] and source.shift._drain == (2, 2)   # the buffer left
        now[0] += 3 * 10**9
        seen = source.observe(image.size, held, cfg)
        assert seen.reads.blocks.tolist() == [3] and seen.read_counts.values.tolist() == [2]
        assert source.last["events"]["read"] == 2
    finally:
        source.close()
        image.close()


def test_reads_leaving_the_held_zone_ask_for_a_cycle_early(watcher):
    """The guest moves its reads: the drain between cycles asks for a cycle now, and the
    early cycle is reported; reads in what is held ask for nothing."""
    w = watcher()
    old, new = zone_pages(20, 30, every=1), zone_pages(40, 50, every=1)
    for _ in range(3):
        guest_reads(w.test_path, old)
        tick(w)
    assert w.holder.held_bytes() >= 10 * MiB
    # A pump drains once the buffer may be an eighth full at the last drain's rate:
    # the sleeps make the time since the last drain longer than the span before it.
    guest_reads(w.test_path, old)
    time.sleep(0.5)
    assert not w.pump()         # 2,560 reads where it holds: no early cycle
    assert w.source.shift._drain == (0, 2560)
    guest_reads(w.test_path, new)
    time.sleep(1.0)
    assert w.pump()             # 2,560 reads, all outside the held blocks
    tick(w)
    st = w.last_disk.to_json()
    assert st["trace"]["woken_early"] is True and st["trace"]["early_cycles"] == 1
    tick(w)
    st = w.last_disk.to_json()
    assert st["trace"]["woken_early"] is False and st["trace"]["early_cycles"] == 1


def test_loaded_bytes_say_how_much_came_from_disk(watcher):
    """A zone the guest has cached is only relocked; one it read long ago (evicted
    since) comes from the disk: the status splits loaded_bytes accordingly."""
    w = watcher(budget="32M")
    warm, cold = zone_pages(8, 16, every=1), zone_pages(40, 48, every=16)
    guest_reads(w.test_path, cold)                  # a page in 16 of 40-48 MiB...
    evict(w.test_path)                              # ...evicted since
    guest_reads(w.test_path, warm)                  # all of 8-16 MiB cached now
    r = tick(w)
    st = w.last_disk.to_json()
    assert r.loaded_bytes >= 16 * MiB, r.loaded_bytes
    from_disk = st["loaded_from_disk_bytes"]
    relocked = r.loaded_bytes - from_disk
    assert relocked >= 7 * MiB, (relocked, st["regions"])      # the warm zone
    assert from_disk >= 7 * MiB, (from_disk, st["regions"])    # the cold one


def test_a_blind_instance_that_cannot_be_made_anew_falls_back_to_a_mincore_pass_a_cycle(
        scratch, tmp_path, tracefs_root, caplog):                       # noqa: F811
    """#31: events that stop with every switch as set (``set_event_pid``), and no new
    instance: tracing is given up in one warning, the residency stands in for the reads."""
    from vmdisktouch.system.trace.trace_reader import TraceUnavailable
    path = scratch(64 * MiB // PAGE)
    cfg = settings.resolve({"max_hold": "16M", "interval": 5.0, "min_free": 0,
                            "access_source": "trace"})
    w = build(open_image(path), cfg, clock=Stepped(), memcg=None)
    w.test_clock, w.test_path = w.clock, path
    name = w.source.reader.name
    inst = os.path.join(tracefs_root, "instances", name)
    try:
        tick(w)
        with open(os.path.join(inst, "set_event_pid"), "w") as f:
            f.write("1\n")

        def refused():
            raise TraceUnavailable("injected")
        w.source.make_reader = refused
        w.source.reader._inst.restore = lambda rels: refused()   # #40: a pid filter is set back
        for _ in range(11):                          # up to the next scheduled pass
            tick(w)
        assert w.source.reader is not None
        with caplog.at_level("INFO", logger="vmdisktouch"):
            tick(w)
        assert w.source.reader is None and not os.path.exists(inst)
        gave_up = [r for r in caplog.records if "stands in for the reads" in r.getMessage()]
        assert len(gave_up) == 1 and gave_up[0].levelname == "WARNING"
        assert "injected" in gave_up[0].getMessage()
        zone = zone_pages(20, 30, every=1)            # all cached: residency is the evidence
        for _ in range(3):
            guest_reads(w.test_path, zone)
            r = tick(w)
            assert w.source.last["reconciled"] is True
        assert r.held_bytes >= 8 * MiB, r.regions
    finally:
        w.close()
    assert not os.path.exists(inst)


def test_a_cached_idle_disk_gets_no_budget_before_it_is_read(watcher):
    """Cold start (#32): residency is not evidence of use. An idle image a ``dd`` left in
    the cache gets nothing of a shared budget at the first cycle, while a disk the guest
    reads gets its zone; before, the first cycle counted residency and locked 16M of the
    idle image at once (``loaded 16M (0 from disk, 16M relocked)``)."""
    from vmdisktouch.daemon.host import Host
    idle, busy = watcher(), watcher()
    fd = os.open(idle.test_path, os.O_RDONLY)
    try:
        for off in range(0, 16 * MiB, MiB):            # the dd: the first 16M cached
            os.pread(fd, MiB, off)
    finally:
        os.close(fd)
    busy.test_clock = idle.test_clock
    h = Host([idle, busy], 16 * MiB, idle.block_size)
    for cycle in range(3):
        guest_reads(busy.test_path, zone_pages(20, 28))
        idle.test_clock.t += 5.0
        h.tick()
        assert idle.holder.held_bytes() == 0, cycle
        assert idle.last_report.limited_by == "no_evidence"
    assert busy.holder.held_bytes() >= 8 * MiB


def test_an_idle_disk_skips_its_cycles_until_read_and_keeps_its_schedule(watcher):
    """A disk nobody reads is observed once every ``RECONCILE_EVERY`` cycles, not every
    cycle (``DiskWatcher._quiet``); the guest's first read ends the quiet at the next
    cycle, and what it read is held as if no cycle had been skipped."""
    from vmdisktouch.daemon.sources import RECONCILE_EVERY
    w = watcher(map_png=None)
    observed = []
    observe = w.source.observe
    w.source.observe = lambda *a: (observed.append(w.cycle), observe(*a))[1]
    reports = [tick(w) for _ in range(2 * RECONCILE_EVERY + 2)]
    assert [r.cycle for r in reports] == list(range(1, 2 * RECONCILE_EVERY + 3))
    # the first cycle (it saw nothing: idle), then one full cycle each time a
    # reconciliation is due
    assert observed == [0, RECONCILE_EVERY, 2 * RECONCILE_EVERY], observed
    assert all(r.held_bytes == 0 and r.loaded_bytes == 0 for r in reports)
    assert w.last_disk.cycle == reports[-1].cycle          # every cycle reported
    guest_reads(w.test_path, zone_pages(20, 28))
    observed.clear()
    r = tick(w)
    assert observed == [r.cycle - 1]                         # read: a full cycle at once
    r = tick(w)
    assert r.held_bytes >= 8 * MiB and len(observed) == 2
    # while it holds, no cycle is skipped: its holds are re-judged each one
    n = len(observed)
    for _ in range(3):
        tick(w)
    assert len(observed) == n + 3


def test_a_per_disk_picture_or_a_polling_source_never_skips(watcher):
    w = watcher()                                           # the map PNG is drawn
    calls = []
    observe = w.source.observe
    w.source.observe = lambda *a: (calls.append(1), observe(*a))[1]
    for _ in range(5):
        tick(w)
    assert len(calls) == 5
