"""core.access: trace events folded into per-block reads, writes and refaults."""

import numpy as np
import pytest

from vmdisktouch.core import access
from vmdisktouch.core.access import ADD, DELETE, READ, WRITE, AccessLog
from vmdisktouch.system.trace.ringbuf import CountedReads

MiB = 1 << 20
PAGE = 4096                # these tests' page size (test_page_size.py: others)
PPB = MiB // PAGE          # pages per 1 MiB block
S = 1_000_000_000          # ns


def feed(log, events, lost=0):
    kind, ts, first, last = (np.array(c) for c in zip(*events)) if events else ([], [], [], [])
    log.feed(kind, ts, first, last, lost)


def test_reads_mark_every_block_touched_once():
    log = AccessLog(MiB, PAGE)
    feed(log, [(READ, 1, 0, 0), (READ, 2, 5, 5),              # block 0 twice
               (READ, 3, 3 * PPB - 1, 3 * PPB),                # crosses blocks 2 and 3
               (READ, 4, 10 * PPB + 7, 10 * PPB + 7)])
    a = log.take(16)
    assert a.reads.blocks.tolist() == [0, 2, 3, 10]
    assert a.reads.values.tolist() == [1, 1, 1, 1]
    assert a.read_events == 4
    # the next cycle starts empty
    assert log.take(16).reads.blocks.size == 0


def test_reads_counted_in_the_kernel_weigh_as_their_events_at_the_drains_time():
    """The same reads, as events one by one and as the kernel's per-block counts with the
    drain's time: the same counts; the recency weight of each drain's reads is its time's."""
    events, counted = AccessLog(MiB, PAGE), AccessLog(MiB, PAGE)
    reads = [(READ, 1 * S, 0, 0)] * 3 + [(READ, 1 * S, 3 * PPB - 1, 3 * PPB)] + \
        [(READ, 1 * S, 9 * PPB, 9 * PPB)] * 5
    feed(events, reads)
    drained = counted.feed([], [], [], [], 0, CountedReads(
        np.array([0, 2, 3, 9]), np.array([3, 1, 1, 5]), 1 * S))
    assert [x.tolist() for x in drained] == [[0, 2, 3, 9], [3, 1, 1, 5]]
    counted.feed([], [], [], [], 0, CountedReads(np.array([9, 40]), np.array([2, 7]), 2 * S))
    feed(events, [(READ, 2 * S, 9 * PPB, 9 * PPB)] * 2 + [(READ, 2 * S, 40 * PPB, 40 * PPB)] * 7)
    a, b = events.take(16, now_ns=3 * S), counted.take(16, now_ns=3 * S)
    assert b.read_counts.blocks.tolist() == a.read_counts.blocks.tolist() == [0, 2, 3, 9]
    assert b.read_counts.values.tolist() == a.read_counts.values.tolist() == [3, 1, 1, 7]
    assert np.allclose(b.read_recent.values, a.read_recent.values)
    decay = np.exp(-np.array([2, 1]) / access.RATE_SECONDS)
    assert b.read_recent.values[-1] == pytest.approx(5 * decay[0] + 2 * decay[1], rel=1e-6)
    # every read fed, block 40's included; counted per block, a read across two counts twice
    assert a.read_events == 18 and b.read_events == 19


def test_reads_beyond_the_image_are_dropped():
    log = AccessLog(MiB, PAGE)
    feed(log, [(READ, 1, 20 * PPB, 20 * PPB)])
    assert log.take(16).reads.blocks.size == 0
    # with the recency weights too (the image shrank under reads: none left in it)
    feed(log, [(READ, 1, 20 * PPB, 20 * PPB)])
    a = log.take(16, now_ns=2 * S)
    assert a.reads.blocks.size == 0 and a.read_recent.blocks.size == 0
    feed(log, [(READ, 1 * S, 3 * PPB, 3 * PPB), (READ, 2 * S, 20 * PPB, 20 * PPB)])
    a = log.take(16, now_ns=2 * S)
    assert a.read_recent.blocks.tolist() == [3]
    assert a.read_recent.values[0] == pytest.approx(np.exp(-1 / access.RATE_SECONDS))


def test_writes_count_parts_like_the_checksums():
    log = AccessLog(MiB, PAGE)
    part = PPB // 16
    feed(log, [(WRITE, 1, 0, 0), (WRITE, 2, 1, 1),             # one part of block 0
               (WRITE, 3, part, part),                         # a second part of block 0
               (WRITE, 4, 5 * PPB, 5 * PPB), (WRITE, 5, 5 * PPB, 5 * PPB)])  # same page twice
    a = log.take(16)
    assert a.writes.blocks.tolist() == [0, 5]
    assert a.writes.values.tolist() == [2 / 16, 1 / 16]
    assert a.write_pages.tolist() == [0, 1, part, 5 * PPB]


@pytest.mark.parametrize("block_size, written, share", [
    (4096, [0], [1.0]),                       # one page: every part of it
    (8192, [1], [0.5]),                       # half the block's pages
    (32768, [0, 1, 9], [4 / 16, 2 / 16]),     # 8 pages: a page is two sixteenths
    (61440, [0, 14], [4 / 16]),               # 15 pages: parts of 3840 bytes, two a page
    (61440, [7], [2 / 16]),                   # bytes 28672-32767: parts 7 and 8
    (98304, [0, 23], [2 / 16]),               # 24 pages: 1.5 a part; first and last page
])
def test_a_block_not_a_multiple_of_16_pages_counts_the_parts_its_written_pages_overlap(
        block_size, written, share):
    """Any multiple of the page size is a block size (#31): the parts are the checksums'
    (``ceil(block_size / 16)`` bytes), and a dirtied page counts in each it overlaps."""
    log = AccessLog(block_size, PAGE)
    feed(log, [(WRITE, i, p, p) for i, p in enumerate(written)])
    a = log.take(64)
    assert a.writes.values.tolist() == pytest.approx(share)


def test_a_block_written_all_over_is_one():
    log = AccessLog(MiB, PAGE)
    feed(log, [(WRITE, i, i, i) for i in range(PPB)])
    a = log.take(4)
    assert a.writes.values.tolist() == [1.0]


def test_refault_is_an_addition_soon_after_a_deletion():
    log = AccessLog(MiB, PAGE)
    feed(log, [(DELETE, 1 * S, 7, 7), (ADD, 2 * S, 7, 7),        # refault of page 7
               (ADD, 3 * S, 3 * PPB, 3 * PPB),                    # first miss: not a refault
               (ADD, 4 * S, 9, 9), (DELETE, 5 * S, 9, 9)])        # added then deleted: not
    a = log.take(16, now_ns=5 * S)
    assert a.refaults.blocks.tolist() == [0]
    assert a.refaults.values.tolist() == [1 / PPB]               # one page of the block
    assert a.refault_pages == 1


def test_a_block_s_refaults_are_the_share_of_its_pages_that_refaulted():
    log = AccessLog(MiB, PAGE)
    feed(log, [(DELETE, 1 * S, 0, PPB // 2 - 1), (DELETE, 1 * S, PPB, PPB + 7),
               (ADD, 2 * S, 0, PPB - 1),                          # half of block 0 refaults
               (ADD, 2 * S, PPB, PPB + 7), (DELETE, 3 * S, PPB, PPB + 7),
               (ADD, 4 * S, PPB, PPB + 7)])                       # 8 pages of block 1, twice
    a = log.take(16, now_ns=4 * S)
    assert a.refaults.blocks.tolist() == [0, 1]
    assert a.refaults.values.tolist() == [0.5, 8 / PPB]


def test_refault_across_cycles_and_window():
    log = AccessLog(MiB, PAGE)
    feed(log, [(DELETE, 10 * S, 2 * PPB, 2 * PPB + 3)])           # a 4-page folio
    assert log.take(16, now_ns=10 * S).refaults.blocks.size == 0
    assert log.remembered_deletions == 4
    feed(log, [(ADD, 20 * S, 2 * PPB + 1, 2 * PPB + 1)])
    a = log.take(16, now_ns=20 * S)
    assert a.refaults.blocks.tolist() == [2] and a.refault_pages == 1
    # past the window: a deletion long ago is no refault, and is forgotten
    late = int((10 + access.REFAULT_SECONDS + 1) * S)
    feed(log, [(ADD, late, 2 * PPB + 2, 2 * PPB + 2)])
    assert log.take(16, now_ns=late).refaults.blocks.size == 0
    assert log.remembered_deletions == 0


def test_deletions_remembered_are_bounded(monkeypatch):
    monkeypatch.setattr(access, "MAX_DELETIONS", 10)
    log = AccessLog(MiB, PAGE)
    feed(log, [(DELETE, i, i, i) for i in range(25)])
    log.take(4)
    assert log.remembered_deletions == 10
    feed(log, [(ADD, 100, 24, 24), (ADD, 101, 0, 0)])       # the newest kept, the oldest not
    assert log.take(4).refault_pages == 1


def test_lost_events_are_summed_per_cycle():
    log = AccessLog(MiB, PAGE)
    feed(log, [], lost=3)
    feed(log, [(READ, 1, 0, 0)], lost=4)
    assert log.take(4).lost == 7
    assert log.take(4).lost == 0


def test_block_size_must_be_whole_pages():
    AccessLog(4096, PAGE)                       # one page: any multiple of the page size (#31)
    for bad in (2048, 6144):
        with pytest.raises(ValueError, match="page size"):
            AccessLog(bad, PAGE)


def test_grouped_running_max_does_not_leak_between_groups():
    values = np.array([5, -1, 3, -1, 9, -1], dtype=np.int64)
    group = np.array([0, 0, 1, 1, 2, 2])
    assert access._grouped_running_max(values, group).tolist() == [5, 5, 3, 3, 9, 9]
    big = np.array([2 ** 62, -1, 2 ** 61], dtype=np.int64)
    assert access._grouped_running_max(big, np.array([0, 0, 1])).tolist() == \
        [2 ** 62, 2 ** 62, 2 ** 61]


def test_event_residency_counts_adds_and_deletes_between_reconciliations():
    r = access.EventResidency(4, MiB, PAGE)
    r.reconcile(np.array([0.5, 0, 1, 0]))
    assert r.counts.tolist() == [PPB // 2, 0, PPB, 0]
    r.feed(np.array([ADD, ADD, DELETE, DELETE]), np.array([0, PPB, 2 * PPB, 3 * PPB]),
           np.array([3, PPB, 2 * PPB + 1, 3 * PPB]))       # a 4-page folio; a missed add
    assert r.counts.tolist() == [PPB // 2 + 4, 1, PPB - 2, 0]     # clipped at 0
    r.feed(np.array([ADD]), np.array([9 * PPB]), np.array([9 * PPB]))   # beyond the image
    assert r.resident_pages() == PPB // 2 + 4 + 1 + PPB - 2
    assert r.fraction()[1] == np.float32(1 / PPB)
    r.resize(2)
    assert r.counts.tolist() == [PPB // 2 + 4, 1]


def test_event_residency_splits_a_folio_across_blocks():
    r = access.EventResidency(3, MiB, PAGE)
    r.feed(np.array([ADD]), np.array([PPB - 2]), np.array([2 * PPB + 1]))  # 2 + 256 + 2 pages
    assert r.counts.tolist() == [2, PPB, 2]
