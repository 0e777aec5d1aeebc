"""Fault table, issue 40 round 3: the trace instance's triggers, cpumask and pid filters,
the metrics endpoint under churn, and ``localhost`` that is not loopback.

* A real ``vmdisktouch run IMG --access-source trace`` holds a hot zone; then its
  tracefs instance is tampered with in ways the switches of issue 31 did not show: a
  ``traceoff`` trigger on its read event (``tracing_on`` turned off again at every read:
  before, set back and turned off again each cycle, 80 INFO lines in 40 s, blind), its
  ``tracing_cpumask`` cut to one CPU, the guest's own pid in ``set_event_notrace_pid``.
  The guest (this process) then reads a new zone: it must be held, the tampering undone,
  said in one line.
* The metrics endpoint under back-to-back scrapes and connect-and-close churn from
  several processes: the daemon's CPU stays bounded, real scrapes are served.
* ``--metrics-listen localhost:P`` where ``/etc/hosts`` (bind-mounted in a private mount
  namespace, never the host's file) maps ``localhost`` to 192.0.2.2: refused, exit 78.

See ``tests/faultkit.py``.
"""

from __future__ import annotations

import os

import pytest

from tests.e2e.test_faults_trace import (EVENTS, FAST, NEW, as_set_up, get, held_zone, put,
                                         serving, stopped_cleanly, warnings_about, where)
from tests.faultkit import Untouched, fault, more_cycles, rows_of
from tests.faultkit import image  # noqa: F401 - the rows' fixture
from tests.tracing import tracefs_root  # noqa: F401 - the test's fixture
from vmdisktouch.daemon.sources import instance_name

CASE = "40 round 3"
HEALED = ("the new zone held within 20 s; the trigger (cpumask, pid filter) gone and every "
          "switch as set up; at most 2 log lines about the instance (one WARNING); exit 0 on "
          "SIGTERM, the instance removed")


def no_triggers(inst: str) -> None:
    for ev in EVENTS:
        left = [ln for ln in get(f"{inst}/events/{ev}/trigger").splitlines()
                if not ln.startswith("#")]
        assert left == [], (ev, left)


def _tampered(tamper, extra=lambda inst: None):
    def check(tmp_path, image):
        d = serving(tmp_path, image)
        inst = where(image)
        try:
            tamper(inst)
            held_zone(d, image, NEW)
            more_cycles(d, 14)                    # a scheduled pass and its full check too
            name = instance_name(str(image))
            lines = [ln for ln in d.output().splitlines()
                     if f"trace: {name}" in ln and " DEBUG " not in ln]
            assert 1 <= len(lines) <= 2, d.output()[-3000:]
            assert len(warnings_about(d.output(), f"trace: {name}")) == 1, lines
            assert "stands in for the reads" not in d.output(), lines
            as_set_up(where(image))
            no_triggers(where(image))
            extra(where(image))
        finally:
            stopped_cleanly(d)
        assert not os.path.exists(inst)
    return check


def _cpus(inst: str) -> None:
    mask = int(get(f"{inst}/tracing_cpumask").replace(",", ""), 16)
    assert mask == (1 << os.cpu_count()) - 1, hex(mask)


fault("trace-instance-traceoff-trigger", "while the daemon holds one hot zone, `echo "
      "traceoff > INST/events/filemap/mm_filemap_get_pages/trigger` (each read turns "
      "`tracing_on` off), then the guest reads a new hot zone", "the trigger is removed "
      "(`!traceoff`) with `tracing_on` set back, said once; the daemon keeps seeing reads",
      HEALED, CASE)(_tampered(lambda inst: put(f"{inst}/events/{EVENTS[0]}/trigger",
                                               "traceoff")))
fault("trace-instance-disable-event-trigger", "while the daemon holds one hot zone, a "
      "`disable_event:filemap:mm_filemap_get_pages` trigger on its writeback event and a "
      "`traceoff:5 if index > 0` on its add event, then the guest reads a new hot zone",
      "every trigger removed whatever its count or filter, said once; reads seen again",
      HEALED, CASE)(_tampered(lambda inst: (
          put(f"{inst}/events/{EVENTS[1]}/trigger",
              "disable_event:filemap:mm_filemap_get_pages"),
          put(f"{inst}/events/{EVENTS[2]}/trigger", "traceoff:5 if index > 0"))))
fault("trace-instance-cpumask", "while the daemon holds one hot zone, `echo 1 > "
      "INST/tracing_cpumask` (only CPU 0 traced), then the guest reads a new hot zone",
      "the cpumask is set back to every CPU at the next scheduled pass, said once",
      HEALED, CASE)(_tampered(lambda inst: put(f"{inst}/tracing_cpumask", "1"), _cpus))
fault("trace-instance-notrace-pid-of-the-guest", "while the daemon holds one hot zone, the "
      "guest's pid written to `INST/set_event_notrace_pid` (its reads hidden, the daemon's "
      "probe still seen), then the guest reads a new hot zone", "the pid filter is cleared at "
      "the next scheduled pass (a full check even when the probe came back), said once",
      HEALED, CASE)(_tampered(lambda inst: put(f"{inst}/set_event_notrace_pid",
                                               str(os.getpid())),
                              lambda inst: get(f"{inst}/set_event_notrace_pid") == ""
                              or pytest.fail("the pid filter left")))


# -- the table's own test -------------------------------------------------------------------------

ROWS = rows_of(__name__)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("row", ROWS, ids=[f.id for f in ROWS])
def test_round3_fault(row, tmp_path, image, tracefs_root):  # noqa: F811
    kept = Untouched(image)
    assert row.check(tmp_path, image) is None
    kept.check()
