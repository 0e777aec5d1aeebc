"""core.advice: a disk's share, and the host's budget, read against what the curves want."""

from __future__ import annotations

from vmdisktouch.core.advice import (HOLD_CYCLES, RIGHT, TOO_LARGE, TOO_SMALL, Steady, Verdict,
                                     disk_verdict, host_verdict)
from vmdisktouch.daemon.reasons import advice_said as said

MiB, GiB = 1 << 20, 1 << 30


def test_a_disk_wanting_more_than_its_share_is_too_small_and_less_too_large():
    assert disk_verdict(400 * MiB, 1600 * MiB, 2 * GiB) == Verdict(TOO_SMALL, 1200 * MiB)
    assert disk_verdict(2 * GiB, 500 * MiB, 2 * GiB) == Verdict(TOO_LARGE, 1548 * MiB)
    assert disk_verdict(1000 * MiB, 1100 * MiB, 2 * GiB) == Verdict(RIGHT, 0)   # an eighth
    assert disk_verdict(1000 * MiB, 1200 * MiB, 2 * GiB).verdict == TOO_SMALL


def test_within_one_slice_of_the_budget_small_sizes_agree():
    """4M share, 20M wanted, 1G budget: 16M apart is within a slice (16M): right."""
    assert disk_verdict(4 * MiB, 20 * MiB, GiB).verdict == RIGHT
    assert disk_verdict(4 * MiB, 21 * MiB, GiB).verdict == TOO_SMALL


def test_a_young_curve_gets_no_verdict():
    assert disk_verdict(GiB, None, GiB) is None
    assert host_verdict([(GiB, None), (GiB, None)], 2 * GiB) is None


def test_the_host_is_too_small_when_a_disk_is_and_says_what_more_would_pay():
    v = host_verdict([(400 * MiB, 1600 * MiB), (600 * MiB, 100 * MiB), (GiB, None)], 2 * GiB)
    assert v == Verdict(TOO_SMALL, 1200 * MiB)


def test_the_host_is_too_large_only_when_every_disk_has_a_verdict():
    assert host_verdict([(2 * GiB, 300 * MiB), (2 * GiB, 200 * MiB)], 2 * GiB) == \
        Verdict(TOO_LARGE, 2 * GiB - 500 * MiB)
    # a young curve may want the rest: no verdict of too large
    assert host_verdict([(2 * GiB, 300 * MiB), (2 * GiB, None)], 2 * GiB) == Verdict(RIGHT, 0)
    assert host_verdict([(GiB, GiB), (GiB, 900 * MiB)], 2 * GiB) == Verdict(RIGHT, 0)


def test_a_verdict_is_said_once_it_held_and_not_again_until_it_changes():
    s = Steady()
    small = Verdict(TOO_SMALL, GiB)
    said_ = [s.note("a", small) for _ in range(HOLD_CYCLES + 2)]
    assert said_[:HOLD_CYCLES - 1] == [None] * (HOLD_CYCLES - 1)
    assert said_[HOLD_CYCLES - 1] == small and said_[HOLD_CYCLES:] == [None] * 2
    # wavering at the edge: never HOLD_CYCLES in a row, nothing said
    for k in range(4 * HOLD_CYCLES):
        assert s.note("a", Verdict(TOO_LARGE if k % 2 else RIGHT, 0)) is None
    assert [s.note("a", Verdict(RIGHT, 0)) for _ in range(HOLD_CYCLES)][-1] == Verdict(RIGHT, 0)
    # a young curve says nothing and forgets nothing said
    assert all(s.note("a", None) is None for _ in range(2 * HOLD_CYCLES))
    assert all(s.note("a", Verdict(RIGHT, 0)) is None for _ in range(2 * HOLD_CYCLES))
    s.forget({"b"})
    assert [s.note("a", Verdict(RIGHT, 0)) for _ in range(HOLD_CYCLES)][-1] is not None


def test_in_words():
    assert said({"verdict": TOO_SMALL, "bytes": 1200 * MiB}) == "too small: 1.2G more would pay"
    assert said({"verdict": TOO_LARGE, "bytes": 512 * MiB}) == \
        "too large: 512M of it buys almost nothing"
    assert said({"verdict": RIGHT, "bytes": 0}) == "right"
