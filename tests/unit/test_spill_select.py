"""core.spill.beyond: the next-ranked regions past the budget, in the selection's order."""

from __future__ import annotations

import numpy as np

from vmdisktouch.core import regions, spill
from vmdisktouch.core.policy import SELECT_RULES, TRACED_RULES
from vmdisktouch.core.runs import runs_to_mask

T = 0.05


def heat_of(n: int, zones: list[tuple[int, int, float]]) -> np.ndarray:
    h = np.zeros(n, dtype=np.float32)
    for a, b, v in zones:
        h[a:b] = v
    return h


def chosen_and_spill(maps, budget, factor, rules=TRACED_RULES):
    chosen = regions.select_many(maps, budget, rules)
    return chosen, spill.beyond(maps, budget, factor, rules, chosen)


def test_the_spill_is_the_next_ranked_regions_disjoint_from_the_budget():
    # Three zones: the hottest fills the budget, the next two are spilled in their order.
    h = heat_of(1000, [(100, 150, 5.0), (400, 430, 1.0), (700, 720, 2.0)])
    m = regions.DiskMap(h, T, rules=TRACED_RULES)
    (chosen,), (spilled,) = chosen_and_spill([m], 50, 1.0)
    assert chosen == [(100, 150)]
    assert spilled == [(700, 720), (400, 430)]       # priority order: hotter first
    both = runs_to_mask(chosen, 1000) & runs_to_mask(spilled, 1000)
    assert not both.any()


def test_the_spill_is_at_most_factor_times_the_budget():
    h = heat_of(1000, [(0, 40, 5.0), (100, 300, 1.0)])
    m = regions.DiskMap(h, T, rules=TRACED_RULES)
    (chosen,), (spilled,) = chosen_and_spill([m], 40, 0.5)
    assert chosen == [(0, 40)]
    assert sum(b - a for a, b in spilled) == 20
    assert all(100 <= a < b <= 300 for a, b in spilled)


def test_no_spill_when_off_when_nothing_is_left_or_with_the_polling_rules():
    h = heat_of(1000, [(100, 150, 5.0), (400, 430, 1.0)])
    traced = regions.DiskMap(h, T, rules=TRACED_RULES)
    assert chosen_and_spill([traced], 50, 0.0)[1] == [[]]
    assert chosen_and_spill([traced], 100, 1.0)[1] == [[]]        # all of it fits the budget
    polled = regions.DiskMap(h, T, rules=SELECT_RULES)
    assert chosen_and_spill([polled], 50, 1.0, SELECT_RULES)[1] == [[]]


def test_several_disks_share_the_spill_and_only_trace_disks_spill():
    a = regions.DiskMap(heat_of(500, [(0, 50, 5.0), (200, 260, 2.0)]), T, rules=TRACED_RULES)
    b = regions.DiskMap(heat_of(500, [(0, 50, 4.0), (300, 330, 3.0)]), T, rules=SELECT_RULES)
    c = regions.DiskMap(heat_of(500, [(100, 140, 1.0)]), T, rules=TRACED_RULES)
    chosen, spilled = chosen_and_spill([a, b, c], 100, 1.0, SELECT_RULES)
    assert chosen == [[(0, 50)], [(0, 50)], []]
    assert spilled[1] == []                           # the polling disk's share is not read
    assert spilled[0] == [(200, 260)] and spilled[2] == [(100, 140)]
