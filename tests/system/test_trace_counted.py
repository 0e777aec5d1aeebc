"""Reads counted per block in the kernel (``bpf_reads`` through ``TraceReader.count_reads``),
against this machine's real kernel, tracefs and page cache.

Cross-checked against the reads the same thread made, and against the ring buffer's
own READ events of a second reader of the same image (the path reads take where eBPF
is refused). The refusal is made real: a child process as root without CAP_BPF,
CAP_PERFMON and CAP_SYS_ADMIN.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from tests.support.common import without_bpf
from tests.support.tracing import PAGE, instance_name, reader, scratch, tracefs_root  # noqa: F401
from vmdisktouch.core.mrc import FULL, batch_ends, page_hash, pages_read, sample_ranges
from vmdisktouch.system.trace import bpf_reads, tracefs
from vmdisktouch.system.trace.trace_reader import GET_PAGES, READ, TraceReader

ROOT_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PPB = 256                  # 1 MiB blocks of 4 KiB pages


def in_thread(fn, *args):
    """``fn(*args)`` on a thread of its own (a guest's): its thread id."""
    tid = []
    t = threading.Thread(target=lambda: (tid.append(threading.get_native_id()), fn(*args)))
    t.start()
    t.join()
    return tid[0]


def reads_of(fd, offsets_and_lengths):
    for off, n in offsets_and_lengths:
        os.pread(fd, n, off)


def sampled(c, threshold: int = FULL) -> np.ndarray:
    """The pages a take's sample stands for: its ranges' pages under the threshold."""
    return sample_ranges(c.sampled[:, 0], c.sampled[:, 1], threshold)[0]


def taken(reader):
    """Two drains' counted reads: a thread's last range waits for a take that saw it."""
    a, b = reader.drain().counted, reader.drain().counted
    blocks, inverse = np.unique(np.concatenate((a.blocks, b.blocks)), return_inverse=True)
    counts = np.bincount(inverse, weights=np.concatenate((a.counts, b.counts))).astype(int)
    return dataclasses.replace(a, blocks=blocks, counts=counts,
                               sampled=np.concatenate((a.sampled, b.sampled)),
                               pages=a.pages + b.pages, samples_lost=a.samples_lost
                               + b.samples_lost)


def pinned_reads_of(fd, offsets_and_lengths):
    """``reads_of`` on one CPU: the kernel takes a CPU's read range at its next read there,
    so a thread that moved would see its ranges taken out of order."""
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    reads_of(fd, offsets_and_lengths)


def test_each_block_counts_the_read_events_that_touched_it_as_the_ring_buffer_saw_them(
        scratch, reader):                                   # noqa: F811
    path = scratch(16 * PPB)
    fd = os.open(path, os.O_RDONLY)
    try:
        counted = reader(fd)
        events = reader(fd)                                 # the same reads, one by one
        assert counted.count_reads(PPB, 16) and counted.counting and not events.counting
        taken(counted), events.drain()              # what was pending: taken
        rng = np.random.default_rng(3)
        plan = [(int(p) * PAGE, PAGE) for p in rng.integers(0, 16 * PPB, 3000)]
        plan += [(PPB * PAGE - PAGE, 2 * PAGE)] * 5         # across blocks 0 and 1
        plan += [(5 * PPB * PAGE, 3 * PPB * PAGE)]          # blocks 5, 6 and 7
        in_thread(reads_of, fd, plan)
        c = counted.drain().counted
        ev = events.drain()
        assert c is not None and events.drain().counted is None
        assert not np.any(counted.drain().kind == READ)     # none in its ring buffer
        r = ev.kind == READ
        want = np.zeros(16, np.int64)
        for first, last in zip(ev.first[r] // PPB, ev.last[r] // PPB):
            want[first:last + 1] += 1
        got = np.zeros(16, np.int64)
        got[c.blocks] = c.counts
        assert got.tolist() == want.tolist() and got.sum() >= 3000 + 10 + 3
    finally:
        os.close(fd)


def test_reads_across_many_chunks_count_as_the_ring_buffer_saw_them(scratch, reader):  # noqa: F811
    """Page-sized blocks: 16 chunks of counters, reads of up to 64 pages that cross their
    edges; a take reads the chunks that moved and finds every block's count."""
    nblocks = 16 * bpf_reads.CHUNK
    path = scratch(nblocks)
    fd = os.open(path, os.O_RDONLY)
    try:
        counted, events = reader(fd), reader(fd)
        assert counted.count_reads(1, nblocks)
        taken(counted), events.drain()
        rng = np.random.default_rng(5)
        plan = [(int(p) * PAGE, int(n) * PAGE) for p, n in
                zip(rng.integers(0, nblocks - 64, 400), rng.integers(1, 65, 400))]
        plan += [((k * bpf_reads.CHUNK - 2) * PAGE, 4 * PAGE) for k in range(1, 16)]
        in_thread(reads_of, fd, plan)
        c = counted.drain().counted
        ev = events.drain()
        r = ev.kind == READ
        want = np.zeros(nblocks, np.int64)
        for first, last in zip(ev.first[r], ev.last[r]):
            want[first:last + 1] += 1
        got = np.zeros(nblocks, np.int64)
        got[c.blocks] = c.counts
        assert got.tolist() == want.tolist() and np.count_nonzero(got) > nblocks // 4
    finally:
        os.close(fd)


def test_the_pages_read_are_sampled_in_order_as_the_ring_buffer_saw_them(scratch, reader):  # noqa: F811
    """The kernel's sample for the miss-ratio curve: every page under the threshold, in
    the order read, as the ring buffer's READ events of a second reader expand; every page
    read counted; a ring overrun counted lost, its newest pages kept."""
    path = scratch(16 * PPB)
    fd = os.open(path, os.O_RDONLY)
    try:
        counted, events = reader(fd), reader(fd)
        assert counted.count_reads(PPB, 16)
        rng = np.random.default_rng(5)
        for threshold, n in ((FULL, 2000), (FULL // 16, 3000), (FULL, bpf_reads.RING + 1808)):
            counted.sample_below(threshold)
            taken(counted), events.drain()          # what was pending: taken
            plan = [(int(p) * PAGE, PAGE) for p in rng.integers(0, 16 * PPB, n)]
            plan += [(7 * PPB * PAGE + 3 * PAGE, 40 * PAGE)] * (threshold < FULL)
            in_thread(pinned_reads_of, fd, plan)
            c, ev = taken(counted), events.drain()
            r = ev.kind == READ
            read = pages_read(ev.first[r], batch_ends(ev.first[r], ev.last[r]))
            if n > bpf_reads.RING:         # more than the events' buffer holds: the plan's
                read = np.array([off // PAGE for off, _ in plan])
            want = read[page_hash(read) < threshold]
            # The last read's range waits for the thread's next read: the second take
            # takes it from there, not from the ring.
            lost = max(0, want.size - 1 - bpf_reads.RING)
            assert c.samples_lost == lost and sampled(c, threshold).tolist() == want[lost:].tolist()
            assert c.pages == read.size >= n
            assert 0 < c.sampled.shape[0] < c.pages or threshold == FULL
    finally:
        os.close(fd)


def test_a_long_read_samples_each_page_once_though_the_kernel_repeats_its_tail(
        scratch, reader):                                   # noqa: F811
    """The kernel reports an 8 MiB read once per batch of folios (31 at most), each time
    up to the request's end; the sample takes each batch up to the next one's first page, so the
    pages read twice are sampled twice, no more."""
    path = scratch(16 * PPB)
    fd = os.open(path, os.O_RDONLY)
    try:
        counted, events = reader(fd), reader(fd)
        assert counted.count_reads(PPB, 16)
        counted.sample_below(FULL)
        # Read cold, the pages come in small folios (a written file's can be 2 MiB each,
        # and one batch then covers it all).
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        taken(counted), events.drain()              # what was pending: taken
        in_thread(pinned_reads_of, fd, [(0, 8 * PPB * PAGE)] * 2)
        c, ev = taken(counted), events.drain()
        r = ev.kind == READ
        assert r.sum() > 4                                  # the kernel's batches: several
        assert int((ev.last[r] - ev.first[r] + 1).sum()) > 3 * 2 * 8 * PPB
        once = np.arange(8 * PPB)
        assert sampled(c).tolist() == np.concatenate((once, once)).tolist()
        assert c.pages == 2 * 8 * PPB
    finally:
        os.close(fd)


@pytest.mark.parametrize("mib", [4, 16])
def test_a_long_read_of_large_folios_samples_every_page(scratch, reader, mib):  # noqa: F811
    """A written file's folios are large (1 MiB here): one batch of 31 covers 31 MiB, and
    the kernel reports a 4 MiB read as one event. Every page of it is sampled, not the
    first ``SAMPLE_SPAN`` (issue 55: a 64 MiB zone read in 4 MiB requests looked a quarter
    of its size), and every block of it counts its reads, not the first ``span_blocks``
    (a host service held 22 MiB of such a zone of 64)."""
    path = scratch(16 * PPB)
    fd = os.open(path, os.O_RDWR)
    try:
        for k in range(16):                                 # written in 1 MiB pieces
            os.pwrite(fd, os.urandom(PPB * PAGE), k * PPB * PAGE)
        os.fsync(fd)
        counted, events = reader(fd), reader(fd)
        assert counted.count_reads(PPB, 16)
        counted.sample_below(FULL)
        taken(counted), events.drain()              # what was pending: taken
        in_thread(reads_of, fd, [(0, mib * PPB * PAGE)] * 3)
        c, ev = taken(counted), events.drain()
        r = ev.kind == READ
        want = pages_read(ev.first[r], batch_ends(ev.first[r], ev.last[r]))
        once = np.arange(mib * PPB)
        assert want.tolist() == np.concatenate((once, once, once)).tolist()
        assert sampled(c).tolist() == want.tolist()
        assert c.pages == 3 * mib * PPB
        assert (c.sampled[:, 1] - c.sampled[:, 0] + 1).max() > bpf_reads.SAMPLE_SPAN
        got = np.zeros(16, np.int64)                        # and every block it read counts
        got[c.blocks] = c.counts
        assert got[:mib].min() >= 3 and not got[mib:].any(), got
    finally:
        os.close(fd)


def test_the_loading_thread_and_the_probe_are_not_the_guests_reads(scratch, reader):  # noqa: F811
    path = scratch(4 * PPB)
    fd = os.open(path, os.O_RDONLY)
    try:
        r = reader(fd, exclude_tid=threading.get_native_id())
        assert r.count_reads(PPB, 4)
        r.drain()
        os.pread(fd, PAGE, 2 * PPB * PAGE)                  # the loading thread: not counted
        r.probe()                                           # a read of page 0, its own
        in_thread(os.pread, fd, PAGE, 3 * PPB * PAGE)       # the guest
        c = r.drain().counted
        assert r.probe_seen is True
        assert c.blocks.tolist() == [3] and c.counts.tolist() == [1]
        in_thread(os.pread, fd, PAGE, 0)                    # after the probe: the guest's
        assert r.drain().counted.blocks.tolist() == [0]
    finally:
        os.close(fd)


def test_a_grown_image_is_counted_again_without_losing_a_read(scratch, reader):  # noqa: F811
    path = scratch(8 * PPB)
    fd = os.open(path, os.O_RDONLY)
    try:
        r = reader(fd)
        assert r.count_reads(PPB, 4)                        # the map of a smaller image
        r.drain()
        in_thread(reads_of, fd, [(1 * PPB * PAGE, PAGE), (6 * PPB * PAGE, PAGE)])
        assert r.count_reads(PPB, 8)                        # grown: counted anew
        in_thread(reads_of, fd, [(7 * PPB * PAGE, PAGE)])
        c = r.drain().counted
        assert dict(zip(c.blocks.tolist(), c.counts.tolist())) == {1: 1, 7: 1}
    finally:
        os.close(fd)


def test_the_read_event_turned_back_on_from_outside_is_set_back_off(scratch, reader,
                                                                     tracefs_root):  # noqa: F811
    path = scratch(PPB)
    fd = os.open(path, os.O_RDONLY)
    try:
        r = reader(fd)
        assert r.count_reads(PPB, 1)
        enable = os.path.join(tracefs_root, "instances", r.name, "events", GET_PAGES, "enable")
        assert tracefs.read_text(enable).strip() == "0"
        with open(enable, "w") as f:
            f.write("1")
        changed = r.check_instance(full=True)
        assert changed == {f"events/{GET_PAGES}/enable": "1"}
        assert tracefs.read_text(enable).strip() == "0"
    finally:
        os.close(fd)


CHILD = textwrap.dedent("""
    import os, sys, threading
    from vmdisktouch.system.trace.trace_reader import READ, TraceReader
    fd = os.open(sys.argv[1], os.O_RDONLY)
    r = TraceReader(fd, name=sys.argv[2])
    try:
        print(r.count_reads(256, 1))
        print(r.counting_refused)
        r.drain()
        t = threading.Thread(target=os.pread, args=(fd, 4096, 8192))
        t.start(); t.join()
        ev = r.drain()
        print(ev.counted, ev.first[ev.kind == READ].tolist())
    finally:
        r.close()
""")


def test_without_the_bpf_capabilities_reads_stay_events_of_the_ring_buffer(scratch,
                                                                           tracefs_root):  # noqa: F811,E501
    path = scratch(PPB)
    out = subprocess.run([*without_bpf(), sys.executable, "-c", CHILD, path,
                          instance_name()], cwd=ROOT_DIR, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "False", "bpf (BPF_MAP_CREATE): Operation not permitted", "None [2]"], out.stdout


def timed_misses(fd, pages) -> int:
    """Reads of ``pages`` (page numbers) one at a time, readahead off: ns they took."""
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
    took = 0
    for p in pages:
        t0 = time.perf_counter_ns()
        os.pread(fd, PAGE, int(p) * PAGE)
        took += time.perf_counter_ns() - t0
    return took


def test_the_guests_misses_are_timed_from_the_page_added_to_the_read(scratch, reader):  # noqa: F811
    """Each read of an evicted page is one miss, timed within what its caller timed;
    the same pages read again are hits, not timed; the loading thread's are not the
    guest's."""
    path = scratch(16 * PPB)
    fd = os.open(path, os.O_RDONLY)
    try:
        r = reader(fd, exclude_tid=threading.get_native_id())
        assert r.count_reads(PPB, 16) and r.times_misses
        taken(r)
        pages = np.random.default_rng(5).choice(np.arange(1, 16 * PPB), 200, replace=False)
        os.pread(fd, PAGE, int(pages[0]) * PAGE + PAGE)      # the loading thread: not timed
        took = []
        in_thread(lambda: took.append(timed_misses(fd, pages)))
        c = taken(r)
        assert c.misses_timed == 200
        assert 0.3 * took[0] < c.miss_wait_ns <= took[0]
        in_thread(timed_misses, fd, pages)                   # cached now: hits
        assert taken(r).misses_timed == 0
    finally:
        os.close(fd)


def test_a_page_added_by_a_write_is_no_miss_of_the_threads_next_read(scratch, reader):  # noqa: F811
    """A thread that writes a page not cached adds it (as QEMU's writethrough write does),
    then reads another, cached: nothing is timed."""
    path = scratch(4 * PPB)
    fd = os.open(path, os.O_RDWR)
    try:
        r = reader(fd)
        assert r.count_reads(PPB, 4)
        os.pread(fd, PAGE, 5 * PAGE)                          # cached before
        taken(r)

        def write_then_read():
            os.pwrite(fd, b"\1" * PAGE, 3 * PPB * PAGE)      # added by the write
            os.pread(fd, PAGE, 5 * PAGE)
        in_thread(write_then_read)
        c = taken(r)
        assert c.blocks.tolist() == [0] and c.misses_timed == 0
    finally:
        os.close(fd)


def test_the_ring_buffer_times_the_same_misses_as_the_kernel(scratch, reader):  # noqa: F811
    """Where reads are events (eBPF refused), the misses are paired from the events by the
    same rule: the same reads give the same misses, within what their caller timed."""
    path = scratch(16 * PPB)
    fd = os.open(path, os.O_RDONLY)
    try:
        counted, events = reader(fd), reader(fd)
        assert counted.count_reads(PPB, 16) and not events.counting and events.times_misses
        taken(counted), events.drain()
        pages = np.random.default_rng(6).choice(np.arange(1, 16 * PPB), 150, replace=False)
        took = []
        in_thread(lambda: took.append(timed_misses(fd, pages)))
        c, e = taken(counted), events.drain()
        assert c.misses_timed == e.misses_timed == 150
        assert 0.3 * took[0] < e.miss_wait_ns <= took[0]
        assert e.miss_wait_ns == pytest.approx(c.miss_wait_ns, rel=0.1)
        in_thread(timed_misses, fd, pages)                   # hits now
        assert events.drain().misses_timed == 0
    finally:
        os.close(fd)


def test_past_the_kernels_programs_a_tracepoint_a_disks_reads_stay_events(scratch, reader):  # noqa: F811
    """The kernel runs at most 64 programs on a tracepoint, host-wide: the disk that finds
    them taken says so, its reads stay events of the ring buffer, nothing of its attempt
    stays open, and a slot freed is taken by the next disk."""
    fds, counted = [], []
    try:
        refused = None
        for _ in range(70):                          # 64, less what other tools hold
            fds.append(os.open(scratch(16), os.O_RDONLY))
            r = reader(fds[-1])
            if not r.count_reads(1, 16):
                refused = r
                break
            counted.append(r)
        assert refused is not None and len(counted) <= 64
        assert refused.counting_refused == bpf_reads.TRACEPOINT_FULL and not refused.counting
        again = reader(fds[-1])
        open_fds = len(os.listdir("/proc/self/fd"))
        assert not again.count_reads(1, 16)
        assert len(os.listdir("/proc/self/fd")) == open_fds     # its maps and programs closed
        refused.drain()
        in_thread(reads_of, fds[-1], [(0, PAGE), (5 * PAGE, PAGE)])
        ev = refused.drain()
        assert sorted(ev.first[ev.kind == READ].tolist()) == [0, 5]
        counted.pop().close()                        # a slot freed: the next disk counts
        assert reader(fds[-1]).count_reads(1, 16)
    finally:
        for r in counted:
            r.close()
        for fd in fds:
            os.close(fd)
