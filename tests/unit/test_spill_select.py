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


def test_what_was_spilled_last_cycle_stays_against_an_equal_or_slightly_hotter_pick():
    """The spill's incumbents: two background zones past the budget, room for one; the one
    spilled last cycle stays while the other is within the incumbency margin, and gives
    way to one that is clearly hotter."""
    def spill_of(other_heat, previous):
        h = heat_of(1000, [(100, 150, 5.0), (400, 450, 1.0), (700, 750, other_heat)])
        m = regions.DiskMap(h, T, rules=TRACED_RULES)
        chosen = regions.select_many([m], 50, TRACED_RULES)
        return spill.beyond([m], 50, 1.0, TRACED_RULES, chosen, previous)[0]

    assert spill_of(1.1, None) == [(700, 750)]        # no memory: the hotter by a hair
    assert spill_of(1.1, [[(400, 450)]]) == [(400, 450)]
    assert spill_of(2.0, [[(400, 450)]]) == [(700, 750)]


def test_a_spill_over_background_read_at_random_is_not_read_again_every_cycle():
    """write50's shape, scaled: the budget holds the hot zone and a little more; the spill
    is background whose read rates are noise. Remembering last cycle's spill, the spill
    stays put; forgetting it, another window of the noise was picked nearly every cycle."""
    n, budget = 2000, 120
    zone = (500, 600)

    def new_blocks(remember: bool) -> int:
        rng = np.random.default_rng(3)
        held, prev, fresh = np.zeros(n, bool), [], 0
        for c in range(20):
            h = (1.0 + rng.normal(0, 0.15, n)).astype(np.float32)
            h[zone[0]:zone[1]] = 5.0
            m = regions.DiskMap(h, T, held_mask=held, rules=TRACED_RULES)
            chosen = regions.select_many([m], budget, TRACED_RULES)
            (sp,) = spill.beyond([m], budget, 1.0, TRACED_RULES, chosen,
                                 [prev] if remember else None)
            if c:
                fresh += int((runs_to_mask(sp, n) & ~runs_to_mask(prev, n)).sum())
            held, prev = runs_to_mask(chosen[0], n), sp
        return fresh

    kept, forgot = new_blocks(True), new_blocks(False)
    assert kept <= budget // 4, kept
    assert forgot > 5 * budget, forgot                 # 1130 blocks: half of it a cycle
