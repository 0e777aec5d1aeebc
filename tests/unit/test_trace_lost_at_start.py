"""Lost trace events while the buffer is sized at start are counted apart and not warned;
a loss after the start's sizing is (issue 54: "an events-lost warning at every start under
load"). ``TraceSource`` with a reader whose drains lose and grow as a script says."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import numpy as np

from tests.unit.test_page_size import FakeReader, FakeTracker
from vmdisktouch.daemon.sources import SIZED_AFTER, TraceSource

MiB, S, N = 1 << 20, 10 ** 9, 4


class Growing(FakeReader):
    """Each drain loses ``lost`` events and leaves the buffer at ``kb``, in turn."""

    def __init__(self, script):
        super().__init__(4096)
        self.script, self.lost_why = list(script), "the buffer of 1024 KiB per CPU overflowed"

    def drain(self):
        events = super().drain()
        if self.script:
            events.lost, self.buffer_kb = self.script.pop(0)
        return events


def run(caplog, script):
    clock = [0]
    src = TraceSource(Growing([(0, 1024)] + list(script)), FakeTracker(N), MiB, N,
                      clock_ns=lambda: clock[0])
    caplog.set_level(logging.DEBUG, "vmdisktouch")
    for _ in range(len(script) + 1):
        clock[0] += S
        src.observe(N * MiB, np.zeros(N, dtype=bool), SimpleNamespace())
    said = [(r.levelno, r.getMessage()) for r in caplog.records if "lost" in r.getMessage()]
    return src, said


def test_losses_while_the_buffer_grows_at_start_are_counted_apart_without_a_warning(caplog):
    # lost and grown, the resize's own loss the cycle after, then quiet cycles: sized
    script = [(4949, 2048), (441, 2048), (26089, 4096), (0, 8192), (300, 8192)] + \
        [(0, 8192)] * SIZED_AFTER
    src, said = run(caplog, script)
    assert src.events_lost == 0 and src.lost_at_start == 4949 + 441 + 26089 + 300
    assert src.sizing is False and src.lost_at is None
    assert not [m for lvl, m in said if lvl >= logging.WARNING], said
    assert "the buffer is sized (8192 KiB per CPU)" in said[-1][1], said
    st = src.status()
    assert st["events_lost"] == 0 and st["trace"]["lost_at_start"] == 31779
    assert st["trace"]["sizing"] is False


def test_a_loss_after_the_start_s_sizing_warns_and_counts(caplog):
    script = [(5000, 2048)] + [(0, 2048)] * SIZED_AFTER + [(0, 2048), (700, 4096)]
    src, said = run(caplog, script)
    assert src.lost_at_start == 5000 and src.events_lost == 700
    warned = [m for lvl, m in said if lvl >= logging.WARNING]
    assert len(warned) == 1 and "700 events lost in this cycle (700 since start)" in warned[0]


def test_a_loss_the_buffer_cannot_grow_for_is_steady_at_once(caplog):
    """At its largest the buffer does not grow: a loss then is no sizing, even at start."""
    src, said = run(caplog, [(800, 1024)])
    assert src.sizing is False and src.events_lost == 800 and src.lost_at_start == 0
    assert [lvl for lvl, m in said if "800 events lost" in m] == [logging.WARNING]
