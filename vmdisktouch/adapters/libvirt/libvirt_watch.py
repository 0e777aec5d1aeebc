"""libvirt, followed: one connection that reconnects, every domain's disks on demand.

Theory of operation
-------------------
The daemon asks libvirt one question, whatever it serves: which disks do
the domains use now, and is each domain running (``LibvirtWatch.disks``,
a *resync*: every domain and its live disks, ``libvirt_disks.list_disks``).
The loop asks it once a cycle, so a domain started, stopped, destroyed,
restored or migrated away, or a disk plugged or unplugged, is seen within
one cycle whatever happened to the events. The events (lifecycle, device
added or removed) only wake the loop at once (``wake.set()``), so a change
is acted on now, not at the end of the interval; a missed event costs at
most one cycle.

What a resync reads. Each domain's state is asked every time (cheap), but
its XML, which may hold megabytes of other applications' metadata, only
when it may have changed (``libvirt_disks.Memo`` with ``events``): when the
domain arrives, when an event names it (lifecycle, device added or removed,
block job, disk or tray change, metadata change: any namespace's, so a
label set with ``virsh metadata`` is followed at once), when its ID or
state changed since its XML was read, and at least every
``Memo.REFRESH`` s. After a (re)connection every XML is read again (the
events meanwhile were lost); without events (their registration failed)
every resync reads every XML, as before.

Never on the loop. Every libvirt call runs in one worker thread per watch,
on its own connections, because a call can hang: a libvirtd stopped or
stuck, or a QEMU monitor blocked by a synchronous job, makes a listing or a
metadata write wait up to libvirt's 30 s, and the loop (its status file,
its watchdog pings, a SIGTERM) with it. ``disks`` asks the worker for a
resync and waits for it at most ``WAIT`` (0.2 s; ``FIRST_WAIT`` for the
first listing ever, so the O_DIRECT check at start-up has one), not at
all while the worker is already stuck; it returns the newest completed
listing, possibly stale: the view is held, never emptied. A listing that
has not been renewed for ``STALE_CALLS`` calls in a row is said once at
WARNING ("has not answered for X s; holding with the view of HH:MM:SS"),
once it is ``STALE_SECONDS`` old (a destroy blocks the listings for about 2 s), its
return at INFO ("answers again"). A resync that completes after the
loop stopped waiting for it wakes the loop when the view changed, so a
change is acted on at once, not a cycle late. ``set_metadata`` hands the
write to the worker and returns at once. ``close`` never waits for a stuck
call: the worker is a daemon thread, abandoned with what it waits for.

libvirt's default event loop runs in one daemon thread per process (it
must be registered before the connection is opened); a keepalive of 5 s
x 3 notices a dead libvirtd (20 s without an answer close the connection).
When libvirt answers with an error, ``disks`` returns None (said once: at
INFO when it never answered, a host without libvirt; at WARNING when it
stopped answering), the caller keeps what it knows, and the next resync
reconnects.

The pure rules over the listing live here too: which disks a host service
serves (``wanted``), which domains own an image path (``owners``) and
whether a domain uses it as an ineligible disk (``require_eligible``).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

from vmdisktouch.adapters.libvirt import libvirt_disks
from vmdisktouch.adapters.libvirt.libvirt_disks import DEFAULT_URI, Disk, LibvirtError
from vmdisktouch.errors import EX_CONFIG, VmdtError

log = logging.getLogger("vmdisktouch")


class IneligibleDiskError(VmdtError):
    """A domain uses the disk in a way ``libvirt_disks.assess`` finds ineligible (O_DIRECT,
    read-only...): the per-disk check refuses what the host service skips (override: --force)."""

    exit_code = EX_CONFIG


@dataclass(frozen=True)
class Wanted:
    """The disks to serve (by path) and those left out, with their reasons."""
    serve: dict[str, Disk]                                # image path -> its disk
    skipped: dict[tuple[str, str], tuple[str, str]]       # (domain, target) -> (code, why)
    # skipped for O_DIRECT alone, a local file or device that ``vmdisktouch adopt`` could
    # switch: (domain, target) -> its domain's labels (``[adopt]``)
    adoptable: dict[tuple[str, str], tuple[str, ...]] = field(default_factory=dict)
    # of those, the ones their domain carries as adopted (``adopted.mark``): adopted again
    readopt: frozenset[tuple[str, str]] = frozenset()


def wanted(disks: list[Disk]) -> Wanted:
    """The running domains' disks a host budget is for: those ``libvirt_disks.assess``
    finds eligible, the others listed with its reason (the one verdict)."""
    serve: dict[str, Disk] = {}
    skipped: dict[tuple[str, str], tuple[str, str]] = {}
    adoptable: dict[tuple[str, str], tuple[str, ...]] = {}
    readopt = set()
    for d in disks:
        if not d.active:
            continue
        if d.eligible:
            serve.setdefault(d.source, d)
        else:
            skipped[(d.domain, d.target)] = (d.code, d.reason)
            if d.code == "o_direct" and d.io != "native" and not d.readonly:
                adoptable[(d.domain, d.target)] = d.labels
                if d.adopt_marked:
                    readopt.add((d.domain, d.target))
    return Wanted(serve, skipped, adoptable, frozenset(readopt))


def owners(disks: list[Disk], path: str) -> list[Disk]:
    """The disks whose source is the image ``path`` (realpath, inode or device number:
    a symlink or a /dev/disk/by-* alias matches), running domains first."""
    found = [d for d in disks if d.source and d.type in ("file", "block")
             and libvirt_disks.same_file(d.source, path)]
    found.sort(key=lambda d: (not d.active, d.domain))
    return found


def require_eligible(found: list[Disk], path: str, force: bool = False) -> None:
    """Raise ``IneligibleDiskError`` when a domain of ``found`` (``owners``) uses ``path`` as
    a disk ``libvirt_disks.assess`` finds ineligible, unless ``force`` (then a warning)."""
    bad = next((d for d in found if not d.eligible), None)
    if bad is None:
        return
    why = f"domain {bad.domain}, disk {bad.target}: {bad.reason}"
    if force:
        log.warning("%s: %s (--force: holding it anyway)", path, why)
        return
    raise IneligibleDiskError(f"{path}: {why}; pass --force to hold it anyway")


# ---------------------------------------------------------------------------
# the process-wide libvirt event loop

_loop_lock = threading.Lock()
_loop_started = False


def _ensure_event_loop(libvirt) -> None:
    """Register libvirt's default event loop (once per process) and run it in a thread."""
    global _loop_started
    with _loop_lock:
        if _loop_started:
            return
        libvirt.virEventRegisterDefaultImpl()   # must precede opening the connection

        def run():
            while True:
                try:
                    libvirt.virEventRunDefaultImpl()
                except libvirt.libvirtError as exc:   # pragma: no cover - defensive
                    log.debug("libvirt event loop: %s", exc)
                    time.sleep(1.0)

        threading.Thread(target=run, name="libvirt-events", daemon=True).start()
        _loop_started = True


# ---------------------------------------------------------------------------
# the worker: every libvirt call, off the loop

WAIT = 0.2          # the longest the loop waits for libvirt in one call, in seconds
FIRST_WAIT = 5.0    # ... for the first listing ever, at start-up (the O_DIRECT check needs it)
STALE_CALLS = 3     # calls in a row without a fresh listing before it is said ...
STALE_SECONDS = 5.0  # ... once the view is this old: a domain's destroy blocks libvirt's
                     # listings for 1.6-1.8 s, which a loop woken at each event counted
                     # as three calls (a false "has not answered" at almost every destroy)
CLOSE_WAIT = 0.2    # close(): the worker's connections closed if it is free within this


class LibvirtWatch:
    """Every domain's disks, resynced on demand in a worker thread; libvirt's events wake
    the loop. The loop waits at most ``wait`` s for any call (the module docstring)."""

    def __init__(self, uri: str = DEFAULT_URI, wake=None, wait: float = WAIT):
        self.uri, self.wake, self.wait = uri, wake, wait
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False
        # shared with the worker, under _cond
        self._asked = 0                     # resyncs asked (a counter: the newest wins)
        self._done = 0                      # the newest request a completed resync answered
        self._busy_since: float | None = None   # when the worker's current task began
        self._listing: list[Disk] | None = None  # the newest completed listing
        self._listed_at = (0.0, 0.0)        # its (monotonic, wall) time
        self._error: str | None = None      # the newest resync failed: why
        self._waiting = False               # the loop waits for a resync now
        self._writes: dict[str, str] = {}   # domain -> heat summary to write
        self._write_new = False
        self._write_errors: dict[str, str] = {}   # domain -> a failed write, said once
        # the worker's own
        self._conn = None
        self._rw = None                     # read-write: only to write metadata
        self._memo = libvirt_disks.Memo()   # its ``events`` set while they are followed
        self._callbacks: list[int] = []
        # the loop's own (what was said)
        self._unreachable: str | None = None
        self._answered = False              # libvirt answered once: losing it is a warning
        self._behind = 0                    # calls in a row without a fresh listing
        self._stale_said, self._stale_view = False, None   # said stale, of this listing

    # -- the loop's side: never waits longer than ``wait``

    def disks(self) -> list[Disk] | None:
        """The newest listing of every disk of every domain (a resync asked now, waited for
        up to ``wait`` s): possibly stale while libvirt does not answer; None when libvirt
        cannot be asked (its error) or has never answered."""
        with self._cond:
            self._start()
            self._asked += 1
            mine = self._asked
            self._cond.notify_all()
            now = time.monotonic()
            first = self._done == 0
            stuck = self._busy_since is not None and now - self._busy_since > self.wait
            if not stuck:
                self._waiting = True
                self._cond.wait_for(lambda: self._done >= mine,
                                    FIRST_WAIT if first else self.wait)
                self._waiting = False
            fresh = self._done >= mine
            listing, error, listed_at = self._listing, self._error, self._listed_at
        return self._said(fresh, listing, error, listed_at)

    def _said(self, fresh, listing, error, listed_at):
        """What ``disks`` returns, said in the log once per episode."""
        if fresh and error is not None:
            self._behind, self._stale_said = 0, False
            if error != self._unreachable:
                level = logging.WARNING if self._answered else logging.INFO
                log.log(level, "libvirt at %s: %s; keeping what is known, asking again "
                        "each cycle", self.uri, error)
                self._unreachable = error
            return None
        # a listing completed since the stall was said is an answer too, waited for or not
        renewed = self._stale_said and error is None and listed_at != self._stale_view
        if fresh or renewed:
            if (self._unreachable or self._stale_said) and self._answered:
                log.info("libvirt at %s answers again", self.uri)
            self._unreachable, self._answered = None, True
            self._behind, self._stale_said = 0, False
            return listing
        self._behind += 1
        if error is not None or listing is None:
            return None                     # unreachable, or never answered: keep what is known
        if self._behind >= STALE_CALLS and not self._stale_said and \
                time.monotonic() - listed_at[0] >= STALE_SECONDS:
            log.warning("libvirt at %s has not answered for %.0f s; holding with the view "
                        "of %s", self.uri, time.monotonic() - listed_at[0],
                        time.strftime("%H:%M:%S", time.localtime(listed_at[1])))
            self._stale_said, self._stale_view = True, listed_at
        return listing

    def set_metadata(self, domain: str, xml: str) -> bool:
        """Hand the heat summary of ``domain`` (``domain_heat``) to the worker, which writes
        it into the live definition unless a job runs on it (a migration, a save: the write
        would wait for that job's end, up to libvirt's 30 s; it is tried again at each
        resync). False while an earlier one is not written yet (this one replaces it);
        ``LibvirtError`` in one line when the earlier write failed."""
        with self._cond:
            self._start()
            error = self._write_errors.pop(domain, None)
            pending = domain in self._writes
            self._writes[domain] = xml
            self._write_new = True
            self._cond.notify_all()
        if error is not None:
            raise LibvirtError(error)
        return not pending

    def close(self) -> None:
        """Stop the worker; a call stuck in libvirt is abandoned (a daemon thread), never
        waited for: a stop must not hang on a libvirtd that does not answer."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(CLOSE_WAIT)

    def _start(self) -> None:
        if self._thread is None and not self._closed:
            self._thread = threading.Thread(target=self._run, name="libvirt-watch",
                                            daemon=True)
            self._thread.start()

    def _on_event(self, *args) -> None:
        """In libvirt's event thread: the domain's XML is read again at the next resync,
        and the loop woken; the resync finds what changed."""
        self._stale(args[1])
        try:
            log.debug("libvirt event: %s %s", args[1].name(), args[2:-1])
        except Exception:  # noqa: BLE001 - a log line must not cost the wake-up
            pass
        if self.wake is not None:
            self.wake.set()

    def _on_metadata(self, conn, dom, mtype, nsuri, opaque) -> None:
        """In libvirt's event thread: the domain's XML is read again at the next resync;
        a change of its labels (``LABEL_NS``) wakes the loop, the daemon's own heat writes
        and other applications' metadata do not."""
        if nsuri == libvirt_disks.LABEL_NS:
            self._on_event(conn, dom, mtype, nsuri, opaque)
        else:
            self._stale(dom)

    def _stale(self, dom) -> None:
        try:
            self._memo.stale(dom.UUIDString())
        except Exception:  # noqa: BLE001 - unknown domain: read every XML
            self._memo.stale()

    # -- the worker's side: every libvirt call

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    self._cond.wait_for(lambda: self._closed or self._asked > self._done
                                        or self._write_new)
                    if self._closed:
                        return
                    asked = self._asked if self._asked > self._done else None
                    writes, self._write_new = dict(self._writes), False
                    self._busy_since = time.monotonic()
                if asked is not None:
                    self._resync(asked)
                for domain, xml in writes.items():
                    self._write(domain, xml)
                with self._cond:
                    self._busy_since = None
        finally:
            self._disconnect()
            self._close_rw()

    def _resync(self, asked: int) -> None:
        try:
            if self._conn is None or not _alive(self._conn):
                self._connect()
            listing, error = libvirt_disks.list_disks(self._conn, with_units=False,
                                                      memo=self._memo), None
        except Exception as exc:  # noqa: BLE001 - the worker must outlive any failure
            self._disconnect()
            listing, error = None, str(exc) or type(exc).__name__
        with self._cond:
            changed = listing is not None and listing != self._listing
            if listing is not None:
                self._listing = listing
                self._listed_at = (time.monotonic(), time.time())
            self._error, self._done = error, asked
            waited = self._waiting
            self._cond.notify_all()
        if changed and not waited and self.wake is not None:
            self.wake.set()        # a view the loop gave up waiting for: act on it now

    def _write(self, domain: str, xml: str) -> None:
        from vmdisktouch.adapters.libvirt import domain_heat
        try:
            libvirt = libvirt_disks.import_libvirt()
            try:
                if self._rw is None or not _alive(self._rw):
                    self._rw = libvirt_disks.connect(self.uri, readonly=False)
                dom = self._rw.lookupByName(domain)
                if dom.jobInfo()[0] != libvirt.VIR_DOMAIN_JOB_NONE:
                    return                   # kept: tried again at the next resync
                dom.setMetadata(
                    libvirt.VIR_DOMAIN_METADATA_ELEMENT, xml, domain_heat.KEY, domain_heat.NS,
                    libvirt.VIR_DOMAIN_AFFECT_LIVE)
                error = None
            except libvirt.libvirtError as exc:
                error = libvirt_disks.libvirt_message(exc)
        except Exception as exc:  # noqa: BLE001 - the worker must outlive any failure
            error = str(exc) or type(exc).__name__
        with self._cond:
            if self._writes.get(domain) is xml:
                del self._writes[domain]
            if error is not None:
                self._write_errors[domain] = error

    def _connect(self) -> None:
        self._disconnect()
        libvirt = libvirt_disks.import_libvirt()
        _ensure_event_loop(libvirt)
        conn = libvirt_disks.connect(self.uri)
        self._conn = conn
        try:
            conn.setKeepAlive(5, 3)
            for event in (libvirt.VIR_DOMAIN_EVENT_ID_LIFECYCLE,
                          libvirt.VIR_DOMAIN_EVENT_ID_DEVICE_ADDED,
                          libvirt.VIR_DOMAIN_EVENT_ID_DEVICE_REMOVED,
                          libvirt.VIR_DOMAIN_EVENT_ID_BLOCK_JOB_2,
                          libvirt.VIR_DOMAIN_EVENT_ID_DISK_CHANGE,
                          libvirt.VIR_DOMAIN_EVENT_ID_TRAY_CHANGE):
                self._callbacks.append(
                    conn.domainEventRegisterAny(None, event, self._on_event, None))
            self._callbacks.append(conn.domainEventRegisterAny(
                None, libvirt.VIR_DOMAIN_EVENT_ID_METADATA_CHANGE, self._on_metadata, None))
            self._memo.events = True
        except libvirt.libvirtError as exc:
            self._memo.events = False
            log.warning("libvirt at %s: no events (%s); changes are seen by the resync of "
                        "each cycle", self.uri, libvirt_disks.libvirt_message(exc))
        self._memo.stale()                  # what changed while it was not followed

    def _disconnect(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        for cb in self._callbacks:
            try:
                conn.domainEventDeregisterAny(cb)
            except Exception:  # noqa: BLE001 - the connection may be dead already
                pass
        self._callbacks = []
        try:
            conn.close()
        except Exception:  # noqa: BLE001
            pass

    def _close_rw(self) -> None:
        rw, self._rw = self._rw, None
        if rw is not None:
            try:
                rw.close()
            except Exception:  # noqa: BLE001
                pass


def _alive(conn) -> bool:
    try:
        return bool(conn.isAlive())
    except Exception:  # noqa: BLE001
        return False
