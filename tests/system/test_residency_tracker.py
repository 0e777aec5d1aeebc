"""ResidencyTracker on real sparse files and the real page cache.

The tracker must agree with a full ``residency.scan`` (itself cross-checked
with fincore and vmtouch in test_residency_real) after every change, while
re-reading only the ranges whose cachestat record changed. Cached extents
are mlocked by the test (``held``), so that the kernel's own reclaim (DAMON,
see FIELD-NOTES) cannot change them under the assertions.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from tests.support.images import evict, make_image
from tests.support.pagecache import fincore_pages, held, read_range
from vmdisktouch.system.observe import residency
from vmdisktouch.system.image import open_image
from vmdisktouch.system.observe.residency_tracker import ResidencyTracker

MiB = 1 << 20
GiB = 1 << 30
RANGE = 64 * MiB


@pytest.fixture
def sparse(tmp_path):
    path = make_image(tmp_path / "disk.raw", 1 * GiB)           # 16 ranges of 64 MiB
    with open_image(str(path)) as img:
        yield path, img


def full_scan(fd, size):
    return residency.scan(fd, size, MiB).counts


def test_first_scan_matches_a_full_scan_and_fincore(sparse):
    path, img = sparse
    fd = img.fd
    t = ResidencyTracker(img, MiB, range_bytes=RANGE)
    with held(path, [(3 * MiB, MiB), (200 * MiB + 4096, 8192), (900 * MiB, 5 * MiB)]):
        res = t.scan(GiB)
        np.testing.assert_array_equal(res.counts, full_scan(fd, GiB))
        assert res.resident_pages == fincore_pages(path) == 256 + 2 + 5 * 256
    assert t.last_reread == 3                                   # only the non-empty ranges


def test_only_changed_ranges_are_reread_and_the_result_stays_exact(sparse):
    path, img = sparse
    fd = img.fd
    # ranges 5, 7 and 10: none of them is refreshed by turn in these 5 scans (turns 0-3)
    t = ResidencyTracker(img, MiB, range_bytes=RANGE, refresh_every=100)
    with held(path, [(330 * MiB, 2 * MiB), (500 * MiB, MiB)]):
        t.scan(GiB)
        res = t.scan(GiB)                                       # nothing changed
        assert t.last_reread == 0
        np.testing.assert_array_equal(res.counts, full_scan(fd, GiB))
        with held(path, [(700 * MiB, 3 * MiB)]):                # one range gains pages
            res = t.scan(GiB)
            assert t.last_reread == 1
            np.testing.assert_array_equal(res.counts, full_scan(fd, GiB))
            assert res.counts[700:703].tolist() == [256] * 3
    evict(path)                                                 # every held range loses them
    res = t.scan(GiB)
    assert t.last_reread == 3
    assert res.resident_pages == 0 == fincore_pages(path)


def test_pages_moving_within_one_range_are_seen(sparse):
    path, img = sparse
    fd = img.fd
    t = ResidencyTracker(img, MiB, range_bytes=RANGE, refresh_every=3)
    read_range(path, 130 * MiB, 4096)
    t.scan(GiB)
    os.posix_fadvise(fd, 130 * MiB, 4096, os.POSIX_FADV_DONTNEED)
    read_range(path, 150 * MiB, 2 * 4096)                       # same range, new count
    res = t.scan(GiB)
    assert t.last_reread == 1
    assert res.counts[130] == 0 and res.counts[150] == 2
    # A swap that keeps every count (DONTNEED leaves no shadow entry, so the
    # evicted count does not move either) is the one change a signature misses:
    # the next refresh of its range, at most refresh_every scans later, sees it.
    os.posix_fadvise(fd, 150 * MiB, 2 * 4096, os.POSIX_FADV_DONTNEED)
    read_range(path, 170 * MiB, 2 * 4096)
    seen = []
    for _ in range(3):
        res = t.scan(GiB)
        seen.append((int(res.counts[150]), int(res.counts[170])))
    assert seen[-1] == (0, 2) and seen[0] == (2, 0), seen
    np.testing.assert_array_equal(res.counts, full_scan(fd, GiB))


def test_each_cached_range_is_reread_in_turn_and_a_size_change_rereads_all(sparse):
    path, img = sparse
    fd = img.fd
    t = ResidencyTracker(img, MiB, range_bytes=RANGE, refresh_every=3)
    # ranges 0 and 1 hold cached pages, range 9 (9 % 3 == 0, like range 0) too
    with held(path, [(10 * MiB, MiB), (100 * MiB, MiB), (600 * MiB, MiB)]):
        rereads, checked = [], []
        for _ in range(7):
            t.scan(GiB)
            rereads.append(t.last_reread)
            checked.append(t.last_checked)
        # the first scan reads all 3; then turns 0, 1, 2, 0, 1, 2 check
        # ranges {0, 9}, {1}, {}, ...: each at least every 3 scans, never all at
        # once; nothing moved, so each check is a cachestat per cached block and
        # nothing is read again
        assert rereads == [3, 0, 0, 0, 0, 0, 0]
        assert checked == [0, 2, 1, 0, 2, 1, 0]
        # (a page that moves within a range without changing its record is caught
        # by that check: test_pages_moving_within_one_range_are_seen)
        os.truncate(path, GiB + 5 * MiB)
        res = t.scan(GiB + 5 * MiB)
        assert t.last_reread == 3 and res.nblocks == 1029
        np.testing.assert_array_equal(res.counts, full_scan(fd, GiB + 5 * MiB))


def test_known_blocks_are_filled_not_descended(sparse, monkeypatch):
    """Held blocks (``known``) are counted whole and never walked, even when
    writes change their range's record every cycle; the rest stays exact."""
    path, img = sparse
    fd = img.fd
    walked = []
    real = residency.scan_ranges

    def spy(fd_, ranges, *a, **kw):
        walked.extend(ranges)
        return real(fd_, ranges, *a, **kw)

    monkeypatch.setattr(residency, "scan_ranges", spy)
    t = ResidencyTracker(img, MiB, range_bytes=RANGE, refresh_every=100)
    known = np.zeros(1024, dtype=bool)
    known[130:140] = True                                       # in range 2, not cached
    with held(path, [(129 * MiB, MiB), (141 * MiB, 2 * MiB)]):
        res = t.scan(GiB, known=known)
        assert walked == [(128 * MiB, 2 * MiB), (140 * MiB, 52 * MiB)]
        expect = full_scan(fd, GiB)
        expect[130:140] = 256
        np.testing.assert_array_equal(res.counts, expect)
        walked.clear()
        with held(path, [(135 * MiB, MiB)]):                    # range 2 changes again
            res = t.scan(GiB, known=known)
        assert walked == [(128 * MiB, 2 * MiB), (140 * MiB, 52 * MiB)]
        np.testing.assert_array_equal(res.counts, expect)
