"""Follow the libvirt domain that owns a disk image, for ``vmdisktouch run``.

``LifecycleWatcher(path, uri, wake=event).start()`` finds the domain(s) whose
disk is ``path`` and keeps ``domain_active()`` current:

* ``True``: an owning domain has a QEMU process (running, paused, ...);
* ``False``: its owner(s) are shut off or crashed (or the owner vanished);
* ``None``: the disk is not under libvirt (no domain uses it, libvirt-python
  is not installed, or libvirtd was never reachable); the daemon then works
  as it always did.

How: libvirt's default event loop runs in one daemon thread per process, and
a lifecycle callback (STARTED, RESUMED, SUSPENDED, STOPPED, SHUTDOWN,
CRASHED, DEFINED, UNDEFINED...) only notes what happened and kicks a small
supervisor thread, which asks libvirt for the truth (``isActive``) and, when
the value changes, sets the ``wake`` event so the daemon loop reacts at once
instead of at the end of its cycle. The supervisor also re-reads the state
every ``poll_interval`` seconds (a safety net for a missed event), and, when
libvirtd goes away (close callback), keeps the last known state and
reconnects every ``retry_interval`` seconds; after a reconnect it looks the
owner up again.

``check_eligible`` / ``require_eligible`` are the start-up check: ``run``
refuses a disk that libvirt opens with O_DIRECT unless ``--force``.
"""

from __future__ import annotations

import logging
import threading
import time

from vmdisktouch.adapters import libvirt_disks
from vmdisktouch.errors import EX_CONFIG, VmdtError
from vmdisktouch.adapters.libvirt_disks import DEFAULT_URI, LibvirtError

log = logging.getLogger("vmdisktouch")


class IneligibleDiskError(VmdtError):
    """libvirt opens the disk with O_DIRECT: holding it helps nothing (override: --force)."""

    exit_code = EX_CONFIG


# ---------------------------------------------------------------------------
# start-up eligibility check


def check_eligible(path: str, uri: str = DEFAULT_URI) -> tuple[bool, str] | None:
    """(eligible, reason) as libvirt configures ``path``, or None if it is not under libvirt.

    None also when libvirt-python is missing or ``uri`` cannot be reached
    (logged), so a host without libvirt runs as before. With several domains
    using the image, it is ineligible if any of them opens it with O_DIRECT.
    """
    try:
        conn = libvirt_disks.connect(uri)
    except LibvirtError as exc:
        log.info("not checking libvirt's cache mode for %s: %s", path, exc)
        return None
    try:
        owners = libvirt_disks.find_disk_owners(conn, path)
    finally:
        conn.close()
    if not owners:
        return None
    _dom, disk = next(((d, k) for d, k in owners if not k.eligible), owners[0])
    return disk.eligible, f"domain {disk.domain}, disk {disk.target}: {disk.reason}"


def require_eligible(path: str, uri: str = DEFAULT_URI, force: bool = False) -> None:
    """Raise ``IneligibleDiskError`` for a disk libvirt opens with O_DIRECT, unless ``force``."""
    verdict = check_eligible(path, uri)
    if verdict is None or verdict[0]:
        return
    if force:
        log.warning("%s: %s (--force: holding it anyway)", path, verdict[1])
        return
    raise IneligibleDiskError(f"{path}: {verdict[1]}; pass --force to hold it anyway")


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
# the watcher


class LifecycleWatcher:
    """Tracks whether the libvirt domain owning ``path`` is active; see the module docstring."""

    def __init__(self, path: str, uri: str = DEFAULT_URI, *,
                 wake: threading.Event | None = None,
                 poll_interval: float = 30.0, retry_interval: float = 5.0):
        self.path = path
        self.uri = uri
        self.wake = wake
        self.poll_interval = poll_interval
        self.retry_interval = retry_interval
        self._libvirt = None
        self._conn = None
        self._callback_id: int | None = None
        self._owners: list = []           # virDomain objects using the image
        self._owner_uuids: set[str] = set()
        self._was_owned = False
        self._active: bool | None = None
        self._domains: list[str] = []
        self._lock = threading.Lock()
        self._kick = threading.Event()     # something happened: the supervisor should look
        self._ready = threading.Event()    # the first look-up is done (or failed)
        self._stop = threading.Event()
        self._need_resolve = True
        self._lost: int | None = None      # close reason, set by the close callback
        self._warned_unreachable = False
        self._thread: threading.Thread | None = None

    # -- public ------------------------------------------------------------

    def start(self, timeout: float = 10.0) -> "LifecycleWatcher":
        """Start watching; waits up to ``timeout`` s for the first look-up."""
        try:
            self._libvirt = libvirt_disks.import_libvirt()
        except LibvirtError as exc:
            log.info("%s; not following libvirt domain state", exc)
            return self
        _ensure_event_loop(self._libvirt)
        self._thread = threading.Thread(target=self._supervise, name="libvirt-watch",
                                        daemon=True)
        self._thread.start()
        self._ready.wait(timeout)
        return self

    def domain_active(self) -> bool | None:
        """True/False: the owning domain is active or not; None: the disk is not under libvirt."""
        with self._lock:
            return self._active

    @property
    def domains(self) -> list[str]:
        """Names of the domains that use the image (empty when not under libvirt)."""
        with self._lock:
            return list(self._domains)

    def close(self) -> None:
        self._stop.set()
        self._kick.set()
        if self._thread is not None:
            self._thread.join(timeout=10.0)
            self._thread = None
        self._disconnect()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()

    # -- supervisor thread -------------------------------------------------

    def _supervise(self) -> None:
        while not self._stop.is_set():
            try:
                if self._lost is not None:
                    log.warning("lost the connection to libvirt at %s (%s); reconnecting",
                                self.uri, _close_reason(self._libvirt, self._lost))
                    self._disconnect()
                if self._conn is None:
                    self._connect()
                if self._conn is not None:
                    self._refresh()
            except Exception as exc:  # noqa: BLE001 - the watcher must never die
                log.warning("libvirt watcher: %s", exc)
                log.debug("libvirt watcher", exc_info=True)
            self._ready.set()
            self._kick.wait(self.poll_interval if self._conn is not None
                            else self.retry_interval)
            self._kick.clear()

    def _connect(self) -> None:
        libvirt = self._libvirt
        try:
            conn = libvirt_disks.connect(self.uri)
        except LibvirtError as exc:
            if not self._warned_unreachable:
                log.info("%s; retrying every %gs", exc, self.retry_interval)
                self._warned_unreachable = True
            return
        self._lost = None
        try:
            conn.registerCloseCallback(self._on_close, None)
            self._callback_id = conn.domainEventRegisterAny(
                None, libvirt.VIR_DOMAIN_EVENT_ID_LIFECYCLE, self._on_lifecycle, None)
            conn.setKeepAlive(5, 3)
        except libvirt.libvirtError as exc:
            log.warning("cannot follow libvirt events at %s: %s", self.uri,
                        libvirt_disks.libvirt_message(exc))
            _quiet_close(conn)
            return
        if self._warned_unreachable:
            log.info("connected to libvirt at %s", self.uri)
        self._warned_unreachable = False
        self._conn = conn
        self._need_resolve = True

    def _disconnect(self) -> None:
        conn, self._conn = self._conn, None
        self._lost = None
        if conn is None:
            return
        if self._callback_id is not None:
            try:
                conn.domainEventDeregisterAny(self._callback_id)
            except Exception:  # noqa: BLE001 - the connection may already be dead
                pass
            self._callback_id = None
        try:
            conn.unregisterCloseCallback()
        except Exception:  # noqa: BLE001
            pass
        _quiet_close(conn)

    def _refresh(self) -> None:
        libvirt = self._libvirt
        conn = self._conn
        try:
            if self._need_resolve:
                self._need_resolve = False
                owners = libvirt_disks.find_disk_owners(conn, self.path)
                self._owners = [dom for dom, _disk in owners]
                self._owner_uuids = {dom.UUIDString() for dom in self._owners}
                names = sorted({disk.domain for _dom, disk in owners})
            else:
                names = self.domains
            active_any = False
            for dom in self._owners:
                try:
                    active_any = active_any or bool(dom.isActive())
                except libvirt.libvirtError as exc:
                    if exc.get_error_code() != libvirt.VIR_ERR_NO_DOMAIN:
                        raise
                    self._need_resolve = True   # undefined under us: look again next time
                    self._kick.set()
        except (libvirt.libvirtError, LibvirtError) as exc:
            if not _alive(conn):
                self._lost = libvirt.VIR_CONNECT_CLOSE_REASON_ERROR
                self._kick.set()
                return
            raise LibvirtError(libvirt_disks.libvirt_message(exc)) from None
        if self._owners:
            self._was_owned = True
            active: bool | None = active_any
        else:
            # once seen under libvirt, a vanished owner means "not running", not "not libvirt"
            active = False if self._was_owned else None
        with self._lock:
            changed = active != self._active or names != self._domains
            old = self._active
            self._active, self._domains = active, names
        if changed:
            who = ", ".join(names) or "no domain"
            log.info("libvirt: %s uses %s: %s", who, self.path,
                     {True: "active", False: "inactive", None: "not under libvirt"}[active])
            if active != old and self.wake is not None:
                self.wake.set()

    # -- callbacks (run in the libvirt event-loop thread: note and kick only) --

    def _on_lifecycle(self, conn, dom, event, detail, _opaque) -> None:
        libvirt = self._libvirt
        try:
            uuid = dom.UUIDString()
        except Exception:  # noqa: BLE001
            uuid = ""
        if uuid in self._owner_uuids:
            if event == libvirt.VIR_DOMAIN_EVENT_UNDEFINED:
                self._need_resolve = True
        elif event in (libvirt.VIR_DOMAIN_EVENT_DEFINED, libvirt.VIR_DOMAIN_EVENT_STARTED):
            self._need_resolve = True    # a new or changed domain may now use the image
        else:
            return
        log.debug("libvirt event %s/%s on %s", event, detail, uuid)
        self._kick.set()

    def _on_close(self, conn, reason, _opaque) -> None:
        self._lost = reason
        self._kick.set()


def _alive(conn) -> bool:
    try:
        return bool(conn.isAlive())
    except Exception:  # noqa: BLE001
        return False


def _quiet_close(conn) -> None:
    try:
        conn.close()
    except Exception:  # noqa: BLE001
        pass


def _close_reason(libvirt, reason: int) -> str:
    names = {libvirt.VIR_CONNECT_CLOSE_REASON_ERROR: "error",
             libvirt.VIR_CONNECT_CLOSE_REASON_EOF: "libvirtd closed the connection",
             libvirt.VIR_CONNECT_CLOSE_REASON_KEEPALIVE: "keepalive timeout",
             libvirt.VIR_CONNECT_CLOSE_REASON_CLIENT: "closed"}
    return names.get(reason, f"reason {reason}")


def start_watcher(path: str, uri: str = DEFAULT_URI,
                  wake: threading.Event | None = None) -> LifecycleWatcher:
    """A started ``LifecycleWatcher`` for ``path``; close() it when done."""
    return LifecycleWatcher(path, uri, wake=wake).start()
