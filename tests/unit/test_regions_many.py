"""budget.select_many: the regions of several disks in one priority queue, one budget."""

from __future__ import annotations

import numpy as np

from vmdisktouch.core import regions
from vmdisktouch.core.policy import SELECT_RULES

T = 1.0


def disk(n, zones, **kw):
    heat = np.zeros(n, dtype=np.float32)
    for a, b, h in zones:
        heat[a:b] = h
    return regions.DiskMap(heat, T, **kw)


def test_the_hottest_regions_of_all_disks_fill_one_budget():
    a = disk(100, [(10, 20, 5.0)])                  # 10 blocks, 50 in all
    b = disk(100, [(0, 30, 2.0), (50, 55, 9.0)])    # 60 in all; 45 in all
    c = disk(100, [(70, 90, 1.5)])                  # 30 in all
    got = regions.select_many([a, b, c], 45, SELECT_RULES)
    assert got == [[(10, 20)], [(50, 55), (0, 30)], []]      # densest first


def test_a_region_that_does_not_fit_gives_its_hottest_window():
    a = disk(64, [(0, 20, 3.0)])
    b = disk(64, [(0, 10, 1.0), (10, 12, 8.0)])     # 26 in all: second
    got = regions.select_many([a, b], 25, SELECT_RULES)
    assert got[0] == [(0, 20)] and sum(y - x for x, y in got[1]) == 5
    assert (10, 12) in [(max(x, 10), min(y, 12)) for x, y in got[1]]   # the hot 2 blocks


def test_a_cap_keeps_a_disk_within_its_share_and_the_rest_goes_elsewhere():
    a = disk(100, [(0, 50, 9.0)], cap_blocks=10)
    b = disk(100, [(0, 50, 1.0)])
    got = regions.select_many([a, b], 40, SELECT_RULES)
    assert sum(y - x for x, y in got[0]) == 10
    assert sum(y - x for x, y in got[1]) == 30


def test_a_boost_weighs_one_disk_over_another():
    a = disk(50, [(0, 10, 2.0)])
    b = disk(50, [(0, 10, 2.0)], boost=np.full(50, 1.5, dtype=np.float32))
    assert regions.select_many([a, b], 10, SELECT_RULES) == [[], [(0, 10)]]


def test_the_budget_and_the_caps_are_never_exceeded():
    rng = np.random.default_rng(7)
    for _ in range(100):
        k = int(rng.integers(1, 5))
        maps = [regions.DiskMap((rng.random(200) * 2.5).astype(np.float32), T,
                                cap_blocks=None if rng.random() < 0.5 else int(rng.integers(0, 80)))
                for _ in range(k)]
        budget = int(rng.integers(0, 300))
        got = regions.select_many(maps, budget, SELECT_RULES)
        sizes = [sum(y - x for x, y in runs) for runs in got]
        assert sum(sizes) <= budget
        for m, size, runs in zip(maps, sizes, got):
            assert m.cap_blocks is None or size <= m.cap_blocks
            mask = np.zeros(200, bool)
            for x, y in runs:
                assert not mask[x:y].any()                # no overlap within a disk
                mask[x:y] = True
        # the budget is used whenever the candidates cover it
        cand = sum(min(int((m.total_heat >= T).sum()),
                       budget if m.cap_blocks is None else m.cap_blocks) for m in maps)
        assert sum(sizes) == min(budget, cand)
