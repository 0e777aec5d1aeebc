"""The arrival rule (daemon/arrival.py): a disk whose domain arrives holds nothing and is
not warmed until QEMU has activated its disks; libvirt's states classified
(adapters/domain_state.arriving)."""

from __future__ import annotations

import logging

import pytest

from vmdisktouch.adapters.libvirt.domain_state import activated, arriving
from vmdisktouch.daemon.arrival import Follower
from vmdisktouch.daemon.membership import Member

RUNNING, PAUSED, SHUTOFF = 1, 3, 5
P_USER, P_MIGRATION, P_SAVE, P_STARTING_UP = 1, 2, 3, 11


@pytest.mark.parametrize("active,state,reason,job,landed,expected", [
    (True, PAUSED, P_STARTING_UP, False, False, "starting"),  # QEMU starting (an incoming too)
    (True, PAUSED, P_MIGRATION, True, False, "incoming"),     # an incoming migration runs
    (True, PAUSED, P_MIGRATION, False, False, ""),            # after a completed restore
    (True, PAUSED, P_USER, True, False, ""),                  # paused by the user
    (True, PAUSED, P_USER, False, True, "landed"),            # a paused domain migrated here
    (True, PAUSED, P_SAVE, True, True, ""),                   # being saved: leaving
    (True, RUNNING, 2, True, True, ""),                       # running (resumed after it)
    (False, SHUTOFF, 5, False, True, ""),
])
def test_arriving_from_state_reason_and_jobs(active, state, reason, job, landed, expected):
    asked = []

    def job_running():
        asked.append("job")
        return job

    def came_in():
        asked.append("landed")
        return landed

    assert arriving(active, state, reason, job_running, came_in) == expected
    # the running job is asked only to tell an incoming migration from a completed restore,
    # the completed one only of a domain paused by the user
    assert ("job" in asked) == (active and state == PAUSED and reason == P_MIGRATION)
    assert ("landed" in asked) == (active and state == PAUSED and reason == P_USER)


class Img:
    path = "/images/a.raw"


class W:
    def __init__(self):
        self.image = Img()
        self.emitter = type("E", (), {"cycles": type("C", (), {"label": ""})()})()
        self.hold_enabled, self.domain_active = True, None
        self.domain = self.target = None


def member(**kw):
    return Member("/images/a.raw", "vm1", "vda", **{"active": True, "activated": True, **kw})


def test_an_arriving_disk_is_not_held_nor_warmed_until_its_arrival_completes(caplog):
    warmed = []
    f = Follower(lambda w, m: warmed.append(m.carried), single=False)
    w = W()
    m = member(arriving="incoming", carried="summary-1")
    caplog.set_level(logging.INFO, logger="vmdisktouch")
    f.opened(w, m)
    for _ in range(3):                               # the incoming takes cycles
        f.follow(w, m)
        assert w.hold_enabled is False and warmed == []
    assert sum("is arriving" in r.getMessage() for r in caplog.records) == 1   # said once
    f.follow(w, member(carried="summary-2"))        # resumed: QEMU activated its disks
    assert w.hold_enabled is True
    assert warmed == ["summary-2"]                  # the summary the listing has now
    f.follow(w, member(carried="summary-3"))
    assert warmed == ["summary-2"]                  # warmed once
    assert any("has arrived" in r.getMessage() for r in caplog.records)
    assert not any("holding again" in r.getMessage() for r in caplog.records)


def test_a_disk_not_arriving_is_warmed_at_open_and_held():
    warmed = []
    f = Follower(lambda w, m: warmed.append(m), single=True)
    w = W()
    f.opened(w, member())
    f.follow(w, member())
    assert len(warmed) == 1 and w.hold_enabled is True and w.domain == "vm1"


def test_a_held_disk_whose_domain_goes_arriving_releases_and_comes_back():
    f = Follower(lambda w, m: None, single=False)
    w = W()
    f.opened(w, member())
    f.follow(w, member())
    f.follow(w, member(active=False))               # shut off (migrated away)
    assert w.hold_enabled is False
    f.follow(w, member(arriving="incoming"))              # back, by an incoming migration
    assert w.hold_enabled is False
    f.follow(w, member())
    assert w.hold_enabled is True


def test_an_arrival_that_ends_shut_off_stays_unwarmed():
    warmed = []
    f = Follower(lambda w, m: warmed.append(m), single=False)
    w = W()
    f.opened(w, member(arriving="incoming"))
    f.follow(w, member(arriving="incoming"))
    f.follow(w, member(active=False))               # the incoming failed
    assert w.hold_enabled is False and warmed == []
    f.follow(w, member())                           # started later: warmed then
    assert w.hold_enabled is True and len(warmed) == 1


@pytest.mark.parametrize("active,state,reason,job,expected", [
    (True, RUNNING, 2, False, True),                # running: QEMU activated its disks
    (True, PAUSED, P_MIGRATION, False, True),       # paused after a completed restore
    (True, PAUSED, P_MIGRATION, True, False),       # an incoming migration runs
    (True, PAUSED, P_USER, False, False),           # paused: maybe a migrated paused domain
    (True, PAUSED, P_STARTING_UP, False, False),
    (False, SHUTOFF, 5, False, False),
])
def test_activated_only_when_certain(active, state, reason, job, expected):
    assert activated(active, state, reason, lambda: job) is expected


def test_a_paused_domain_that_arrived_waits_for_its_resume():
    """A paused domain's migration ends "paused (user)" with its disks not activated
    until ``cont`` (late block activation): seen arriving, it is not held before it runs."""
    warmed = []
    f = Follower(lambda w, m: warmed.append(m), single=False)
    w = W()
    f.opened(w, member(arriving="incoming", activated=False))
    f.follow(w, member(arriving="incoming", activated=False))
    f.follow(w, member(activated=False))            # the incoming ended: paused (user)
    assert w.hold_enabled is False and warmed == []
    f.follow(w, member())                           # resumed
    assert w.hold_enabled is True and len(warmed) == 1


def test_a_domain_booted_paused_is_held_once_started():
    """Starting up is an arrival while it lasts, not after: a domain booted paused ends
    "paused (user)" with its disks active."""
    f = Follower(lambda w, m: None, single=False)
    w = W()
    f.opened(w, member(arriving="starting", activated=False))
    f.follow(w, member(arriving="starting", activated=False))
    assert w.hold_enabled is False
    f.follow(w, member(activated=False))
    assert w.hold_enabled is True


def test_a_paused_domain_never_seen_arriving_is_held():
    f = Follower(lambda w, m: None, single=False)
    w = W()
    f.opened(w, member(activated=False))            # started paused before the daemon
    f.follow(w, member(activated=False))
    assert w.hold_enabled is True


def test_the_reason_names_the_arrival():
    from vmdisktouch.daemon.reasons import Facts, why_not_held

    def line(arriving):
        return why_not_held(None, None, Facts(False, None, lambda: 0.0, 0.05, None,
                                              arriving=arriving))

    assert line(True) == ("domain_off", "its libvirt domain is arriving: nothing is held "
                                        "until QEMU has activated its disks")
    assert line(False) == ("domain_off", "its libvirt domain is not running")


def test_a_daemon_started_after_a_paused_migration_waits_for_the_resume():
    """A daemon that starts while a paused domain that migrated here waits (its disks not
    activated until ``cont``) first sees it "landed": not held, not warmed, until it runs;
    then a pause by the user while the daemon watches is a pause, not an arrival."""
    warmed = []
    f = Follower(lambda w, m: warmed.append(m), single=False)
    w = W()
    f.opened(w, member(arriving="landed", activated=False))
    f.follow(w, member(arriving="landed", activated=False))
    assert w.hold_enabled is False and warmed == []
    f.follow(w, member())                           # resumed: QEMU activated its disks
    assert w.hold_enabled is True and len(warmed) == 1
    f.follow(w, member(arriving="landed", activated=False))     # paused by the user again
    assert w.hold_enabled is True and len(warmed) == 1


def test_a_domain_that_takes_a_given_image_is_said_once_and_followed(caplog):
    """``run IMG --uri``: an image no domain uses is held; a domain restored onto it is
    named in one line ("takes it"), the disk holds nothing while it arrives, and holds
    again once it runs (issue 54, 2)."""
    f = Follower(lambda w, m: None, single=True)
    w = W()
    caplog.set_level(logging.INFO, logger="vmdisktouch")
    alone = Member("/images/a.raw")                  # no domain uses it: held
    f.opened(w, alone)
    f.follow(w, alone)
    assert w.hold_enabled is True
    f.follow(w, member(arriving="starting", activated=False))      # a restore's incoming
    assert w.hold_enabled is False
    f.follow(w, member(arriving="starting", activated=False))
    f.follow(w, member())                            # restored, running
    assert w.hold_enabled is True
    said = [r.getMessage() for r in caplog.records]
    assert sum("libvirt domain vm1 takes it (disk vda, arriving)" in s for s in said) == 1, said
    assert sum("libvirt domain vm1 is arriving" in s and "releasing the holds" in s
               for s in said) == 1, said
    assert sum("libvirt domain vm1 is running; holding again" in s for s in said) == 1, said
    f.follow(w, Member("/images/a.raw", active=False))     # saved again: it left libvirt
    assert w.hold_enabled is False
    f.follow(w, member(arriving="starting", activated=False))      # and restored again
    assert sum("takes it" in r.getMessage() for r in caplog.records) == 2
