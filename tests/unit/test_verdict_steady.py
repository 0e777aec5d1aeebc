"""A steady guest for 15 minutes gets one budget verdict: the replay of a recorded host.

tests/data/steady-two.jsonl.gz is a host's record (``VMDISKTOUCH_RECORD``) of two
64 MiB disks, each read by fio at 2,000 reads a second, 90 % of them in a tenth of
the image, for 16 minutes under one budget (tests/support/steady_host.py). Each
cycle's line holds what the budget's advice reads of each disk (``advice``: its
share, what its curve wants, what the curve stands on, what it holds). The
replay gives these to the daemon's own alerts (``daemon.alerts.HostAlerts``) at
the recorded times, as ``Host.tick`` does after every cycle, and reads what
they log and what the status would show.

Nothing the guests did changed, yet their curves' wants crept from 9M to 50M
with the shares about 50M, and the code before said "too large", then "right",
several times over. Now: one verdict for each disk and one for the host, and no
cycle whose verdicts contradict each other.
"""

from __future__ import annotations

import gzip
import json
import pathlib
from types import SimpleNamespace

import pytest

from tests.support.journal_records import journal_records
from vmdisktouch.adapters.systemd import journal
from vmdisktouch.core import advice
from vmdisktouch.daemon.alerts import HostAlerts

RECORD = pathlib.Path(__file__).resolve().parents[1] / "data" / "steady-two.jsonl.gz"


def cycles() -> list[dict]:
    with gzip.open(RECORD, "rt") as f:
        return [json.loads(line) for line in f]


def watcher(d: dict, age: float):
    """Disk record ``d`` as the alerts read a disk: its share, its curve's wants once the
    curve is evidence (``DiskWatcher.curve_wants``: the recorded daemon's own test of a
    young curve, then ``advice.evidence`` on what it stood on, ``age`` seconds old)."""
    a = d["advice"]
    ev = advice.evidence(a["evidence"]["reads"], a["evidence"]["re_reads"], age)
    wants = a["curve_wants"] if ev["enough"] else None
    return SimpleNamespace(
        domain=None, target=None, image=SimpleNamespace(path=d["path"], size=a["size"]),
        holder=SimpleNamespace(held_bytes=lambda: a["held"]),
        allotment=SimpleNamespace(share=a["share"], wanted=a["wanted"], curve_wants=wants),
        curve_evidence=lambda: ev)


def replay(record: list[dict]):
    """Yield (time, alerts, the lines this cycle logged) for every recorded cycle."""
    t0 = record[0]["disks"][0]["t"]
    now = [t0]
    alerts = HostAlerts(clock=lambda: now[0])
    with journal_records() as got:
        for line in record:
            disks = [d for d in line["disks"] if d.get("advice")]
            if not disks:
                continue
            bs = disks[0]["settings"]["block_size"]
            now[0] = disks[0]["t"]
            age = now[0] - t0 + disks[0]["settings"]["interval"]
            alerts.note([watcher(d, age) for d in disks], [], line["budget_blocks"] * bs, bs)
            yield now[0], alerts, list(got)
            got.clear()


@pytest.fixture(scope="module")
def record():
    return cycles()


def test_the_record_is_a_steady_guest_of_a_quarter_of_an_hour(record):
    times = [line["disks"][0]["t"] for line in record]
    assert times[-1] - times[0] >= 15 * 60
    rates = [d["demand"]["pages_per_second"] for line in record[len(record) // 4:]
             for d in line["disks"] if d.get("demand")]
    assert max(rates) < 1.2 * min(rates)          # the guests read alike all along


def test_a_steady_guest_for_15_minutes_gets_one_budget_verdict(record):
    said: dict = {}                   # DISK (or "host") -> [(time, verdict line)]
    for t, _, lines in replay(record):
        for _, msg, fields in lines:
            if fields.get("MESSAGE_ID") == journal.BUDGET_ADVICE:
                said.setdefault(fields.get("DISK", "host"), []).append((round(t), msg))
    paths = {d["path"] for d in record[-1]["disks"]}
    assert set(said) == paths | {"host"}, said
    assert all(len(v) == 1 for v in said.values()), said


def test_no_cycle_says_two_verdicts_that_contradict_each_other(record):
    for t, alerts, lines in replay(record):
        mine = [v.verdict for v in alerts.verdicts.values() if v is not None]
        host = alerts.verdict
        if advice.TOO_SMALL in mine:
            assert host is not None and host.verdict == advice.TOO_SMALL, t
        elif host is not None:
            assert None not in alerts.verdicts.values(), t
            assert host.verdict == (advice.TOO_LARGE if advice.TOO_LARGE in mine
                                    else advice.RIGHT), t
        for _, msg, fields in lines:
            if fields.get("MESSAGE_ID") == journal.BUDGET_FULL:
                assert "raise max_hold" not in msg or (
                    host is not None and host.verdict == advice.TOO_SMALL), msg


def test_no_size_is_said_before_the_curve_has_enough_reads(record):
    """The first verdict comes once the curves stand on enough reads, and says no size
    that is the image's."""
    first = None
    for t, alerts, lines in replay(record):
        if any(f.get("MESSAGE_ID") == journal.BUDGET_ADVICE for _, _, f in lines):
            first = (t, [m for _, m, _ in lines])
            break
    assert first is not None
    t0 = record[0]["disks"][0]["t"]
    assert first[0] - t0 >= advice.CURVE_MIN_SECONDS
    assert not any("wants 64M" in m for m in first[1]), first
