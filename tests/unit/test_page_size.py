"""The page size is the host's, read once (``system.libc.PAGE_SIZE``) and passed to the
core: with 64 KiB pages (arm64, ppc64le) a page index ``i`` is byte ``i * 65536``.

Each test runs the same events under 4 KiB and 64 KiB pages and expects different
blocks: a 4096 hard-coded anywhere on the trace path fails them. And the block count
of an image has one rule (``core.runs.blocks_of``), which ``Image.block_count`` asks.
"""

from __future__ import annotations

import pathlib
from types import SimpleNamespace

import numpy as np
import pytest

from vmdisktouch.core.access import ADD, DELETE, READ, WRITE, AccessLog, EventResidency
from vmdisktouch.core.runs import blocks_of
from vmdisktouch.daemon.sources import TraceSource
from vmdisktouch.system import libc
from vmdisktouch.system.image import Image, ImageIdentity

KiB, MiB = 1 << 10, 1 << 20
SMALL, LARGE = 4 * KiB, 64 * KiB
S = 1_000_000_000
PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "vmdisktouch"


def feed(log, events, lost=0):
    kind, ts, first, last = (np.array(c, dtype=np.int64) for c in zip(*events))
    log.feed(kind.astype(np.uint8), ts, first, last, lost)


@pytest.mark.parametrize("page_size, block", [(LARGE, 1), (SMALL, 0)])
def test_a_read_page_index_is_in_pages_of_the_given_size(page_size, block):
    log = AccessLog(2 * MiB, page_size)
    feed(log, [(READ, 1, 40, 40)])          # 64 KiB pages: byte 2.5 MiB; 4 KiB: 160 KiB
    acc = log.take(4)
    assert acc.reads.blocks.tolist() == [block]
    assert log.pages_per_block == 2 * MiB // page_size


def test_a_read_range_spans_the_blocks_of_its_bytes_at_64k_pages():
    log = AccessLog(MiB, LARGE)             # 16 pages a block
    feed(log, [(READ, 1, 10, 40)])          # bytes 640 KiB .. 2.625 MiB
    assert log.take(8).reads.blocks.tolist() == [0, 1, 2]
    log = AccessLog(MiB, SMALL)             # 256 pages a block
    feed(log, [(READ, 1, 10, 40)])          # bytes 40 KiB .. 164 KiB
    assert log.take(8).reads.blocks.tolist() == [0]


def test_writes_are_sixteenths_of_a_block_of_64k_pages():
    log = AccessLog(2 * MiB, LARGE)         # 32 pages a block, 2 a part
    feed(log, [(WRITE, 1, 32, 32), (WRITE, 2, 33, 33), (WRITE, 3, 63, 63)])
    acc = log.take(4)
    assert acc.writes.blocks.tolist() == [1]
    assert acc.writes.values.tolist() == [pytest.approx(2 / 16)]   # parts 0 and 15
    assert acc.write_pages.tolist() == [32, 33, 63]
    log = AccessLog(2 * MiB, SMALL)         # the same pages: one part of block 0
    feed(log, [(WRITE, 1, 32, 32), (WRITE, 2, 33, 33), (WRITE, 3, 63, 63)])
    acc = log.take(4)
    assert acc.writes.blocks.tolist() == [0]
    assert acc.writes.values.tolist() == [pytest.approx(1 / 16)]


def test_refaults_are_the_share_of_the_block_of_64k_pages():
    log = AccessLog(MiB, LARGE)             # 16 pages a block
    feed(log, [(DELETE, 1 * S, 16, 23), (ADD, 2 * S, 16, 23)])
    acc = log.take(4, now_ns=3 * S)
    assert acc.refaults.blocks.tolist() == [1]
    assert acc.refaults.values.tolist() == [pytest.approx(0.5)]
    assert acc.refault_pages == 8


@pytest.mark.parametrize("page_size, fraction", [(LARGE, [1.0, 0.5, 0.0]),
                                                 (SMALL, [24 / 256, 0.0, 0.0])])
def test_event_residency_counts_pages_of_the_given_size(page_size, fraction):
    r = EventResidency(3, MiB, page_size)
    r.feed(np.array([ADD]), np.array([0]), np.array([23]))     # 24 pages from byte 0
    assert r.fraction().tolist() == pytest.approx(fraction)
    assert r.resident_pages() == 24
    r.reconcile(np.array([1.0, 0.0, 0.0]))
    assert r.resident_pages() == MiB // page_size


def test_a_block_of_fewer_than_16_pages_counts_the_parts_its_written_pages_overlap():
    log = AccessLog(MiB // 2, LARGE)        # 8 pages: a page is 2 of the 16 parts (#31)
    feed(log, [(WRITE, 1, 0, 0), (WRITE, 2, 9, 9), (WRITE, 3, 10, 10)])
    acc = log.take(4)
    assert acc.writes.blocks.tolist() == [0, 1]
    assert acc.writes.values.tolist() == [pytest.approx(2 / 16), pytest.approx(4 / 16)]
    with pytest.raises(ValueError, match="page size"):
        AccessLog(32 * KiB, LARGE)          # less than a page
    with pytest.raises(ValueError, match="page size"):
        EventResidency(1, 32 * KiB, LARGE)  # less than a page


class FakeReader:
    """What ``TraceSource`` asks of a ``TraceReader``: its page size and its drains."""

    def __init__(self, page_size: int):
        self.page_size = page_size
        self.buffer_kb, self.last_bytes = 1024, 0
        self.name, self.target = "fake", "fake"
        self.queue: list = []
        self.probe_seen = None
        self.counting = False               # reads are events, as where eBPF is refused
        self.times_misses = False

    def count_reads(self, pages_per_block, nblocks):
        return False

    def sample_below(self, threshold):
        self.sample_threshold = threshold

    def take_counted(self):
        return None

    def check_instance(self, full=False):
        return {}                           # its switches as set up

    def probe(self):
        self.probe_seen = True

    def drain(self):
        events = self.queue.pop(0) if self.queue else []
        cols = [np.array(c, dtype=np.int64) for c in zip(*events)] or \
            [np.zeros(0, np.int64)] * 4
        return SimpleNamespace(kind=cols[0].astype(np.uint8), ts=cols[1], first=cols[2],
                               last=cols[3], lost=0, counted=None, miss_wait_ns=0,
                               misses_timed=0)


class FakeTracker:
    def __init__(self, nblocks: int):
        self.nblocks = nblocks

    def scan(self, size, known=None):
        return SimpleNamespace(fraction=lambda: np.zeros(self.nblocks, np.float32))


@pytest.mark.parametrize("explicit", [False, True])
def test_the_trace_source_maps_page_indices_with_the_readers_page_size(explicit):
    n = 4
    reader = FakeReader(LARGE if not explicit else SMALL)
    kw = {"page_size": LARGE} if explicit else {}
    src = TraceSource(reader, FakeTracker(n), MiB, n, clock_ns=lambda: 10 * S, **kw)
    assert src.page_size == LARGE
    assert src.log.pages_per_block == src.residency.pages_per_block == 16
    config = SimpleNamespace()
    held = np.zeros(n, dtype=bool)
    src.observe(n * MiB, held, config)                # the first cycle: reconciled, empty
    reader.queue.append([(ADD, 1 * S, 16, 31),        # block 1 (bytes 1..2 MiB) cached
                         (READ, 2 * S, 40, 40),       # byte 2.5 MiB: block 2
                         (WRITE, 3 * S, 56, 56)])     # byte 3.5 MiB: block 3, part 8
    seen = src.observe(n * MiB, held, config)
    assert seen.reads.blocks.tolist() == [2]
    assert seen.rewritten.blocks.tolist() == [3]
    assert seen.resident.tolist() == [0.0, 1.0, 0.0, 0.0]
    assert seen.resident_bytes == MiB                 # 16 pages of 64 KiB


def test_the_trace_source_at_4k_pages_puts_the_same_events_elsewhere():
    n = 4
    reader = FakeReader(SMALL)
    src = TraceSource(reader, FakeTracker(n), MiB, n, clock_ns=lambda: 10 * S)
    src.observe(n * MiB, np.zeros(n, dtype=bool), SimpleNamespace())
    reader.queue.append([(ADD, 1 * S, 16, 31), (READ, 2 * S, 40, 40), (WRITE, 3 * S, 56, 56)])
    seen = src.observe(n * MiB, np.zeros(n, dtype=bool), SimpleNamespace())
    assert seen.reads.blocks.tolist() == [0]
    assert seen.rewritten.blocks.tolist() == [0]
    assert seen.resident.tolist() == [16 / 256, 0.0, 0.0, 0.0]
    assert seen.resident_bytes == 16 * SMALL


def test_the_page_size_is_read_from_the_system_once():
    """Only ``system/libc.py`` asks ``sysconf``; nothing hard-codes a page of 4096."""
    from vmdisktouch.config import settings
    from vmdisktouch.system.cgroup import memcg
    from vmdisktouch.system.trace import trace_reader
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text()
        if path.name != "libc.py":
            assert "SC_PAGE_SIZE" not in text, path
        assert "PAGE = 4096" not in text, path
    assert settings.PAGE_SIZE == memcg.PAGE_SIZE == libc.PAGE_SIZE
    assert not hasattr(trace_reader, "PAGE")


@pytest.mark.parametrize("size, block_size, count", [
    (0, MiB, 0), (1, MiB, 1), (MiB, MiB, 1), (MiB + 1, MiB, 2), (5 * MiB - 1, 2 * MiB, 3)])
def test_blocks_of_rounds_a_short_last_block_up(size, block_size, count):
    assert blocks_of(size, block_size) == count
    assert isinstance(blocks_of(np.int64(size), block_size), int)


def test_the_image_owns_its_block_count_at_its_current_size():
    image = Image("disk.img", -1, "file", 5 * MiB + 1, "raw", ImageIdentity(0, 0))
    assert image.block_count(MiB) == 6
    assert image.block_count(2 * MiB) == 3
    image.size = 4 * MiB                     # as refresh_size leaves it
    assert image.block_count(MiB) == 4
