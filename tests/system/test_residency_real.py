"""residency.scan on the real page cache, cross-checked with fincore and vmtouch.

Each state is built with buffered reads under POSIX_FADV_RANDOM (no
readahead, so exactly the pages read are cached) and measured at once, the
tools back to back. The kernel here pages out idle page cache on its own
(DAMON, see FIELD-NOTES). Its age is per physical region, sampled on one
page, so freshly read pages that land in a region it judges cold can go
within seconds, not only after a minute: measured here, a 1 TiB sparse image
lost ~5 % of 160 MiB just read between two scans ten seconds apart. So the
states are also held with mmap + MADV_RANDOM + mlock (``held``) while they
are measured: mlocked pages are unevictable, and faulting already-cached
pages with MADV_RANDOM reads nothing more.

The image is opened with a plain ``os.open`` (no read), so the scanner itself
brings nothing into the cache. Files live under pytest's ``tmp_path``.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from tests.support.images import evict, make_image
from tests.support.pagecache import PAGE, fincore_pages, held, page_ranges, vmtouch_pages
from vmdisktouch.system import libc
from vmdisktouch.system.observe import residency
from vmdisktouch.system.image import size_of_fd

MiB = 1 << 20
GiB = 1 << 30

# (offset, length) reads that straddle block boundaries, start mid-page-run,
# cover whole blocks and end at odd pages.
SCATTERED = [(4096, 4096), (MiB - 4096, 3 * 4096), (5 * MiB, 3 * MiB),
             (20 * MiB + 12288, 7 * 4096), (40 * MiB, 1 * MiB + 4096)]


def expected_ranges(reads):
    """Page-aligned, sorted, merged byte ranges of a list of reads."""
    return [tuple(r) for r in page_ranges(reads)]


def scan_path(path, *, use_cachestat=True, want_ranges=True, kind="file", block_size=MiB):
    fd = os.open(str(path), os.O_RDONLY)
    try:
        return residency.scan(fd, size_of_fd(fd, kind), block_size,
                              want_ranges=want_ranges, use_cachestat=use_cachestat)
    finally:
        os.close(fd)


def assert_matches_tools(path, expected_pages):
    """scan == fincore == vmtouch == expected, measured back to back."""
    res = scan_path(path)
    fin = fincore_pages(path)
    vmt = vmtouch_pages(path)
    again = scan_path(path)
    assert (res.resident_pages, fin, vmt, again.resident_pages) == (expected_pages,) * 4
    assert res.total_pages == -(-os.path.getsize(path) // PAGE)
    return res


@pytest.fixture
def image64(tmp_path):
    """A 64 MiB + 3 pages + 100 bytes non-sparse image (odd tail block), evicted."""
    path = make_image(tmp_path / "disk.raw", 64 * MiB + 3 * PAGE + 100, sparse=False)
    evict(path)
    return path


def test_cachestat_is_available_here():
    """The fast path is what the other tests exercise (kernel >= 6.5 here)."""
    assert libc_cachestat_available()


def libc_cachestat_available():
    from vmdisktouch.system import libc
    fd = os.open("/proc/self/exe", os.O_RDONLY)
    try:
        return libc.CacheStatCaller(fd).available
    finally:
        os.close(fd)


def test_fully_evicted(image64):
    res = assert_matches_tools(image64, 0)
    assert res.ranges == []
    assert not res.counts.any()


def test_partly_read_at_several_ranges(image64):
    want = expected_ranges(SCATTERED)
    with held(image64, SCATTERED):
        res = assert_matches_tools(image64, sum(n for _, n in want) // PAGE)
    assert res.ranges == want
    # per-block counts: block 0 has page 1 and page 255, block 1 pages 0-1
    assert res.counts[0] == 2 and res.counts[1] == 2 and res.counts[2] == 0
    assert list(res.counts[5:8]) == [256, 256, 256]
    assert res.counts[20] == 7 and res.counts[40] == 256 and res.counts[41] == 1
    assert res.counts.sum() == res.resident_pages


def test_fully_read(image64):
    size = os.path.getsize(image64)
    with held(image64, [(0, size)]):
        res = assert_matches_tools(image64, -(-size // PAGE))
    assert res.ranges == [(0, size)]           # clipped to the file's end, not the page's
    assert res.counts[-1] == 4                  # 3 pages + 100 bytes
    np.testing.assert_array_equal(res.counts, res.block_pages())
    assert np.all(res.fraction() == 1.0)


def test_sparse_with_a_few_cached_extents(tmp_path):
    path = make_image(tmp_path / "sparse.raw", 64 * GiB)       # takes no space
    reads = [(0, 4 * PAGE), (3 * GiB + 5 * PAGE, 2 * MiB), (17 * GiB, 16 * MiB),
             (63 * GiB + 1000 * PAGE, 9 * PAGE), (64 * GiB - MiB, MiB)]
    want = expected_ranges(reads)
    with held(path, reads):
        res = assert_matches_tools(path, sum(n for _, n in want) // PAGE)
    assert res.ranges == want
    assert res.used_cachestat
    assert res.nblocks == 64 * 1024


@pytest.fixture
def loop_device(loop_device_of):
    """A 64 MiB loop device over a sparse file; always detached."""
    return loop_device_of(64 * MiB)


def test_loop_block_device_partly_read(loop_device):
    """A block device's page cache is dropped when its last opener closes it, so
    the reader keeps it open, as QEMU does with an LVM volume.

    fincore (util-linux 2.38) takes the size from st_size, which is 0 for a
    block device, so it always says 0 pages here: the check is against vmtouch,
    which asks the device for its size, and against the exact pages read.
    """
    keep = os.open(loop_device, os.O_RDONLY)
    try:
        os.posix_fadvise(keep, 0, 0, os.POSIX_FADV_DONTNEED)   # drop what losetup probed
        reads = [(MiB, 2 * PAGE), (10 * MiB + PAGE, 3 * PAGE), (32 * MiB, 4 * MiB)]
        want = expected_ranges(reads)
        pages = sum(n for _, n in want) // PAGE
        with held(loop_device, reads):
            res = scan_path(loop_device, kind="block")
            vmt = vmtouch_pages(loop_device)
            mc = scan_path(loop_device, kind="block", use_cachestat=False)
        assert (res.resident_pages, vmt, mc.resident_pages) == (pages, pages, pages)
        assert res.ranges == want == mc.ranges
        assert res.size_bytes == 64 * MiB and res.total_pages == 64 * MiB // PAGE
        assert fincore_pages(loop_device) == 0       # the fincore limitation above
    finally:
        os.close(keep)


@pytest.mark.parametrize("block_size", [PAGE, 64 * 1024, MiB, 4 * MiB, 3 * MiB])
def test_cachestat_and_mincore_paths_agree(image64, block_size):
    with held(image64, SCATTERED + [(os.path.getsize(image64) - 2 * PAGE, 2 * PAGE)]):
        fast = scan_path(image64, block_size=block_size)
        counts_only = scan_path(image64, block_size=block_size, want_ranges=False)
        slow = scan_path(image64, block_size=block_size, use_cachestat=False)
        fin = fincore_pages(image64)
    assert fast.used_cachestat and not slow.used_cachestat
    np.testing.assert_array_equal(fast.counts, slow.counts)
    np.testing.assert_array_equal(counts_only.counts, slow.counts)
    assert fast.ranges == slow.ranges
    assert fast.resident_pages == fin


def test_cachestat_and_mincore_paths_agree_on_sparse_32gib(tmp_path):
    path = make_image(tmp_path / "big.raw", 32 * GiB)    # mincore-only: ~1 s per 32 GiB
    rng = np.random.default_rng(7)
    offs = sorted(int(o) * MiB for o in rng.choice(32 * 1024, size=40, replace=False))
    reads = [(o + PAGE, MiB // 2) for o in offs]
    with held(path, reads):
        fast = scan_path(path)
        slow = scan_path(path, use_cachestat=False)
        fin = fincore_pages(path)
    np.testing.assert_array_equal(fast.counts, slow.counts)
    assert fast.ranges == slow.ranges == expected_ranges(reads)
    assert fast.resident_pages == fin == 40 * (MiB // 2) // PAGE


def test_counts_without_ranges_are_the_same(image64):
    with held(image64, SCATTERED):
        with_r = scan_path(image64)
        without = scan_path(image64, want_ranges=False)
    assert without.ranges is None
    np.testing.assert_array_equal(with_r.counts, without.counts)
