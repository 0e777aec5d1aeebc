"""core.mrc: reuse distances exact against a real LRU, sampled (SHARDS) against exact."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest

from vmdisktouch.core.mrc import MAX_PAGES, MissRatioCurve, page_hash

SIZES = [2 ** k for k in range(0, 20)]          # bin edges: the exact curve is exact there


def lru_hits(pages, size: int) -> float:
    """The share of reads an LRU cache of ``size`` pages serves, simulated."""
    cache: OrderedDict[int, None] = OrderedDict()
    hits = 0
    for p in pages:
        if p in cache:
            hits += 1
            cache.move_to_end(p)
        else:
            cache[p] = None
            if len(cache) > size:
                cache.popitem(last=False)
    return hits / len(pages)


def exact(pages) -> MissRatioCurve:
    m = MissRatioCurve(max_pages=None, rate=1.0)
    m.feed(pages)
    return m


def zone_reads(rng, n: int, zone: int, image: int, share: float) -> np.ndarray:
    """``share`` of the reads in the first ``zone`` pages, the rest over ``image``."""
    hot = rng.random(n) < share
    return np.where(hot, rng.integers(0, zone, n), rng.integers(0, image, n))


def test_exact_distances_give_what_a_real_lru_serves():
    rng = np.random.default_rng(1)
    pages = np.concatenate([rng.zipf(1.3, 6000) % 3000, rng.integers(0, 500, 4000),
                            np.tile(np.arange(300), 5)])
    m = exact(pages)
    for size in [1, 2, 4, 16, 64, 256, 512, 1024, 4096]:
        assert m.hit_ratio(size) == pytest.approx(lru_hits(pages.tolist(), size), abs=1e-9)


def test_the_exact_computation_renumbers_its_times_without_a_change():
    rng = np.random.default_rng(2)
    pages = rng.integers(0, 100, 5000)
    small = MissRatioCurve(max_pages=None, rate=1.0)
    small._tree = type(small._tree)(256)          # full every 256 reads: renumbered often
    small.feed(pages)
    assert np.allclose(small.curve(SIZES), exact(pages).curve(SIZES))


@pytest.mark.parametrize("workload", ["zone", "zipf", "loop", "uniform"])
def test_the_sampled_curve_is_within_two_points_of_the_exact_one(workload):
    rng = np.random.default_rng(3)
    n = 300_000
    pages = {
        "zone": lambda: zone_reads(rng, n, 40_000, 500_000, 0.7),
        "zipf": lambda: (rng.zipf(1.2, n) * 7919) % 1_000_000,
        "loop": lambda: np.tile(np.arange(30_000), n // 30_000) + 10**6,
        "uniform": lambda: rng.integers(0, 200_000, n),
    }[workload]()
    sampled = MissRatioCurve()
    sampled.feed(pages)
    assert sampled.sampled_pages <= MAX_PAGES and sampled.rate < 1
    sizes = [2 ** k for k in range(8, 21)]
    err = np.abs(sampled.curve(sizes) - exact(pages).curve(sizes))
    assert err.mean() <= 0.02, err


def test_the_sample_stays_at_its_size_whatever_the_image():
    m = MissRatioCurve(max_pages=1000)
    m.feed(np.arange(5_000_000))
    assert 900 <= m.sampled_pages <= 1000
    assert m.rate == pytest.approx(1000 / 5_000_000, rel=0.2)
    assert m.hit_ratio(1 << 30) < 0.01                     # never a read twice


def test_a_changed_working_set_shows_after_a_few_half_lives():
    rng = np.random.default_rng(4)
    m = MissRatioCurve(half_life=60)
    m.feed(np.tile(np.arange(2000), 100))                  # 2,000 pages, read over and over
    assert m.hit_ratio(4096) > 0.95
    for _ in range(6):                                    # then uniform over 1 M pages
        m.decay(60)
        m.feed(rng.integers(10**7, 10**7 + 10**6, 100_000))
    assert m.hit_ratio(4096) < 0.1


def test_the_hash_samples_an_aligned_zone_evenly():
    h = page_hash(np.arange(1 << 20))
    for lo in range(0, 1 << 20, 1 << 16):                 # each 256 MiB of 4 KiB pages
        share = float((h[lo:lo + (1 << 16)] < (1 << 24) // 64).mean())
        assert share == pytest.approx(1 / 64, rel=0.1)


def test_a_batch_above_the_ceiling_lowers_the_rate_at_once():
    """400 sampled reads a second, in a bucket of ten seconds' worth."""
    m = MissRatioCurve(max_pages=None, max_per_second=400)
    m.feed(np.arange(100_000), seconds=1.0)           # the bucket, full: 4,000
    assert m.sampled_pages == 4000 and m.rate == pytest.approx(0.04, rel=0.1)
    m.feed(np.arange(100_000), seconds=0.5)           # the same pages: 200 more allowed
    assert m.sampled_pages == 200 and m.hit_ratio(200_000) == pytest.approx(0.5, abs=0.03)
    m.feed(np.arange(100_000), seconds=100.0)         # slower: the rate stays
    assert m.sampled_pages == 200


def test_the_pages_behind_lost_samples_leave_the_total():
    """The kernel's ring lost some samples: the reads they stood for are not counted as
    reads the sample missed (SHARDS-adj would call them hits)."""
    pages = np.tile(np.arange(4096), 3)
    whole = MissRatioCurve(rate=0.25)
    whole.feed(pages)
    h = page_hash(pages) < whole.threshold
    part = MissRatioCurve(rate=0.25)
    kept = np.flatnonzero(h)
    part.feed(pages[kept[:-300]], total=pages.size, lost=300)
    assert part.hit_ratio(8) < 0.05 and whole.hit_ratio(8) < 0.05
    assert part.hit_ratio(8192) == pytest.approx(whole.hit_ratio(8192), abs=0.05)


def test_read_ranges_expand_to_every_page_in_order_and_sample_in_chunks():
    from vmdisktouch.core.mrc import FULL, pages_read, sample_ranges
    assert pages_read([5, 100, 7], [7, 100, 6]).tolist() == [5, 6, 7, 100]
    assert pages_read([0], [999]).tolist() == list(range(1000))
    first, last = [0, 5000, 7, 20000], [4999, 5000, 6, 29999]
    every = pages_read(first, last)
    for threshold in (FULL, FULL // 7):
        pages, total = sample_ranges(first, last, threshold, chunk=1024)  # in pieces
        assert total == every.size == 15001
        assert pages.tolist() == every[page_hash(every) < threshold].tolist()


def test_a_range_still_open_at_the_end_of_a_drain_waits_for_the_next():
    """A 64 MiB read whose batches come in two drains: its first drain's last batch is
    cut where the next drain's continues it, not counted up to the request's end; a range
    held once and not continued is taken whole; a page alone, or a range older than the
    drain's last quarter of a second, is never held."""
    from vmdisktouch.core.mrc import Batches
    b = Batches()
    ms = 1_000_000
    f, l = b.ranges([9, 0, 7936, 3], [9, 16383, 16383, 5], [0, 900 * ms, 901 * ms, 1 * ms])
    assert list(zip(f.tolist(), l.tolist())) == [(9, 9), (0, 7935), (3, 5)]
    f, l = b.ranges([15872], [16383], [1100 * ms])
    assert list(zip(f.tolist(), l.tolist())) == [(7936, 15871)]
    f, l = b.ranges([], [], [])
    assert list(zip(f.tolist(), l.tolist())) == [(15872, 16383)]
    assert b.ranges([], [], [])[0].size == 0


def test_a_batch_ends_where_the_next_batch_of_its_request_starts():
    """The kernel's events of one long read repeat its tail (0-4095, 31-4095, 62-4095):
    each ends before the next one's first page; another request ending on the same page
    but starting again from its start (a re-read) is a new request; one of another end
    keeps its range."""
    from vmdisktouch.core.mrc import batch_ends
    first = [0, 31, 5, 62, 0, 40]
    last = [4095, 4095, 5, 4095, 4095, 4095]
    assert batch_ends(first, last).tolist() == [30, 61, 5, 4095, 39, 4095]
    assert batch_ends([7], [9]).tolist() == [9]
    assert batch_ends([], []).tolist() == []


def test_the_exact_computation_grows_its_tree_past_its_first_size():
    """Every page of a large image read twice: more distinct pages than the tree's first
    size (4 x 65,536 slots), and each second read sees all the others in between."""
    n = 300_000
    m = MissRatioCurve(max_pages=None, rate=1.0, half_life=0)
    m.feed(np.tile(np.arange(n), 2))
    assert m.hit_ratio(n * 1.1) == pytest.approx(0.5, abs=0.01)
    assert m.hit_ratio(n * 0.9) == pytest.approx(0.0, abs=0.01)
