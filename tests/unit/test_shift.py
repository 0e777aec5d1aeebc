"""core.shift: when the guest's reads leave the held blocks, a cycle is asked for early."""

import numpy as np

from vmdisktouch.core.shift import BASELINE_CYCLES, MAX_EARLY, MIN_READS, ReadShift

PPB = 256                         # 1 MiB blocks of 4 KiB pages
N = 64


def held_blocks(lo, hi):
    h = np.zeros(N, dtype=bool)
    h[lo:hi] = True
    return h


def reads(inside, outside, held_lo=0, rng=np.random.default_rng(1)):
    """``inside`` reads in blocks 0-7 (held in these tests), ``outside`` in 32-63."""
    a = rng.integers(held_lo * PPB, (held_lo + 8) * PPB, inside)
    b = rng.integers(32 * PPB, 64 * PPB, outside)
    return np.concatenate([a, b])


def per_block(pages, ppb=PPB):
    """A drain's read events, by the first page of each, as ``AccessLog.feed`` returns
    them: the blocks read and the events in each."""
    return np.unique(np.asarray(pages) // ppb, return_counts=True)


def fresh():
    """A detector after a first cycle that loaded blocks 0-7 (no reads yet)."""
    s = ReadShift()
    s.settled(held_blocks(0, 8))
    return s


def steady(s, inside=900, outside=100):
    """One cycle on schedule with the given mix, ending with blocks 0-7 held (a cold
    detector is not asked: it would wake, ``test_a_cold_disk_wakes...``)."""
    s.count(*per_block(reads(inside, outside)))
    if not s.cold:
        assert not s.wanted()
    s.settled(held_blocks(0, 8))


def test_no_baseline_wakes_only_on_reads_outside():
    s = fresh()                           # the first cycle: no reads, no baseline
    s.count(*per_block(reads(2000, 0)))               # inside what is held: nothing to act on
    assert not s.wanted()
    s.count(*per_block(reads(0, 2000)))
    assert s.wanted()


def test_reads_moving_out_of_the_held_blocks_wake_once_per_drain_until_the_cycle():
    s = fresh()
    steady(s)
    steady(s)
    assert s.baseline == 0.1
    s.count(*per_block(reads(100, 900)))              # the guest moved
    assert s.wanted() and s.woke
    assert s.wanted()                     # asked once: still asked until the cycle runs
    s.settled(held_blocks(0, 8))
    assert s.early == 1 and s.baseline == 0.1     # an early cycle keeps the baseline


def test_a_drain_of_few_reads_never_wakes():
    s = fresh()
    steady(s)
    s.count(*per_block(reads(0, MIN_READS - 1)))
    assert not s.wanted()
    s.count(*per_block(reads(0, MIN_READS)))
    assert s.wanted()


def test_a_steady_high_share_does_not_wake():
    """A hot set larger than the budget: most reads are outside, every cycle."""
    s = fresh()
    steady(s, inside=300, outside=700)
    for _ in range(10):
        s.count(*per_block(reads(300, 700)))
        assert not s.wanted()
    # ... and twice the baseline is needed even above one half
    s = fresh()
    steady(s, inside=700, outside=300)
    s.count(*per_block(reads(450, 550)))
    assert not s.wanted()
    s.count(*per_block(reads(350, 650)))
    assert s.wanted()


def test_a_shift_not_followed_costs_at_most_max_early_cycles_per_baseline_cycle():
    s = fresh()
    steady(s)
    woken = 0
    for _ in range(3 * (BASELINE_CYCLES + 1) * MAX_EARLY):
        s.count(*per_block(reads(100, 900)))
        woken += s.wanted()
        s.settled(held_blocks(0, 8))      # the policy did not follow
    assert woken == BASELINE_CYCLES * MAX_EARLY
    assert s.early == 0 and s.baseline == 0.9     # the scheduled cycles took the new share


def test_a_scheduled_cycle_that_straddles_the_move_does_not_raise_the_bar():
    s = fresh()
    steady(s)
    s.count(*per_block(reads(900, 100)))              # a scheduled cycle with the move halfway (two
    s.count(*per_block(reads(0, 900)))               # drains, the second not asked about
    s.settled(held_blocks(0, 8))
    assert s.early == 0 and s.baseline == 0.1     # its share, 0.5, did not become the bar
    s.count(*per_block(reads(100, 900)))
    assert s.wanted()


def test_once_the_new_blocks_are_held_their_reads_count_inside():
    s = fresh()
    steady(s)
    s.count(*per_block(reads(100, 900)))
    assert s.wanted()
    s.settled(held_blocks(32, 64))        # the early cycle followed the move
    s.count(*per_block(reads(100, 900)))
    assert not s.wanted()
    s.settled(held_blocks(32, 64))
    assert s.early == 0


def test_reads_beyond_the_map_count_outside():
    s = fresh()
    steady(s)
    s.count(*per_block(np.full(1000, (N + 10) * PPB)))    # the image grew past the last cycle's map
    assert s.wanted()


def test_the_first_cycle_holding_nothing_sets_a_baseline_of_all_outside():
    s = ReadShift()
    s.count(*per_block(reads(900, 100)))
    s.settled(held_blocks(0, 8))
    assert s.baseline == 1.0              # everything was outside what was held then
    s.count(*per_block(reads(0, 1000)))
    assert not s.wanted()


def test_a_cold_disk_wakes_on_its_first_drain_of_reads_outside():
    """No scheduled cycle has seen reads: the first drain of MIN_READS reads, half outside
    what is held, asks for a cycle (issue 33: a cold hot zone held in seconds)."""
    s = ReadShift()
    s.settled(np.zeros(8, dtype=bool))
    assert s.cold
    s.count(*per_block(np.arange(MIN_READS - 1) % 8 * 256))
    assert not s.wanted()                         # too few reads
    s.count(*per_block(np.arange(MIN_READS) % 8 * 256))
    assert s.wanted()
    s.settled(np.ones(8, dtype=bool))             # woken: still no baseline
    assert s.cold
    s.count(*per_block(np.arange(MIN_READS) % 8 * 256))       # all inside what is held now
    assert not s.wanted()
    s.settled(np.ones(8, dtype=bool))             # a scheduled cycle with reads
    assert not s.cold
