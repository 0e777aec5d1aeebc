"""cyclelog: a cycle line at INFO only when something changed, a summary every few minutes,
and the reason less than the budget is held."""

import logging

from vmdisktouch.config import settings
from vmdisktouch.daemon.cyclelog import CycleLog
from vmdisktouch.daemon.emit import CycleReport

MiB = 1 << 20
CFG = settings.resolve({"max_hold": "64M", "min_free": "1G"})


def rep(cycle, held=0, regions=(), loaded=0, relocked=0, released=0, rewritten=0, skipped=0,
        avail=8 << 30, spilled=0):
    return CycleReport(cycle=cycle, cycle_seconds=0.01, held_bytes=held, resident_bytes=0,
                       regions=list(regions), rewritten_blocks=rewritten, rewritten_ranges=[],
                       mem_available_bytes=avail, loaded_bytes=loaded, released_bytes=released,
                       skipped_bytes=skipped, size_bytes=1 << 30, relocked_bytes=relocked,
                       spill_read_bytes=spilled, share_bytes=64 * MiB)


def levels(caplog):
    out = [(r.levelno, r.getMessage()) for r in caplog.records]
    caplog.clear()
    return out


def test_quiet_cycles_go_to_debug_and_changes_to_info(caplog):
    caplog.set_level(logging.DEBUG, logger="vmdisktouch")
    cl = CycleLog()
    cl.log(rep(1), CFG, "nothing is above the threshold: no evidence of use yet", 0.0)
    cl.log(rep(2), CFG, "nothing is above the threshold: no evidence of use yet", 5.0)
    (l1, m1), (l2, _) = levels(caplog)
    assert (l1, l2) == (logging.INFO, logging.DEBUG)
    assert m1.startswith("cycle 1: held 0/64M") and m1.endswith(
        "; not holding more: nothing is above the threshold: no evidence of use yet")
    cl.log(rep(3, held=32 * MiB, regions=[(0, 32 * MiB)], loaded=32 * MiB, relocked=8 * MiB),
           CFG, None, 10.0)
    [(lvl, msg)] = levels(caplog)
    assert lvl == logging.INFO and "loaded 32M (24M from disk, 8M relocked)" in msg
    cl.log(rep(4, held=32 * MiB, regions=[(0, 32 * MiB)]), CFG, None, 15.0)
    assert levels(caplog)[0][0] == logging.DEBUG                 # steady: quiet
    # news: a move of a sixteenth of what it holds or may hold (64M here), a new skip
    for kw in ({"released": 4 * MiB}, {"loaded": 2 * MiB, "released": 2 * MiB},
               {"skipped": MiB}):
        cl.log(rep(5, held=32 * MiB, regions=[(0, 32 * MiB)], **kw), CFG, None, 20.0)
        assert levels(caplog)[0][0] == logging.INFO, kw
        cl.log(rep(6, held=32 * MiB, regions=[(0, 32 * MiB)]), CFG, None, 20.0)
        caplog.clear()
    # no news (#32: a line every cycle for each disk of a busy host): a guest that writes,
    # a spill that tops up, an edge that moves by a block, the same reason whose text
    # names MemAvailable
    for kw in ({"rewritten": 3}, {"spilled": MiB}, {"loaded": MiB, "released": MiB},
               {"regions": [(0, 16 * MiB), (32 * MiB, 16 * MiB)]}):
        cl.log(rep(7, **{"held": 32 * MiB, "regions": [(0, 32 * MiB)], **kw}), CFG, None, 25.0)
        assert levels(caplog)[0][0] == logging.DEBUG, kw


def test_a_cycle_that_spilled_says_how_much(caplog):
    caplog.set_level(logging.DEBUG, logger="vmdisktouch")
    CycleLog().log(rep(1, held=32 * MiB, regions=[(0, 32 * MiB)], spilled=8 * MiB), CFG,
                   None, 0.0)                                 # (the first: at INFO)
    [(lvl, msg)] = levels(caplog)
    assert lvl == logging.INFO and "loaded 0, spilled 8M unlocked, released" in msg


def test_a_summary_every_few_minutes(caplog):
    caplog.set_level(logging.INFO, logger="vmdisktouch")
    cl = CycleLog("/img")
    t = 0.0
    for k in range(1, 62):                                    # 5 s cycles: 300 s
        cl.log(rep(k, held=MiB, regions=[(0, MiB)], loaded=MiB if k == 1 else 0), CFG, None, t)
        t += 5.0
    msgs = [m for _, m in levels(caplog)]
    assert msgs[0].startswith("/img: cycle 1:") and len(msgs) == 2
    assert msgs[1].startswith("/img: last 5 min: 61 cycles") and "loaded 1M" in msgs[1]


def test_the_same_skip_every_cycle_is_logged_once(caplog):
    """A disk at a limit (the lock limit, the floor) skips the same bytes each cycle: its
    line is at INFO when the skip starts or changes, not every cycle (#32: one line per
    cycle per disk at a lock limit)."""
    caplog.set_level(logging.DEBUG, logger="vmdisktouch")
    cl = CycleLog()
    why = "the kernel refused to lock more (x)"
    for k, skipped in enumerate((MiB, MiB, MiB, 2 * MiB, 2 * MiB), 1):
        cl.log(rep(k, skipped=skipped), CFG, why, 5.0 * k)
    assert [lvl for lvl, _ in levels(caplog)] == [logging.INFO, logging.DEBUG, logging.DEBUG,
                                                 logging.INFO, logging.DEBUG]


def test_one_of_a_kind_is_said_in_the_singular(caplog):
    """"in 1 regions" read wrong to an operator: every count of the line and of the summary
    agrees with its number."""
    caplog.set_level(logging.DEBUG, logger="vmdisktouch")
    cl = CycleLog()
    cl.log(rep(1, held=32 * MiB, regions=[(0, 32 * MiB)], rewritten=1), CFG, None, 0.0)
    [(_, msg)] = levels(caplog)
    assert "in 1 region," in msg and "rewritten 1 block," in msg
    cl.log(rep(2, held=32 * MiB, regions=[(0, 16 * MiB), (32 * MiB, 16 * MiB)], rewritten=2),
           CFG, None, 1000.0)
    [(_, msg), (_, summary)] = levels(caplog)
    assert "in 2 regions," in msg and "rewritten 2 blocks," in msg
    assert "2 cycles" in summary and "in 2 regions" in summary
