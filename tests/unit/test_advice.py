"""core.advice: a disk's share, and the host's budget, read against what the curves want."""

from __future__ import annotations

import itertools

from vmdisktouch.core.advice import (HOLD_CYCLES, RIGHT, TOO_LARGE, TOO_SMALL, Verdict,
                                     Verdicts, disk_verdict, evidence, host_of, host_verdict,
                                     not_enough)
from vmdisktouch.core.rules import (CURVE_MAX_UNSEEN, CURVE_MIN_SECONDS, CURVE_SETTLED_SECONDS,
                                    VERDICT_CONFIRM_SECONDS, VERDICT_HOLD_SECONDS)
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
    # a young curve may want the rest: no verdict of too large, nor "right" beside a disk
    # whose share is too large (the two lines would contradict each other): none yet
    assert host_verdict([(2 * GiB, 300 * MiB), (2 * GiB, None)], 2 * GiB) is None
    assert host_verdict([(GiB, GiB), (GiB, 900 * MiB)], 2 * GiB) == Verdict(RIGHT, 0)


def run(v: Verdicts, cycles: int, share: int, wants, t0: float, step: float = 5.0,
        budget: int = 2 * GiB) -> tuple[list, float]:
    """``cycles`` cycles of disk "a" at ``share`` and ``wants`` (a list: one a cycle, in
    turn), ``step`` seconds apart from ``t0``: (every verdict said, the time after)."""
    wants = wants if isinstance(wants, list) else [wants]
    said, t = [], t0
    for k in range(cycles):
        t += step
        changed, _ = v.note(t, budget, [("a", share, wants[k % len(wants)])])
        said += [x.verdict for _, x in changed]
    return said, t


def test_a_verdict_is_said_once_it_held_its_confirmation_and_not_again_while_it_lasts():
    v = Verdicts()
    n = int(VERDICT_CONFIRM_SECONDS // 5)
    said, t = run(v, n, 400 * MiB, 1600 * MiB, 0.0)
    assert said == [] and v.said == {}                   # not yet held for long enough
    said, t = run(v, 1, 400 * MiB, 1600 * MiB, t)
    assert said == [TOO_SMALL] and v.said["a"] == Verdict(TOO_SMALL, 1200 * MiB)
    said, t = run(v, 100, 400 * MiB, 1600 * MiB, t)
    assert said == []
    # fast cycles: HOLD_CYCLES at least, however long they take
    v2 = Verdicts()
    assert run(v2, HOLD_CYCLES - 1, 400 * MiB, 1600 * MiB, 0.0, step=100.0)[0] == []
    assert run(v2, 1, 400 * MiB, 1600 * MiB, 1000.0, step=100.0)[0] == [TOO_SMALL]


def test_a_curve_that_wavers_at_the_edge_says_one_verdict_for_the_hold():
    """wants 3G, 456M, 432M, 360M: the noise of one steady guest's curve (a 432M share)."""
    v = Verdicts()
    noisy = [3 << 30, 456 * MiB, 432 * MiB, 360 * MiB, 300 * MiB, 432 * MiB]
    said, t = run(v, int(VERDICT_HOLD_SECONDS // 5), 432 * MiB, noisy, 0.0)
    assert said == []           # never the same verdict for a minute: nothing to say
    said, t = run(v, int(VERDICT_CONFIRM_SECONDS // 5) + 1, 432 * MiB, 432 * MiB, t)
    assert said == [RIGHT]      # in the last of these cycles
    # a contrary verdict, confirmed, waits out the hold ...
    said, t = run(v, int((VERDICT_HOLD_SECONDS - 30) // 5), 432 * MiB, 3 << 30, t)
    assert said == []
    # ... and is said once the verdict said has stood VERDICT_HOLD_SECONDS
    said, t = run(v, 20, 432 * MiB, 3 << 30, t)
    assert said == [TOO_SMALL]


def test_a_share_moved_past_the_margin_is_new_evidence_the_hold_gives_way():
    v = Verdicts()
    said, t = run(v, 20, 400 * MiB, 1600 * MiB, 0.0)
    assert said == [TOO_SMALL]
    said, t = run(v, 20, 1600 * MiB, 1600 * MiB, t)      # max_hold raised: its share grew
    assert said == [RIGHT]


def test_a_curve_that_loses_its_evidence_keeps_the_verdict_said():
    v = Verdicts()
    said, t = run(v, 20, 400 * MiB, 1600 * MiB, 0.0)
    said, t = run(v, 20, 400 * MiB, None, t)
    assert said == [] and v.said["a"].verdict == TOO_SMALL


def test_the_host_never_contradicts_a_disk():
    """Every mix of the disks' verdicts: the host's is too small when one is, never right
    beside a disk too small or too large, never too large beside a disk too small."""
    kinds = [None, Verdict(TOO_SMALL, MiB), Verdict(TOO_LARGE, MiB), Verdict(RIGHT, 0)]
    for mix in itertools.product(kinds, repeat=3):
        h = host_of(list(mix), [MiB] * 3, 4 * MiB)
        names = {x.verdict for x in mix if x is not None}
        if TOO_SMALL in names:
            assert h.verdict == TOO_SMALL, mix
        elif h is not None:
            assert h.verdict == (TOO_LARGE if TOO_LARGE in names else RIGHT), mix
            assert None not in mix, mix


def test_the_host_s_verdict_comes_from_the_disks_said():
    v = Verdicts()
    for k in range(30):
        changed, host = v.note(5.0 * k, 2 * GiB, [("a", 400 * MiB, 1600 * MiB),
                                                 ("b", GiB, 100 * MiB)])
        if changed:
            assert {x.verdict for _, x in changed} == {TOO_SMALL, TOO_LARGE}
            assert host == Verdict(TOO_SMALL, 1200 * MiB)
    assert v.host.verdict == TOO_SMALL


def test_a_curve_is_evidence_from_its_window_its_re_reads_and_its_reuse_on():
    ev = evidence(100, 50, 10)            # 5 re-reads a second: 810 s to the minimum's
    assert not ev["enough"] and ev["wait_seconds"] == 810
    assert not_enough(ev) == f"not enough reads yet: watch for {ev['wait_seconds']} s more"
    ev = evidence(10 ** 6, 995 * 10 ** 3, 30)             # reuse seen, watched too short
    assert not ev["enough"] and ev["wait_seconds"] == CURVE_MIN_SECONDS - 30
    ev = evidence(10 ** 6, 999 * 10 ** 3, 200)
    assert ev["enough"] and ev["wait_seconds"] == 0
    ev = evidence(10 ** 4, 2 * 10 ** 3, 200)                # too few re-reads
    assert not ev["enough"] and ev["wait_seconds"] == CURVE_SETTLED_SECONDS - 200
    ev = evidence(10 ** 5, 99 * 10 ** 3 // 2, 200)        # not seen, watched not long enough
    assert not ev["enough"] and ev["wait_seconds"] == CURVE_SETTLED_SECONDS - 200
    ev = evidence(10 ** 5, 95 * 10 ** 3, CURVE_SETTLED_SECONDS)   # settled by its age
    assert ev["enough"]
    ev = evidence(10 ** 6, 0, 300)
    assert not ev["enough"] and ev["wait_seconds"] is None  # no re-read: nothing to tell by
    assert not_enough(ev) == "not enough reads yet"
    assert 1 - (1 - CURVE_MAX_UNSEEN) < 0.02


def test_in_words():
    assert said({"verdict": TOO_SMALL, "bytes": 1200 * MiB}) == "too small: 1.2G more would pay"
    assert said({"verdict": TOO_LARGE, "bytes": 512 * MiB}) == \
        "too large: 512M of it buys almost nothing"
    assert said({"verdict": RIGHT, "bytes": 0}) == "right"
