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

libvirt's default event loop runs in one daemon thread per process (it
must be registered before the connection is opened); a keepalive of 5 s
x 3 notices a dead libvirtd. When libvirt cannot be asked, ``disks``
returns None (said once: at INFO when it never answered, a host without
libvirt; at WARNING when it stopped answering), the caller keeps what it
knows, and the next call reconnects.

The pure rules over the listing live here too: which disks a host service
serves (``wanted``), which domains own an image path (``owners``) and
whether libvirt opens it with O_DIRECT (``require_eligible``).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from vmdisktouch.adapters import libvirt_disks
from vmdisktouch.adapters.libvirt_disks import DEFAULT_URI, Disk, LibvirtError
from vmdisktouch.errors import EX_CONFIG, VmdtError

log = logging.getLogger("vmdisktouch")


class IneligibleDiskError(VmdtError):
    """libvirt opens the disk with O_DIRECT: holding it helps nothing (override: --force)."""

    exit_code = EX_CONFIG


@dataclass(frozen=True)
class Wanted:
    """The disks to serve (by path) and those left out, with their reasons."""
    serve: dict[str, Disk]                 # image path -> its disk
    skipped: dict[tuple[str, str], str]    # (domain, target) -> why not


def wanted(disks: list[Disk]) -> Wanted:
    """The running domains' disks a host budget is for: eligible (buffered, local) and
    writable; CD-ROMs and read-only disks are listed with their reason."""
    serve: dict[str, Disk] = {}
    skipped: dict[tuple[str, str], str] = {}
    for d in disks:
        if not d.active:
            continue
        if not d.eligible:
            why = d.reason
        elif d.readonly or d.device in ("cdrom", "floppy"):
            why = f"read-only {d.device}: a host budget is for the disks guests work on"
        else:
            serve.setdefault(d.source, d)
            continue
        skipped[(d.domain, d.target)] = why
    return Wanted(serve, skipped)


def owners(disks: list[Disk], path: str) -> list[Disk]:
    """The disks whose source is the image ``path`` (realpath, inode or device number:
    a symlink or a /dev/disk/by-* alias matches), running domains first."""
    found = [d for d in disks if d.source and d.type in ("file", "block")
             and libvirt_disks.same_file(d.source, path)]
    found.sort(key=lambda d: (not d.active, d.domain))
    return found


def require_eligible(found: list[Disk], path: str, force: bool = False) -> None:
    """Raise ``IneligibleDiskError`` when a domain of ``found`` (``owners``) opens ``path``
    with O_DIRECT, unless ``force`` (then a warning)."""
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


class LibvirtWatch:
    """Every domain's disks, resynced on demand; libvirt's events wake the loop."""

    def __init__(self, uri: str = DEFAULT_URI, wake=None):
        self.uri = uri
        self.wake = wake
        self._conn = None
        self._rw = None                     # read-write: only to write metadata
        self._callbacks: list[int] = []
        self._unreachable: str | None = None
        self._answered = False              # libvirt answered once: losing it is a warning

    def disks(self) -> list[Disk] | None:
        """Every disk of every domain now (a resync), or None when libvirt cannot be asked."""
        try:
            if self._conn is None or not _alive(self._conn):
                self._connect()
            listed = libvirt_disks.list_disks(self._conn, with_units=False)
        except LibvirtError as exc:
            self._disconnect()
            if str(exc) != self._unreachable:
                level = logging.WARNING if self._answered else logging.INFO
                log.log(level, "libvirt at %s: %s; keeping what is known, asking again "
                        "each cycle", self.uri, exc)
                self._unreachable = str(exc)
            return None
        if self._unreachable and self._answered:
            log.info("libvirt at %s answers again", self.uri)
        self._unreachable = None
        self._answered = True
        return listed

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
                          libvirt.VIR_DOMAIN_EVENT_ID_DEVICE_REMOVED):
                self._callbacks.append(
                    conn.domainEventRegisterAny(None, event, self._on_event, None))
        except libvirt.libvirtError as exc:
            log.warning("libvirt at %s: no events (%s); changes are seen by the resync of "
                        "each cycle", self.uri, libvirt_disks.libvirt_message(exc))

    def set_metadata(self, domain: str, xml: str) -> bool:
        """Replace the heat summary in ``domain``'s live definition (``domain_heat``);
        False, writing nothing, while a job runs on it (a migration, a save): the write
        would wait for that job's end, up to libvirt's 30 s, and the loop with it.
        ``LibvirtError`` in one line when it cannot."""
        from vmdisktouch.adapters import domain_heat
        libvirt = libvirt_disks.import_libvirt()
        try:
            if self._rw is None or not _alive(self._rw):
                self._rw = libvirt_disks.connect(self.uri, readonly=False)
            dom = self._rw.lookupByName(domain)
            if dom.jobInfo()[0] != libvirt.VIR_DOMAIN_JOB_NONE:
                return False
            dom.setMetadata(
                libvirt.VIR_DOMAIN_METADATA_ELEMENT, xml, domain_heat.KEY, domain_heat.NS,
                libvirt.VIR_DOMAIN_AFFECT_LIVE)
        except libvirt.libvirtError as exc:
            raise LibvirtError(libvirt_disks.libvirt_message(exc)) from None
        return True

    def _on_event(self, *_args) -> None:
        """In libvirt's event thread: wake the loop; the resync finds what changed."""
        if self.wake is not None:
            self.wake.set()

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

    def close(self) -> None:
        self._disconnect()
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
