"""core.what_if: the advice ``advise`` gives from a disk's curve, rates and waits."""

from __future__ import annotations

import numpy as np
import pytest

from vmdisktouch.adapters.advice_file import sentence
from vmdisktouch.core import what_if
from vmdisktouch.core.mrc import MissRatioCurve

PAGE = 4096
MiB = 1 << 20
IMAGE = 1 << 30


def curve_of(pages: np.ndarray, image: int = IMAGE) -> MissRatioCurve:
    m = MissRatioCurve(rate=1.0, max_pages=None, half_life=0.0)
    m.feed(pages)
    return m


def watched(**kw) -> what_if.Watched:
    base = dict(image_bytes=IMAGE, page_size=PAGE, reads_per_second=2000.0,
                writes_per_second=500.0, read_wait=400e-6, write_wait=600e-6, miss=400e-6,
                hit=5e-6, hit_ratio_now=0.0, buffered=False, pages_read=200_000)
    base.update(kw)
    return what_if.Watched(**base)


def advise(m: MissRatioCurve, w: what_if.Watched, adopt: bool = False) -> what_if.Forecast:
    w = what_if.Watched(**{**w.__dict__, "pages_read": m.reads})
    status = m.status(w.image_bytes, w.page_size)
    return what_if.forecast(w, status["curve"], lambda b: m.hit_ratio(b / w.page_size),
                            m.wants(w.image_bytes, w.page_size), adopt=adopt)


def zone_reads(zone_pages: int = 64 * MiB // PAGE, n: int = 200_000, seed: int = 1):
    rng = np.random.default_rng(seed)
    hot = rng.integers(0, zone_pages, size=n)
    cold = rng.integers(0, IMAGE // PAGE, size=n)
    return np.where(rng.random(n) < 0.9, hot, cold)


def test_a_hot_zone_gets_about_its_size_and_what_it_saves():
    m = curve_of(zone_reads())
    f = advise(m, watched())
    assert f.verdict == "hold"
    assert 64 * MiB <= f.bytes <= 256 * MiB, f.bytes
    assert f.hit_ratio == pytest.approx(m.hit_ratio(f.bytes / PAGE))
    assert 0.8 <= f.hit_ratio <= 0.95
    assert f.saved_per_read == pytest.approx(f.hit_ratio * (400e-6 - 5e-6))
    said = sentence(f, IMAGE)
    assert said.startswith("with cache=writethrough and ") and "reads/s more" in said


def test_more_reads_come_from_the_requests_in_flight_at_least_one():
    m = curve_of(zone_reads())
    w = watched()
    f = advise(m, w)
    # the device holds 2000 * 400 us + 500 * 600 us = 1.1 I/O on average: the guest
    # keeps at least that many in flight, and their cycles shrink by the wait saved
    assert f.depth == pytest.approx(1.1)
    saved = f.saved_per_read * 2000                   # seconds of waiting a second
    assert f.more_reads_per_second == pytest.approx(2000 * (1 / (1 - saved / 1.1) - 1))
    # a sync guest whose device holds less than one (QEMU's own time around each I/O)
    # keeps one in flight: the time around the wait does not shrink
    slow = advise(m, watched(read_wait=100e-6, write_wait=100e-6, miss=100e-6))
    assert slow.depth == 1.0
    assert slow.more_reads_per_second == pytest.approx(
        2000 * (1 / (1 - slow.saved_per_read * 2000) - 1))
    # a deeper guest gains less per request from the same hits
    deep = advise(m, watched(read_wait=1e-3, write_wait=1e-3))
    assert deep.depth == pytest.approx(2.5)


def test_uniform_reads_are_told_no_size_below_the_image_helps():
    rng = np.random.default_rng(2)
    m = curve_of(rng.integers(0, IMAGE // PAGE, size=600_000))
    f = advise(m, watched())
    assert f.verdict == "uniform", f
    assert f.bytes == IMAGE
    assert sentence(f, IMAGE).startswith("no size below the image helps: reads are uniform")


def test_no_read_twice_and_no_reads_at_all_buy_nothing():
    m = curve_of(np.arange(100_000))
    assert advise(m, watched()).verdict == "no_reuse"
    assert advise(curve_of(np.zeros(0, np.int64)), watched(reads_per_second=0.0)
                  ).verdict == "no_reads"


def test_a_disk_through_the_page_cache_is_credited_only_past_what_the_cache_serves_now():
    m = curve_of(zone_reads())
    direct = advise(m, watched())
    paged = advise(m, watched(buffered=True, hit_ratio_now=0.5))
    assert paged.saved_per_read == pytest.approx(
        (paged.hit_ratio - 0.5) * (400e-6 - 5e-6))
    assert paged.saved_per_read < direct.saved_per_read
    said = sentence(paged, IMAGE)
    assert said.startswith("with ") and "writethrough" not in said


def test_without_a_miss_latency_the_size_is_said_without_a_gain():
    f = advise(curve_of(zone_reads()), watched(miss=None, read_wait=None))
    assert f.verdict == "no_latency" and f.bytes > 0 and f.more_reads_per_second == 0


def test_the_cache_hit_ratio_is_the_share_of_pages_read_that_added_none():
    assert what_if.cache_hit_ratio(100, 25) == 0.75
    assert what_if.cache_hit_ratio(100, 300) == 0.0
    assert what_if.cache_hit_ratio(0, 0) is None


def test_the_uniform_model_matches_uniform_reads_and_a_knee_does_not():
    rng = np.random.default_rng(3)
    n, reads = 50_000, 120_000
    m = curve_of(rng.integers(0, n, size=reads))
    sizes = np.array([n >> k for k in range(8, -1, -1)])
    model = what_if.uniform_curve(sizes, n, reads)
    assert np.max(np.abs(m.curve(sizes) - model)) < 0.02
    curve = [[int(s) * PAGE, float(h)] for s, h in zip(sizes, m.curve(sizes))]
    assert what_if.is_uniform(curve, n * PAGE, PAGE, reads)
    knee = [[b, min(0.9, 8 * b / (n * PAGE))] for b, _ in curve]
    assert not what_if.is_uniform(knee, n * PAGE, PAGE, reads)


def test_the_hottest_blocks_serve_their_share_and_raise_what_an_lru_would():
    counts = np.array([50, 0, 30, 5, 5, 10])
    assert what_if.hottest_share(counts, 2) == pytest.approx(0.8)
    assert what_if.hottest_share(counts, 10) == 1.0
    assert what_if.hottest_share(np.zeros(4), 2) == 0.0
    m = curve_of(zone_reads())
    lru = advise(m, watched())
    status = m.status(IMAGE, PAGE)
    held = what_if.forecast(watched(pages_read=m.reads), status["curve"],
                            lambda b: m.hit_ratio(b / PAGE), m.wants(IMAGE, PAGE),
                            lambda b: 0.97)
    assert held.hit_ratio == 0.97 > lru.hit_ratio
    assert held.saved_per_read == pytest.approx(0.97 * (400e-6 - 5e-6))


def judged(m: MissRatioCurve, w: what_if.Watched, seconds: float) -> what_if.Forecast:
    """``advise`` with advise's own evidence rule: ``m`` watched for ``seconds``."""
    from vmdisktouch.core import advice
    w = what_if.Watched(**{**w.__dict__, "pages_read": m.reads})
    status = m.status(w.image_bytes, w.page_size)
    return what_if.forecast(
        w, status["curve"], lambda b: m.hit_ratio(b / w.page_size),
        m.wants(w.image_bytes, w.page_size),
        evidence_for=lambda b: advice.evidence(m.reads, m.re_reads, seconds, advice.ADVISE,
                                               b / w.page_size))


def test_a_window_under_advise_s_minimum_gives_no_size_only_how_long_to_watch():
    from vmdisktouch.adapters.advice_file import advice_cell
    m = curve_of(zone_reads())
    short = judged(m, watched(), 5.0)             # 200,000 reads: seconds short only
    assert short.verdict == "not_enough" and short.bytes == 0, short
    assert short.evidence["wait_seconds"] == 5 and short.evidence["re_reads"] > 100_000
    said = sentence(short, IMAGE)
    assert said.startswith("not enough reads yet: watch for 5 s more"), said
    assert "M" not in said.split("(")[0]           # no size in the advice itself
    assert advice_cell(short.to_json()) == "not enough reads yet: watch for 5 s more"
    full = judged(m, watched(), 60.0)
    assert full.verdict == "hold" and full.bytes > 0 and full.evidence["enough"], full


def test_a_size_whose_pages_were_not_seen_read_again_twice_is_not_said():
    # a 512 MiB zone (131,072 pages) read 200,000 times: some pages read again, far from
    # two re-reads a page of what the curve wants
    m = curve_of(zone_reads(zone_pages=512 * MiB // PAGE))
    f = judged(m, watched(), 60.0)
    assert f.verdict == "not_enough" and f.bytes == 0, f
    need = f.evidence["minimum"]["re_reads"]
    assert need > f.evidence["re_reads"] >= 1000          # the cover, not the floor
    assert f.evidence["wait_seconds"] > 0


def test_no_re_read_in_a_full_window_is_no_reuse_and_in_a_short_one_not_enough():
    m = curve_of(np.arange(100_000))
    assert judged(m, watched(), 60.0).verdict == "no_reuse"
    f = judged(m, watched(), 2.0)
    assert f.verdict == "not_enough" and f.evidence["wait_seconds"] is None
    assert sentence(f, IMAGE).startswith("not enough reads yet (no size")


def test_the_evidence_rule_is_one_for_the_daemon_and_advise_with_their_minimums():
    from vmdisktouch.core import advice
    # the same curve's figures: enough for advise's one look, not for the daemon's verdicts
    a = advice.evidence(50_000, 20_000, 30.0, advice.ADVISE)
    d = advice.evidence(50_000, 20_000, 30.0)
    assert a["enough"] and not d["enough"] and d["wait_seconds"] == 570   # settling: 600 s
    assert a["minimum"]["window_seconds"] == 10.0 and d["minimum"]["window_seconds"] == 120.0
    # the cover asks for re-reads with the size
    assert not advice.evidence(50_000, 20_000, 30.0, advice.ADVISE, 20_000)["enough"]
    assert advice.evidence(50_000, 20_000, 30.0, advice.ADVISE, 10_000)["enough"]


# -- what a hit and a switch cost ---------------------------------------------------------

def fast_disk(**kw) -> what_if.Watched:
    """A guest at queue depth 1 on a fast disk (a miss 28 µs), cache=none, with a read
    through QEMU's buffered path 15 µs more than through its direct path and a
    writethrough write 150 µs more."""
    base = dict(reads_per_second=8000.0, writes_per_second=2000.0, read_wait=28e-6,
                write_wait=65e-6, miss=28e-6, hit=1e-6, path_extra=15e-6,
                write_extra=150e-6)
    base.update(kw)
    return watched(**base)


def test_a_mixed_workload_on_a_fast_disk_comes_out_negative_and_says_no_gain():
    m = curve_of(zone_reads())
    f = advise(m, fast_disk())
    assert f.verdict == "no_gain", f
    assert f.more_reads_per_second < 0
    assert f.then.writes < f.now.writes and f.then.io_time > f.now.io_time
    # the read side alone still gains: 0.9 * 27 µs - 15 µs
    assert f.saved_per_read == pytest.approx(f.hit_ratio * 27e-6 - 15e-6)
    assert f.write_cost == pytest.approx(150e-6)
    said = sentence(f, IMAGE)
    assert said.startswith("no gain: ") and "a flush per write" in said, said
    assert "reads/s" in said and "writes/s" in said and "mean I/O" in said, said
    said.encode("latin-1")                  # the table and the picture: no arrows
    assert f.to_json()["then"]["reads_per_second"] < f.to_json()["now"]["reads_per_second"]


def test_adopting_keeps_the_guest_s_write_cache_so_writes_pay_the_path_not_a_flush():
    m = curve_of(zone_reads())
    writethrough, adopted = advise(m, fast_disk()), advise(m, fast_disk(), adopt=True)
    assert writethrough.verdict == "no_gain" and adopted.verdict == "hold", adopted
    assert adopted.adopt and not writethrough.adopt
    assert adopted.write_cost == pytest.approx(15e-6)           # the path's, no flush
    assert adopted.saved_per_read == pytest.approx(writethrough.saved_per_read)
    assert adopted.then.io_time < adopted.now.io_time < writethrough.then.io_time
    assert sentence(adopted, IMAGE).startswith("adopted with ")
    assert adopted.to_json()["adopt"] is True
    # writes that cost more than the reads save are no gain for adopt either
    heavy = advise(m, fast_disk(writes_per_second=20000.0), adopt=True)
    assert heavy.verdict == "no_gain" and "buffered path" in heavy.reason, heavy.reason
    # a disk through the page cache already has nothing to adopt
    assert not advise(m, fast_disk(buffered=True), adopt=True).adopt


def test_reads_only_on_a_fast_disk_gain_what_the_buffered_path_leaves():
    m = curve_of(zone_reads())
    free = advise(m, fast_disk(writes_per_second=0.0, path_extra=None))
    paid = advise(m, fast_disk(writes_per_second=0.0))
    assert free.verdict == paid.verdict == "hold"
    assert paid.saved_per_read == pytest.approx(free.saved_per_read - 15e-6)
    assert 0 < paid.more_reads_per_second < 0.5 * free.more_reads_per_second
    # at depth 1 the cycle is 1 / rate: 125 µs less the time saved per read
    assert paid.then.io_time == pytest.approx(1 / 8000 - paid.saved_per_read)
    assert paid.then.reads == pytest.approx(1 / paid.then.io_time)


def test_a_slow_disk_gains_even_with_its_writes_slower():
    m = curve_of(zone_reads())
    f = advise(m, fast_disk(reads_per_second=400.0, writes_per_second=100.0, miss=2e-3,
                            read_wait=2e-3))
    assert f.verdict == "hold" and f.more_reads_per_second > 0
    assert "writes 150 µs slower each" in sentence(f, IMAGE)


def test_a_disk_already_through_the_page_cache_pays_no_switch():
    m = curve_of(zone_reads())
    f = advise(m, fast_disk(buffered=True, hit_ratio_now=0.5))
    assert f.write_cost == 0.0
    assert f.saved_per_read == pytest.approx((f.hit_ratio - 0.5) * 27e-6)


def test_a_buffered_disk_already_served_as_much_gets_no_gain_with_that_reason():
    m = curve_of(zone_reads())
    f = advise(m, fast_disk(buffered=True, hit_ratio_now=0.99))
    assert f.verdict == "no_gain" and f.more_reads_per_second == 0, f
    assert "already serves 99% of the reads" in f.reason, f.reason


def test_a_block_device_s_write_cost_is_not_measured_and_said_so():
    m = curve_of(zone_reads())
    f = advise(m, fast_disk(reads_per_second=400.0, writes_per_second=100.0, miss=2e-3,
                            read_wait=2e-3, write_extra=None))
    assert f.verdict == "hold" and f.write_cost is None, f
    assert f.to_json()["write_cost_us"] is None
    assert "the writes' extra wait not measured (a block device)" in sentence(f, IMAGE)
    reads_only = advise(m, fast_disk(writes_per_second=0.0, write_extra=None))
    assert reads_only.write_cost == 0.0 and "not measured" not in sentence(reads_only, IMAGE)


def test_a_queue_bound_device_s_misses_lose_their_queue_up_to_the_misses_it_serves_now():
    """A device throttled to 400 reads a second: a read waits 2 ms on average, 50 µs
    typically; writes queue behind (1 ms, 60 µs typically). Held, the misses left wait the
    typical time, and the device serves at most the 400 misses a second it serves now."""
    m = curve_of(zone_reads())
    w = fast_disk(reads_per_second=400.0, writes_per_second=100.0, miss=2e-3, read_wait=2e-3,
                  write_wait=1e-3, miss_typical=50e-6, write_typical=60e-6,
                  write_extra=None, path_extra=3e-6)
    assert what_if.queue_bound(w)
    f = advise(m, w)
    assert f.verdict == "hold" and f.queue_bound, f
    assert "the device is queue-bound now" in sentence(f, IMAGE)
    cap = 400.0 / (1.0 - f.hit_ratio)
    assert f.then.reads == pytest.approx(cap)            # the device's misses, not more
    assert f.then.writes == pytest.approx(cap * 100 / 400)
    unknown = what_if.Watched(**{**w.__dict__, "miss_typical": None})
    assert not what_if.queue_bound(unknown)
    linear = advise(m, unknown)                           # the mean wait as each miss's
    assert f.more_reads_per_second > 2 * linear.more_reads_per_second > 0
    # a device whose mean and median agree is not queue-bound: the same as before
    even = fast_disk(miss_typical=27e-6)
    assert not what_if.queue_bound(even)
    assert advise(m, even) == advise(m, fast_disk())
