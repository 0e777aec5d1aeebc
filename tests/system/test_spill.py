"""The spiller on real files and the real page cache: read unlocked, only into free memory.

Residency is measured with mincore(2) on a separate mapping at once after
each step (the kernel here pages out idle unheld page cache on its own, see
FIELD-NOTES). Locked memory is VmLck of this process.
"""

from __future__ import annotations

import os
import time

import pytest

from tests.support.images import evict, make_image
from tests.support.pagecache import PAGE, read_range
from tests.system.test_holder import locked, resident_pages
from vmdisktouch.system.image import open_image
from vmdisktouch.system.hold.spill import Spiller

MiB = 1 << 20
BS = MiB
PLENTY = 1 << 50


@pytest.fixture
def image(tmp_path):
    path = make_image(tmp_path / "disk.raw", 64 * MiB, sparse=False)
    evict(path)
    img = open_image(path)
    yield img
    img.close()


def cached(fd: int, offset: int, length: int, *, expect: int) -> int:
    """Pages of the range resident once the reads ``WILLNEED`` started have completed
    (mincore counts a page once it is read): polled until ``expect`` or 5 s."""
    deadline = time.monotonic() + 5
    while True:
        n = resident_pages(fd, offset, length)
        if n >= expect or time.monotonic() > deadline:
            return n
        time.sleep(0.02)


def spiller(img, *, free=PLENTY, room=None, **kw):
    return Spiller(img, BS, mem_free=lambda: free, own_room=lambda: room,
                   chunk_bytes=4 * MiB, **kw)


def test_spilled_runs_are_cached_exactly_and_not_locked(image):
    before = locked()
    r = spiller(image).warm([(8, 16), (40, 44)], min_free=0)
    assert r.target_bytes == 12 * MiB and r.stopped is None
    assert r.read_bytes == 12 * MiB                       # all of it was cold
    assert cached(image.fd, 8 * MiB, 8 * MiB, expect=8 * MiB // PAGE) == 8 * MiB // PAGE
    assert cached(image.fd, 40 * MiB, 4 * MiB, expect=4 * MiB // PAGE) == 4 * MiB // PAGE
    # Nothing outside the runs: WILLNEED over exactly their bytes.
    assert resident_pages(image.fd, 0, 8 * MiB) == 0
    assert resident_pages(image.fd, 16 * MiB, 24 * MiB) == 0
    assert resident_pages(image.fd, 44 * MiB, 20 * MiB) == 0
    assert locked() == before                             # cached, never locked


def test_what_is_cached_already_is_not_read_again(image):
    read_range(image.path, 8 * MiB, 4 * MiB)              # the first chunk: the guest's
    r = spiller(image).warm([(8, 16)], min_free=0)
    assert r.read_bytes == 4 * MiB                        # only the cold chunk
    assert spiller(image).warm([(8, 16)], min_free=0).read_bytes == 0


def test_a_chunk_with_a_few_holes_reads_only_the_pieces_around_them(image, monkeypatch):
    from vmdisktouch.system import files
    read_range(image.path, 0, 16 * MiB)
    holes = [3 * MiB + 5 * PAGE, 9 * MiB, 15 * MiB + 100 * PAGE]
    for off in holes:
        os.posix_fadvise(image.fd, off, PAGE, os.POSIX_FADV_DONTNEED)
    assert resident_pages(image.fd, 0, 16 * MiB) == 16 * MiB // PAGE - 3
    reads = []
    real = files.read_ahead
    monkeypatch.setattr(files, "read_ahead", lambda fd, off, n: reads.append((off, n)) or
                        real(fd, off, n))
    r = Spiller(image, BS, mem_free=lambda: PLENTY, chunk_bytes=16 * MiB).warm(
        [(0, 16)], min_free=0)
    assert r.read_bytes == 3 * PAGE
    piece = files.WILLNEED_BYTES
    assert sorted(reads) == [(h // piece * piece, piece) for h in holes]   # 3 calls, not 128
    assert cached(image.fd, 0, 16 * MiB, expect=16 * MiB // PAGE) == 16 * MiB // PAGE


def test_the_residency_given_says_what_to_read_without_a_look(image, monkeypatch):
    """The source's residency says blocks 8-11 are cached (they are), block 13 half and
    12, 14, 15 not: no cachestat at all; the chunk of 8-11 is passed, and of 12-15 only
    what the residency says is missing is counted and read, by blocks (13's cached half
    is read again by WILLNEED, which costs a lookup, not I/O); both reported cached."""
    import numpy as np
    read_range(image.path, 8 * MiB, 4 * MiB)
    sp = spiller(image)
    monkeypatch.setattr(sp._cachestat, "uncached_bytes",
                        lambda off, n: pytest.fail(f"cachestat looked at {off}"))
    resident = np.zeros(64, np.float32)
    resident[8:12] = 1.0
    resident[13] = 0.5
    r = sp.warm([(8, 16)], min_free=0, resident=resident)
    assert r.read_bytes == 3 * MiB + MiB // 2
    assert r.cached == ((8, 12), (12, 16))
    assert cached(image.fd, 12 * MiB, 4 * MiB, expect=4 * MiB // PAGE) == 4 * MiB // PAGE
    assert resident_pages(image.fd, 16 * MiB, 8 * MiB) == 0


def test_the_last_partial_block_is_looked_up(tmp_path, monkeypatch):
    """An image of 10.5 MiB: the residency counts its last block's missing tail as
    uncached, so that block's chunk is looked up with cachestat, the others are not."""
    import numpy as np
    path = make_image(tmp_path / "odd.raw", 10 * MiB + MiB // 2, sparse=False)
    evict(path)
    img = open_image(path)
    try:
        sp = spiller(img)
        looked = []
        real = sp._cachestat.uncached_bytes
        monkeypatch.setattr(sp._cachestat, "uncached_bytes",
                            lambda off, n: looked.append(off) or real(off, n))
        r = sp.warm([(0, 11)], min_free=0, resident=np.zeros(11, np.float32))
        assert looked and all(off >= 8 * MiB for off in looked)
        assert r.read_bytes == 10 * MiB + MiB // 2
    finally:
        img.close()


def test_free_memory_floor_stops_the_spill(image):
    # MemFree 10M above the floor: the first 4M chunk and the second fit, not the third.
    r = spiller(image, free=10 * MiB + 100).warm([(0, 32)], min_free=100)
    assert (r.read_bytes, r.stopped) == (8 * MiB, "memory")
    assert cached(image.fd, 0, 8 * MiB, expect=8 * MiB // PAGE) == 8 * MiB // PAGE
    assert resident_pages(image.fd, 8 * MiB, 24 * MiB) == 0


def test_own_group_room_stops_the_spill(image):
    r = spiller(image, room=5 * MiB).warm([(0, 32)], min_free=0)
    assert (r.read_bytes, r.stopped) == (4 * MiB, "group")
    assert resident_pages(image.fd, 4 * MiB, 28 * MiB) == 0
    assert spiller(image, room=0).warm([(40, 48)], min_free=0).read_bytes == 0


def test_holes_of_a_sparse_file_are_not_spilled(tmp_path):
    path = make_image(tmp_path / "sparse.raw", 64 * MiB)          # all hole
    with open(path, "r+b") as f:
        f.seek(20 * MiB)
        f.write(os.urandom(2 * MiB))                              # data in blocks 20-21
        f.flush()
        os.fsync(f.fileno())
    evict(path)
    img = open_image(path)
    try:
        r = spiller(img).warm([(0, 32)], min_free=0)
        assert r.read_bytes == 2 * MiB
        assert cached(img.fd, 20 * MiB, 2 * MiB, expect=2 * MiB // PAGE) == 2 * MiB // PAGE
        assert resident_pages(img.fd, 0, 20 * MiB) == 0
        assert resident_pages(img.fd, 22 * MiB, 10 * MiB) == 0
    finally:
        img.close()


def test_the_spill_is_paced_and_stops_with_the_daemon(image):
    now = [0.0]
    waits = []

    def sleep(s):
        waits.append(s)
        now[0] += s
        return len(waits) >= 2                            # the stop event fires on the 2nd wait

    r = spiller(image, load_rate=4 * MiB, sleep=sleep, clock=lambda: now[0]).warm(
        [(0, 32)], min_free=0)
    assert waits == [1.0, 1.0]                            # 4M chunks at 4M/s
    assert (r.read_bytes, r.stopped) == (8 * MiB, "stopping")


def drop(img, offset: int, length: int) -> None:
    """Reclaim taking a range: its clean pages dropped."""
    os.posix_fadvise(img.fd, offset, length, os.POSIX_FADV_DONTNEED)
    assert resident_pages(img.fd, offset, length) == 0


def test_a_chunk_reclaim_keeps_taking_is_backed_off(image, monkeypatch):
    """Read, then evicted (reclaim took it): skipped for 2 calls, read once more; taken
    again: skipped for 4. A chunk the call does not name is forgotten, and one never
    read before is read at once."""
    sp = spiller(image)
    looked = []
    real = sp._cachestat.uncached_bytes
    monkeypatch.setattr(sp._cachestat, "uncached_bytes",
                        lambda off, n: looked.append(off) or real(off, n))

    def call(runs=((0, 4), (8, 12))):
        r = sp.warm(list(runs), min_free=0)
        return r.read_bytes, r.backed_off_bytes, r.cached

    assert call() == (8 * MiB, 0, ((0, 4), (8, 12)))      # call 1: both read
    cached(image.fd, 0, 12 * MiB, expect=8 * MiB // PAGE)
    drop(image, 0, 4 * MiB)                          # reclaim takes chunk 0
    assert call() == (0, 4 * MiB, ((8, 12),))              # 2: backed off, not read
    looked.clear()
    assert call() == (0, 4 * MiB, ((8, 12),))              # 3: not even looked at
    assert 0 not in looked
    assert call()[:2] == (4 * MiB, 0)                      # 4: read once more
    cached(image.fd, 0, 4 * MiB, expect=4 * MiB // PAGE)
    drop(image, 0, 4 * MiB)
    results = [call()[:2] for _ in range(5)]               # 5: taken again; 6-8 skipped
    assert results == [(0, 4 * MiB)] * 4 + [(4 * MiB, 0)]  # 9: read
    # Left out of the runs once, it starts afresh: evicted after a read, it is backed
    # off again from the first level, and a chunk the spill never read is read at once.
    cached(image.fd, 0, 4 * MiB, expect=4 * MiB // PAGE)
    call([(8, 12)])
    drop(image, 0, 4 * MiB)
    assert call([(0, 4), (16, 20)])[:2] == (8 * MiB, 0)
    cached(image.fd, 0, 4 * MiB, expect=4 * MiB // PAGE)
    drop(image, 0, 4 * MiB)
    assert [call([(0, 4)])[:2] for _ in range(3)] == [(0, 4 * MiB)] * 2 + [(4 * MiB, 0)]


def test_a_chunk_in_two_runs_is_not_backed_off_by_its_own_read(image):
    r = spiller(image).warm([(0, 1), (2, 3)], min_free=0)
    assert (r.read_bytes, r.backed_off_bytes) == (2 * MiB, 0)
