"""daemon.alerts: the budget full and the shedding under the floor, each one line with its
MESSAGE_ID when it starts, none while it lasts, again once it ended and starts anew."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from tests.support.journal_records import journal_records
from vmdisktouch.adapters.systemd import journal
from vmdisktouch.daemon.alerts import HostAlerts

MiB = 1 << 20
BUDGET = 100 * MiB


def disk(name, held, wanted, shed=0, limited_by=None, mem=5 << 30, released=None, loaded=0,
         share=None, curve_wants=None):
    dom, tgt = name.split("/") if "/" in name else (None, None)
    w = SimpleNamespace(domain=dom, target=tgt, image=SimpleNamespace(path=f"/img/{name}"),
                        holder=SimpleNamespace(held_bytes=lambda: held),
                        allotment=SimpleNamespace(wanted=wanted,
                                                  share=held if share is None else share,
                                                  curve_wants=curve_wants),
                        config=SimpleNamespace(min_free=1 << 30))
    w.last_report = SimpleNamespace(shed_bytes=shed, limited_by=limited_by,
                                    mem_available_bytes=mem, loaded_bytes=loaded,
                                    released_bytes=shed if released is None else released)
    return w


@pytest.fixture
def lines():
    """The alert lines logged: (level, message, journal fields), cleared when read."""
    with journal_records() as got:
        def take():
            out = list(got)
            got.clear()
            return out

        yield take


def note(alerts, watchers):
    alerts.note(watchers, [(w, w.last_report) for w in watchers], BUDGET, MiB)


def test_budget_full_once_until_it_falls_a_tenth_below(lines):
    a = HostAlerts()
    note(a, [disk("vm1/vda", 60 * MiB, 60 * MiB), disk("vm2/vda", 30 * MiB, 30 * MiB)])
    assert lines() == []                                       # not full, wants no more
    note(a, [disk("vm1/vda", 70 * MiB, 200 * MiB), disk("vm2/vda", 29.5 * MiB, 40 * MiB)])
    [(level, msg, fields)] = lines()                           # within a block: full
    assert level == journal.NOTICE and fields == {"MESSAGE_ID": journal.BUDGET_FULL}
    assert msg.startswith("budget full: held 100M of max_hold 100M, the disks want 240M")
    for wanted in (200, 101, 95):               # still full, or just under: no new line
        note(a, [disk("vm1/vda", 95 * MiB, wanted * MiB)])
    assert lines() == []
    note(a, [disk("vm1/vda", 89 * MiB, 89 * MiB)])            # a tenth below: over
    note(a, [disk("vm1/vda", 100 * MiB, 120 * MiB)])
    assert [f["MESSAGE_ID"] for _, _, f in lines()] == [journal.BUDGET_FULL]


def test_budget_full_of_one_disk_carries_its_fields_and_none_before_a_selection(lines):
    a = HostAlerts()
    w = disk("web/vda", 100 * MiB, 300 * MiB)
    w.allotment = None
    note(a, [w])
    assert lines() == []                        # before the first selection: nothing known
    note(a, [disk("web/vda", 100 * MiB, 300 * MiB)])
    [(_, msg, fields)] = lines()
    assert "the disk wants 300M" in msg
    assert fields == {"DISK": "/img/web/vda", "DOMAIN": "web", "TARGET": "vda",
                      "MESSAGE_ID": journal.BUDGET_FULL}


def test_shedding_once_per_episode(lines):
    a = HostAlerts()
    note(a, [disk("vm1/vda", 50 * MiB, 50 * MiB), disk("vm2/vda", 10 * MiB, 10 * MiB)])
    assert lines() == []
    note(a, [disk("vm1/vda", 40 * MiB, 50 * MiB, shed=10 * MiB, mem=1024 * MiB),
             disk("vm2/vda", 8 * MiB, 10 * MiB, shed=2 * MiB, mem=1025 * MiB)])
    [(level, msg, fields)] = lines()
    assert level == logging.WARNING and fields == {"MESSAGE_ID": journal.FLOOR_SHED}
    assert msg == ("MemAvailable fell under the floor (min_free 1G): released 12M held "
                   "(vm1/vda 10M, vm2/vda 2M); MemAvailable now 1G")
    # it goes on: more shed, or held back by the floor, then shed again: no line
    note(a, [disk("vm1/vda", 30 * MiB, 50 * MiB, shed=10 * MiB)])
    note(a, [disk("vm1/vda", 30 * MiB, 50 * MiB, limited_by="floor")])
    note(a, [disk("vm1/vda", 25 * MiB, 50 * MiB, shed=5 * MiB)])
    assert lines() == []
    # a cycle neither shedding nor held back by the floor ends it; the next one is news
    note(a, [disk("vm1/vda", 25 * MiB, 25 * MiB, limited_by="below_threshold")])
    note(a, [disk("vm1/vda", 20 * MiB, 25 * MiB, shed=5 * MiB)])
    [(_, msg, fields)] = lines()
    assert "released 5M held (vm1/vda 5M)" in msg
    assert fields == {"DISK": "/img/vm1/vda", "DOMAIN": "vm1", "TARGET": "vda",
                      "MESSAGE_ID": journal.FLOOR_SHED}       # the one disk served


def test_a_stale_report_of_a_disk_that_failed_this_cycle_is_not_read(lines):
    a = HostAlerts()
    failed = disk("vm2/vda", 0, 0, shed=5 * MiB)      # its last report: an earlier cycle
    ok = disk("vm1/vda", 10 * MiB, 10 * MiB)
    a.note([ok, failed], [(ok, ok.last_report)], BUDGET, MiB)
    assert lines() == []


def test_a_release_the_floor_kept_from_being_taken_again_is_shedding_too(lines):
    """A renewal (a region released to be taken again) under the floor: the release gave
    the memory back before any shedding was needed, and the floor refused the reload."""
    a = HostAlerts()
    note(a, [disk("vm1/vda", 4 * MiB, 8 * MiB, released=4 * MiB, limited_by="floor")])
    [(_, msg, fields)] = lines()
    assert "released 4M held (vm1/vda 4M)" in msg and fields["MESSAGE_ID"] == journal.FLOOR_SHED
    # a renewal taken again at the floor gave nothing back: the episode only goes on
    note(a, [disk("vm1/vda", 4 * MiB, 8 * MiB, released=4 * MiB, loaded=4 * MiB,
                  limited_by="floor")])
    assert lines() == []
    # released, not for the floor (the budget): not shedding, and it ends the episode
    note(a, [disk("vm1/vda", 4 * MiB, 4 * MiB, released=4 * MiB, limited_by="budget")])
    note(a, [disk("vm1/vda", 2 * MiB, 4 * MiB, released=2 * MiB, limited_by="floor")])
    assert [f["MESSAGE_ID"] for _, _, f in lines()] == [journal.FLOOR_SHED]


class Clock:
    """The alerts' clock: ``step`` seconds a cycle."""

    def __init__(self, step: float = 5.0):
        self.t, self.step = 1000.0, step

    def __call__(self) -> float:
        self.t += self.step
        return self.t


def test_budget_advice_once_a_verdict_held_for_each_disk_and_the_host(lines):
    """db's curve wants 60M of its 20M share for VERDICT_CONFIRM_SECONDS: one line for db
    and one for max_hold; web's young curve says nothing; no more lines while it lasts;
    when db gets its 60M (its share moved: new evidence), one each once it held."""
    from vmdisktouch.core.rules import VERDICT_CONFIRM_SECONDS
    clock = Clock()
    a = HostAlerts(clock=clock)
    confirm = int(VERDICT_CONFIRM_SECONDS // clock.step) + 1

    def cycle(db_share):
        note(a, [disk("db/vdb", db_share, 60 * MiB, share=db_share, curve_wants=60 * MiB),
                 disk("web/vda", 20 * MiB, 40 * MiB)])
    for _ in range(confirm - 1):
        cycle(20 * MiB)
    assert lines() == [] and a.verdicts["/img/db/vdb"] is None and a.verdict is None
    cycle(20 * MiB)
    assert a.verdicts["/img/db/vdb"].verdict == "too_small" and a.verdicts["/img/web/vda"] \
        is None and a.verdict.bytes == 40 * MiB
    got = lines()
    assert [(lv, f) for lv, _, f in got] == [
        (journal.NOTICE, {"DISK": "/img/db/vdb", "DOMAIN": "db", "TARGET": "vdb",
                          "MESSAGE_ID": journal.BUDGET_ADVICE}),
        (journal.NOTICE, {"MESSAGE_ID": journal.BUDGET_ADVICE})]
    assert got[0][1] == ("budget advice: db/vdb: its share 20M is too small: 40M more would "
                         "pay (its curve wants 60M)")
    assert got[1][1] == ("budget advice: max_hold 100M is too small: 40M more would pay (the "
                         "curves of 1 of 2 disks want 60M)")
    for _ in range(3 * confirm):
        cycle(20 * MiB)
    assert lines() == []
    for _ in range(confirm):
        cycle(60 * MiB)
    got = [m for _, m, _ in lines()]
    # the host has no verdict of its own while web's curve has none: only db's line
    assert [m.split(" is ")[1] for m in got] == ["right (its curve wants 60M)"]
    assert a.verdict is None


def test_budget_advice_of_one_disk_is_its_line_alone(lines):
    from vmdisktouch.core.rules import VERDICT_CONFIRM_SECONDS
    clock = Clock()
    a = HostAlerts(clock=clock)
    for _ in range(int(VERDICT_CONFIRM_SECONDS // clock.step) + 1):
        note(a, [disk("web/vda", 20 * MiB, 20 * MiB, share=BUDGET, curve_wants=20 * MiB)])
    [(_, msg, fields)] = lines()
    assert msg == ("budget advice: web/vda: its share 100M is too large: 80M of it buys "
                   "almost nothing (its curve wants 20M)")
    assert fields["DISK"] == "/img/web/vda" and a.verdict.verdict == "too_large"
