"""Follow libvirt: the eligible disks of every running domain, kept up to date.

Theory of operation
-------------------
``run --libvirt`` serves whatever disks the host's running domains use. The
truth is libvirt's: each cycle the follower lists every domain and its live
disks (``libvirt_disks.list_disks``), the *resync*, so a domain started,
stopped, destroyed or migrated away, or a disk plugged or unplugged, is
seen at the next cycle whatever happened to the events. The events
(lifecycle, device added, device removed) only wake the daemon's loop at
once (``wake.set()``), so that a change is acted on within one cycle, not
at the end of the current interval; a missed event costs at most one cycle.

A disk is served when its domain is active (running or paused: QEMU has
the image open) and ``wanted`` finds it eligible: a local file or block
device that QEMU reads through the host page cache (``libvirt_disks.assess``:
not cache=none/directsync, not io=native, not a LUN, not an empty drive),
and not read-only (CD-ROMs, install ISOs: a host budget is for the disks
guests work on). Every other disk is listed with its reason.

When libvirt cannot be reached the follower says so once and reports
``None``: the daemon keeps serving what it serves, and retries each cycle.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from vmdisktouch.adapters import libvirt_disks
from vmdisktouch.adapters.libvirt_disks import DEFAULT_URI, Disk, LibvirtError

log = logging.getLogger("vmdisktouch")


@dataclass(frozen=True)
class Wanted:
    """The disks to serve (by path) and those left out, with their reasons."""
    serve: dict[str, Disk]                 # image path -> its disk
    skipped: dict[tuple[str, str], str]    # (domain, target) -> why not


def wanted(disks: list[Disk]) -> Wanted:
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


class LibvirtFollower:
    """The running domains' disks, resynced each cycle; libvirt's events wake the loop."""

    def __init__(self, uri: str = DEFAULT_URI, wake=None):
        self.uri = uri
        self.wake = wake
        self._libvirt = None
        self._conn = None
        self._callbacks: list[int] = []
        self._unreachable: str | None = None

    def disks(self) -> Wanted | None:
        """The disks to serve now (a resync), or None when libvirt cannot be asked."""
        try:
            if self._conn is None or not _alive(self._conn):
                self._connect()
            listed = libvirt_disks.list_disks(self._conn, with_units=False)
        except LibvirtError as exc:
            self._disconnect()
            if str(exc) != self._unreachable:
                log.warning("libvirt at %s: %s; serving what is served, retrying each cycle",
                            self.uri, exc)
                self._unreachable = str(exc)
            return None
        if self._unreachable:
            log.info("libvirt at %s answers again", self.uri)
            self._unreachable = None
        return wanted(listed)

    def _connect(self) -> None:
        self._disconnect()
        libvirt = self._libvirt = libvirt_disks.import_libvirt()
        from vmdisktouch.adapters.lifecycle import _ensure_event_loop
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


def _alive(conn) -> bool:
    try:
        return bool(conn.isAlive())
    except Exception:  # noqa: BLE001
        return False
