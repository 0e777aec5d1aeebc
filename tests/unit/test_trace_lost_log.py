"""A cycle that lost trace events says so in a warning: how many, the total since start and
why when the reader knows; at most one warning a minute, the cycles between at info
(issue 45, part 3: a restore's 149,130 lost events were logged below warning)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import numpy as np

from tests.unit.test_page_size import FakeReader, FakeTracker
from vmdisktouch.daemon.sources import LOST_WARN_EVERY, TraceSource

MiB, S, N = 1 << 20, 10 ** 9, 4


class Losing(FakeReader):
    """A drain loses what ``losses`` says, in turn, for ``lost_why``."""

    def __init__(self, losses):
        super().__init__(4096)
        self.losses, self.lost_why = list(losses), "the buffer of 1024 KiB per CPU overflowed"

    def drain(self):
        events = super().drain()
        events.lost = self.losses.pop(0) if self.losses else 0
        return events


def lines(caplog, losses, seconds_apart: float) -> list[tuple[int, str]]:
    clock = [0]
    src = TraceSource(Losing([0] + list(losses)), FakeTracker(N), MiB, N,
                      clock_ns=lambda: clock[0])
    caplog.set_level(logging.DEBUG, "vmdisktouch")
    for _ in range(len(losses) + 1):
        clock[0] += int(seconds_apart * S)
        src.observe(N * MiB, np.zeros(N, dtype=bool), SimpleNamespace())
    return [(r.levelno, r.getMessage()) for r in caplog.records if "events lost" in
            r.getMessage()]


def test_a_cycle_that_lost_events_is_a_warning_with_how_many_the_total_and_why(caplog):
    assert lines(caplog, [149130], 5.0) == [(logging.WARNING, (
        "trace: fake: 149130 events lost in this cycle (149130 since start): the buffer of "
        "1024 KiB per CPU overflowed; this cycle's residency taken from a mincore pass"))]


def test_one_warning_a_minute_the_cycles_between_at_info(caplog):
    every = int(LOST_WARN_EVERY // 5)                    # cycles of 5 s in a minute
    said = lines(caplog, [10] * (every + 1), 5.0)
    assert [level for level, _ in said] == \
        [logging.WARNING] + [logging.INFO] * (every - 1) + [logging.WARNING]
    assert said[-1][1].startswith(f"trace: fake: 10 events lost in this cycle "
                                  f"({10 * (every + 1)} since start; {every - 1} cycles "
                                  "since the last warning lost events too): ")
