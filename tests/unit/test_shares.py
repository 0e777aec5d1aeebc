"""core.shares: the host budget split by the disks' curves (marginal saving, lookahead)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from vmdisktouch.core.shares import KEEP_GAIN, SLICES, Demand, split

MiB, GiB = 1 << 20, 1 << 30


def uniform(span: int):
    """Reads uniform over ``span`` bytes: an LRU cache of S serves S / span of them."""
    return lambda s: np.clip(np.asarray(s) / span, 0, 1)


def zone(size: int, share: float = 0.9):
    """A zone read in a loop: nothing under its size, ``share`` from it on."""
    return lambda s: np.where(np.asarray(s) >= size, share, 0.0)


def concave(scale: int):
    return lambda s: 1 - np.exp(-np.asarray(s) / scale)


def test_equal_disks_get_equal_shares_within_a_slice():
    shares, left = split([Demand(concave(512 * MiB), 2000.0)] * 3, 3 * GiB)
    assert left == 0 and max(shares) - min(shares) <= 3 * GiB / SLICES
    assert sum(shares) == pytest.approx(3 * GiB, abs=3)


def test_a_zone_that_pays_only_whole_is_seen_past_its_flat_stretch():
    """X reads 3 GiB uniformly at 3,000 pages/s; Y loops over a 600 MiB zone at 1,000.
    1 GiB: Y's zone saves 900 reads/s, the same memory on X 600: Y gets its zone (no
    less: a part of a loop serves nothing), X the rest."""
    x, y = Demand(uniform(3 * GiB), 3000.0), Demand(zone(600 * MiB), 1000.0)
    (sx, sy), left = split([x, y], GiB)
    assert 600 * MiB <= sy < 600 * MiB + GiB / SLICES
    assert sx + sy == pytest.approx(GiB, abs=2) and left < GiB / SLICES


def test_a_curve_that_buys_nothing_leaves_its_budget_to_the_heat():
    flat = lambda s: np.zeros(np.shape(s))                         # noqa: E731
    shares, left = split([Demand(flat, 5000.0), Demand(zone(256 * MiB), 10.0)], GiB)
    assert shares[0] == 0 and 256 * MiB <= shares[1] < 256 * MiB + GiB / SLICES
    assert left == GiB - shares[1]


def test_miss_cost_and_weight_scale_what_a_disk_saves():
    a = Demand(zone(512 * MiB), 1000.0)
    b = Demand(zone(512 * MiB), 1000.0, miss_cost=3.0)
    assert split([a, b], 600 * MiB)[0][1] >= 512 * MiB
    c = Demand(zone(512 * MiB), 1000.0, weight=4.0)
    assert split([b, c], 600 * MiB)[0][1] >= 512 * MiB


def test_the_last_split_stays_unless_the_new_one_saves_enough_more():
    d = [Demand(concave(512 * MiB), 2000.0), Demand(concave(512 * MiB), 2100.0)]
    fresh, _ = split(d, 2 * GiB)
    near = [fresh[0] + 2 * (2 * GiB // SLICES), fresh[1] - 2 * (2 * GiB // SLICES)]
    assert split(d, 2 * GiB, last=near)[0] == near                  # within KEEP_GAIN
    skewed = [2 * GiB - 64 * MiB, 64 * MiB]
    assert split(d, 2 * GiB, last=skewed)[0] == fresh               # far worse: replaced
    assert KEEP_GAIN < 0.1


def test_what_no_curve_gains_from_is_split_by_read_rate_within_what_each_heat_wants():
    from vmdisktouch.core.shares import fill
    assert fill(90, [1.0, 1.0, 1.0], [100, 100, 100]) == [30, 30, 30]
    assert fill(90, [2.0, 1.0, 0.0], [100, 100, 100]) == [60, 30, 0]
    assert fill(90, [1.0, 1.0, 1.0], [10, 100, 100]) == [10, 40, 40]     # one full
    assert fill(90, [1.0, 1.0], [10, 20]) == [10, 20]                     # all full
    assert sum(fill(7, [1.0, 1.0, 1.0], [9, 9, 9])) == 7


def test_equal_disks_with_flat_curves_get_equal_fixed_caps():
    """Three equal disks whose curves stop gaining at 256 MiB (no reuse seen past it yet),
    3 GiB: each 1 GiB, the same every cycle (no room left for the heat to trade)."""
    from vmdisktouch.core.regions import DiskMap
    from vmdisktouch.core.shares import Splitter
    bs, n = MiB, 2048
    maps = [DiskMap(np.ones(n, np.float32), 0.05, candidates=np.ones(n, bool))] * 3
    d = [Demand(lambda s: np.minimum(np.asarray(s), 256 * MiB) / (256 * MiB) * 0.2, 4000.0)] * 3
    sp = Splitter()
    for _ in range(3):
        out, cut = sp.caps(["a", "b", "c"], maps, d, 3 * 1024, bs)
        assert [m.cap_blocks for m in out] == [1024, 1024, 1024] and all(cut)


def test_the_fill_stays_while_read_rates_move_a_little_and_follows_a_real_change():
    """Equal disks whose read rates move by a few percent each cycle keep the same caps
    (each moved cap is a load and a release); a disk whose rate doubles gets more."""
    from vmdisktouch.core.regions import DiskMap
    from vmdisktouch.core.shares import FILL_BAND, Splitter
    bs, n = MiB, 2048
    maps = [DiskMap(np.ones(n, np.float32), 0.05, candidates=np.ones(n, bool))] * 3

    def demands(rates):
        return [Demand(lambda s: np.minimum(np.asarray(s), 256 * MiB) / (256 * MiB) * 0.2, r)
                for r in rates]
    sp = Splitter()
    first = [m.cap_blocks for m in sp.caps(["a", "b", "c"], maps, demands([4000.0] * 3),
                                           3 * 1024, bs)[0]]
    for rates in ([4150.0, 3900.0, 4000.0], [3880.0, 4100.0, 4050.0]):
        caps = [m.cap_blocks for m in sp.caps(["a", "b", "c"], maps, demands(rates),
                                              3 * 1024, bs)[0]]
        assert caps == first
    moved = [m.cap_blocks for m in sp.caps(["a", "b", "c"], maps,
                                           demands([8000.0, 4000.0, 4000.0]), 3 * 1024, bs)[0]]
    assert moved[0] > first[0] * (1 + FILL_BAND) and moved[1] < first[1]
    fresh = Splitter()                       # no memory: the rates' own proportions
    assert [m.cap_blocks for m in fresh.caps(["a", "b", "c"], maps,
                                             demands([4150.0, 3900.0, 4000.0]),
                                             3 * 1024, bs)[0]] != first


def test_a_measured_miss_cost_moves_the_split_and_one_unmeasured_makes_all_equal():
    """Two disks with the same curve and read rate: the one whose misses cost four times as
    much gets its zone first; when one disk has no figure, costs count as equal (seconds
    and "unknown" have no common scale) and the two get the same."""
    from vmdisktouch.core.regions import DiskMap
    from vmdisktouch.core.shares import Splitter, comparable
    bs, n = MiB, 1024
    maps = [DiskMap(np.ones(n, np.float32), 0.05, candidates=np.ones(n, bool))] * 2

    def zone(s):
        return np.minimum(np.asarray(s) / (512 * MiB), 1.0) * 0.9
    slow = [Demand(zone, 2000.0, 400e-6), Demand(zone, 2000.0, 100e-6)]
    caps = [m.cap_blocks for m in Splitter().caps(["a", "b"], maps, slow, 768, bs)[0]]
    assert 512 <= caps[0] < 512 + 768 // 64 and caps[0] + caps[1] == 768    # a's zone whole
    unknown = [Demand(zone, 2000.0, 400e-6), Demand(zone, 2000.0, None)]
    assert [d.miss_cost for d in comparable(unknown)] == [1.0, 1.0]
    caps = [m.cap_blocks for m in Splitter().caps(["a", "b"], maps, unknown, 768, bs)[0]]
    assert abs(caps[0] - caps[1]) <= 768 // 64


def test_a_young_curve_takes_part_with_its_heat_curve_and_leaves_the_others_theirs():
    """tools/curve_example.py's host: a re-reads a 96 MiB zone (its curve 0.87 from 96 MiB
    on, seen), b reads 512 MiB uniformly and its curve is young, 192 MiB of budget. b
    offers the curve its heat implies (a straight line to 512 MiB), so a keeps its zone
    whole and b gets the rest; with no curve seen at all the heat alone decides."""
    from vmdisktouch.core.regions import DiskMap
    from vmdisktouch.core.shares import Splitter, heat_curve
    bs, n, budget = MiB, 512, 192
    heat_a = np.zeros(n, np.float32)
    heat_a[:96] = 30.0
    maps = [DiskMap(heat_a, 0.05, candidates=heat_a > 0),
            DiskMap(np.full(n, 3.0, np.float32), 0.05, candidates=np.ones(n, bool))]
    a = Demand(lambda s: np.where(np.asarray(s) >= 96 * MiB, 0.87, 0.0), 3000.0)
    b = Demand(heat_curve(maps[1].total_heat, maps[1].candidates, bs), 1500.0, seen=False)
    assert b.hit_ratio(np.array([0, 128 * MiB, 512 * MiB, GiB])) == \
        pytest.approx([0, 0.25, 1.0, 1.0])
    out, cut = Splitter().caps(["a", "b"], maps, [a, b], budget, bs)
    caps = [m.cap_blocks for m in out]
    assert 96 <= caps[0] < 96 + budget // 64 + 1 and caps[0] + caps[1] == budget
    young_a = Demand(heat_curve(heat_a, maps[0].candidates, bs), 3000.0, seen=False)
    out, cut = Splitter().caps(["a", "b"], maps, [young_a, b], budget, bs)
    assert cut == [False, False] and [m.cap_blocks for m in out] == [None, None]


def test_no_more_waiting_is_saved_a_second_than_the_guests_queue_depth_allows():
    """Issue 55: status said "a miss costs 719 us, 8.77 s of reads saved a second" for a
    guest at queue depth 1 (12,200 held reads a second). A guest with one read in flight
    waits at most one second a second, so that is all holding can save it; at depth 4,
    four. The split sees the same bound: a disk whose saving is capped gains nothing past
    the size that reaches it."""
    from vmdisktouch.core.shares import guest_depth, savings, saved_per_second
    assert saved_per_second(12_200.0, 719e-6, 1.0) == 1.0
    assert saved_per_second(12_200.0, 29e-6, 1.0) == pytest.approx(0.3538)
    assert saved_per_second(12_200.0, 719e-6, 4.0) == 4.0
    assert saved_per_second(12_200.0, 719e-6, 0.2) == 1.0          # at least one in flight
    assert saved_per_second(12_200.0, 719e-6, float("inf")) == pytest.approx(8.7718)
    # Little's law on the guest's misses: 2,000 misses a second of 2 ms each keep 4 in flight.
    assert guest_depth(2000.0, 2e-3) == pytest.approx(4.0)
    assert guest_depth(100.0, 2e-3) == 1.0 and guest_depth(5000.0, None) == 1.0
    qd1 = Demand(uniform(GiB), 20_000.0, miss_cost=719e-6, depth=1.0)
    s = savings(qd1, np.array([0, 64 * MiB, 512 * MiB, GiB]))
    assert s.max() == 1.0 and s[1] == pytest.approx(20_000 / 16 * 719e-6)
    # Past its cap (71 MiB: 1 s at 20,000 x 719 us a GiB) a disk gains nothing; the other
    # reaches its own at 712 MiB, and what neither gains from is left to the heat.
    # Uncapped, the first disk's 14 s a second would have taken all of the GiB.
    other = Demand(uniform(GiB), 2_000.0, miss_cost=719e-6, depth=1.0)
    (a, b), left = split([qd1, other], GiB)
    assert 64 * MiB <= a <= 71 * MiB + GiB // SLICES, a
    assert 700 * MiB <= b <= 712 * MiB + GiB // SLICES and left > 0, (b, left)
    (a, b), _ = split([replace(qd1, depth=float("inf")), other], GiB)
    assert a > 512 * MiB


def test_unmeasured_costs_are_not_capped_as_seconds():
    from vmdisktouch.core.shares import comparable
    d = comparable([Demand(uniform(GiB), 5000.0, 1e-3, depth=1.0),
                    Demand(uniform(GiB), 5000.0, None, depth=1.0)])
    assert all(x.miss_cost == 1.0 and x.depth == float("inf") for x in d)
