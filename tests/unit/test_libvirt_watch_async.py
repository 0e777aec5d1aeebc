"""``LibvirtWatch`` never blocks its caller on libvirt: a fake libvirt whose calls block.

The fake stands for libvirt-python (``import_libvirt``, ``connect``): a
connection whose ``listAllDomains`` and a domain whose ``setMetadata`` wait
on an ``Event`` while ``gate`` is clear, as a stopped libvirtd or a QEMU
monitor held by a synchronous job makes them wait. Every loop-facing call
must return within the bound (``WAIT`` plus scheduling slack), whatever the
worker waits for.
"""

from __future__ import annotations

import logging
import threading
import time

import pytest

from vmdisktouch.adapters.libvirt import libvirt_disks, libvirt_watch
from vmdisktouch.adapters.libvirt.libvirt_disks import LibvirtError

HANG = 10.0       # the longest a blocked fake call waits (then it answers, as libvirt would)
BOUND = 0.35      # the loop's bound, 0.2 s, and a loaded machine's scheduling
XML = """<domain><name>{name}</name><devices><disk type='file' device='disk'>
<driver name='qemu' type='raw' cache='writethrough'/><source file='/img/{name}.raw'/>
<target dev='vda' bus='virtio'/></disk></devices></domain>"""


class FakeError(Exception):
    def get_error_message(self):
        return str(self)

    def get_error_code(self):
        return 42


class FakeLibvirt:
    libvirtError = FakeError
    VIR_DOMAIN_JOB_NONE = 0
    VIR_ERR_NO_DOMAIN = 42
    VIR_DOMAIN_METADATA_ELEMENT = 2
    VIR_DOMAIN_AFFECT_LIVE = 1
    VIR_DOMAIN_EVENT_ID_LIFECYCLE = 0
    VIR_DOMAIN_EVENT_ID_DEVICE_ADDED = 19
    VIR_DOMAIN_EVENT_ID_DEVICE_REMOVED = 15
    VIR_DOMAIN_EVENT_ID_METADATA_CHANGE = 23
    VIR_DOMAIN_EVENT_ID_BLOCK_JOB_2 = 16
    VIR_DOMAIN_EVENT_ID_DISK_CHANGE = 9
    VIR_DOMAIN_EVENT_ID_TRAY_CHANGE = 10


class Dom:
    def __init__(self, lib, name):
        self.lib, self.name_ = lib, name

    def state(self):
        return [1, 1]

    def name(self):
        return self.name_

    def UUIDString(self):
        return f"00000000-0000-0000-0000-{self.name_.encode().hex():0>12}"

    def isActive(self):
        return 1

    def XMLDesc(self, _flags):
        return XML.format(name=self.name_)

    def jobInfo(self):
        return [self.lib.job]

    def setMetadata(self, *args):
        self.lib.gate.wait(HANG)
        self.lib.written.append((self.name_, args[1]))


class Conn:
    def __init__(self, lib):
        self.lib = lib

    def isAlive(self):
        return 1

    def setKeepAlive(self, *_):
        pass

    def domainEventRegisterAny(self, *_):
        return 1

    def domainEventDeregisterAny(self, _):
        pass

    def close(self):
        self.lib.closed += 1

    def listAllDomains(self, _flags):
        self.lib.calls += 1
        self.lib.gate.wait(HANG)
        if self.lib.fail:
            raise FakeError(self.lib.fail)
        return [Dom(self.lib, n) for n in self.lib.domains]

    def lookupByName(self, name):
        return Dom(self.lib, name)


class Lib:
    """The fake's state: ``gate`` clear blocks every listing and write."""

    def __init__(self):
        self.gate = threading.Event()
        self.gate.set()
        self.domains = ["a"]
        self.job, self.fail, self.calls, self.closed = 0, None, 0, 0
        self.written: list[tuple[str, str]] = []


@pytest.fixture
def lib(monkeypatch):
    lib = Lib()
    fake = FakeLibvirt()
    monkeypatch.setattr(libvirt_disks, "import_libvirt", lambda: fake)
    monkeypatch.setattr(libvirt_disks, "connect", lambda uri, readonly=True: Conn(lib))
    monkeypatch.setattr(libvirt_watch, "_ensure_event_loop", lambda _lib: None)
    yield lib
    lib.gate.set()                      # let an abandoned worker finish


class Wake:
    def __init__(self):
        self.event = threading.Event()

    def set(self):
        self.event.set()


def timed(fn, *args):
    t = time.monotonic()
    out = fn(*args)
    return out, time.monotonic() - t


def domains_of(listing):
    return sorted({d.domain for d in listing})


def test_a_listing_that_blocks_returns_the_last_view_within_the_bound(lib, caplog,
                                                                     monkeypatch):
    caplog.set_level(logging.INFO, logger="vmdisktouch")
    w = libvirt_watch.LibvirtWatch("fake:///", wake=Wake())
    try:
        assert domains_of(w.disks()) == ["a"]
        lib.gate.clear()                                 # libvirtd stops answering
        lib.domains = ["a", "b"]
        monkeypatch.setattr(libvirt_watch, "STALE_SECONDS", 3600.0)
        for _ in range(libvirt_watch.STALE_CALLS + 2):   # every cycle of a stall
            listed, took = timed(w.disks)
            assert took < BOUND, took
            assert domains_of(listed) == ["a"]           # held, never emptied
        # calls enough, but a view younger than STALE_SECONDS (a destroy's stall): not said
        assert not [r for r in caplog.records if "has not answered" in r.message]
        monkeypatch.setattr(libvirt_watch, "STALE_SECONDS", 0.0)
        for _ in range(2):
            assert domains_of(w.disks()) == ["a"]
        stale = [r for r in caplog.records if "has not answered" in r.message]
        assert len(stale) == 1 and stale[0].levelno == logging.WARNING   # said once
        assert "holding with the view of" in stale[0].message
        lib.gate.set()                                   # libvirtd answers again
        deadline = time.monotonic() + 5
        while domains_of(w.disks()) != ["a", "b"]:
            assert time.monotonic() < deadline, "the new view never came"
        assert any("answers again" in r.message and r.levelno == logging.INFO
                   for r in caplog.records)
    finally:
        w.close()


def test_a_completed_resync_the_loop_gave_up_on_wakes_it(lib):
    wake = Wake()
    w = libvirt_watch.LibvirtWatch("fake:///", wake=wake)
    try:
        w.disks()
        lib.gate.clear()
        lib.domains = ["a", "c"]
        assert domains_of(w.disks()) == ["a"]            # the loop gave up waiting
        wake.event.clear()
        lib.gate.set()
        assert wake.event.wait(5), "the new view did not wake the loop"
        assert domains_of(w.disks()) == ["a", "c"]
        wake.event.clear()
        w.disks()                                        # the same view: no wake-up
        time.sleep(0.3)
        assert not wake.event.is_set()
    finally:
        w.close()


def test_never_answered_is_none_and_an_error_is_none(lib):
    lib.gate.clear()
    w = libvirt_watch.LibvirtWatch("fake:///", wait=0.05)
    try:
        listed, took = timed(w.disks)        # the first listing: waited FIRST_WAIT at most
        assert listed is None and took < libvirt_watch.FIRST_WAIT + 0.5
        listed, took = timed(w.disks)        # the worker is stuck: not waited for at all
        assert listed is None and took < 0.05
        lib.fail = "cannot list domains: gone"
        lib.gate.set()
        deadline = time.monotonic() + 5
        while lib.calls < 2:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert w.disks() is None             # libvirt answers with an error
        lib.fail = None
        assert domains_of(w.disks()) == ["a"]
    finally:
        w.close()


def test_a_metadata_write_that_blocks_returns_at_once(lib):
    w = libvirt_watch.LibvirtWatch("fake:///")
    try:
        w.disks()
        lib.gate.clear()                                 # a job starts after the check
        ok, took = timed(w.set_metadata, "a", "<heat v='1'/>")
        assert ok is True and took < BOUND
        ok, took = timed(w.set_metadata, "a", "<heat v='2'/>")   # the first one hangs
        assert ok is False and took < BOUND              # not written yet: tried again
        listed, took = timed(w.disks)                    # the worker is busy writing
        assert took < BOUND and domains_of(listed) == ["a"]
        lib.gate.set()
        deadline = time.monotonic() + 5
        while ("a", "<heat v='2'/>") not in lib.written:
            assert time.monotonic() < deadline, lib.written
            time.sleep(0.01)
        time.sleep(0.2)
        assert lib.written[-1] == ("a", "<heat v='2'/>")          # the newest wins, once
        assert lib.written.count(("a", "<heat v='2'/>")) == 1
    finally:
        w.close()


def test_a_write_waits_while_a_job_runs_and_a_failure_is_raised_at_the_next(lib, monkeypatch):
    w = libvirt_watch.LibvirtWatch("fake:///")
    try:
        lib.job = 2                                      # a migration runs
        assert w.set_metadata("a", "<heat v='1'/>") is True
        w.disks()
        time.sleep(0.2)
        assert lib.written == []                         # not while the job runs
        assert w.set_metadata("a", "<heat v='2'/>") is False
        lib.job = 0
        w.disks()                                        # the next resync tries again
        deadline = time.monotonic() + 5
        while lib.written != [("a", "<heat v='2'/>")]:
            assert time.monotonic() < deadline, lib.written
            time.sleep(0.01)

        def gone(_name):
            raise FakeError("Domain not found: no domain with matching name 'a'")
        monkeypatch.setattr(Conn, "lookupByName", lambda self, name: gone(name))
        assert w.set_metadata("a", "<heat v='3'/>") is True
        time.sleep(0.3)
        with pytest.raises(LibvirtError, match="Domain not found"):
            w.set_metadata("a", "<heat v='4'/>")
    finally:
        w.close()


def test_close_abandons_a_stuck_call(lib):
    w = libvirt_watch.LibvirtWatch("fake:///")
    w.disks()
    lib.gate.clear()
    w.disks()                                            # the worker now hangs in libvirt
    _, took = timed(w.close)
    assert took < libvirt_watch.CLOSE_WAIT + 0.15
    assert w._thread.daemon and w._thread.is_alive()     # abandoned, never joined
    lib.gate.set()
    w._thread.join(5)
    assert not w._thread.is_alive() and lib.closed >= 1  # its connections closed on its way out
