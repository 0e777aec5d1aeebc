"""The host service's own adoptions (``[adopt]``): the ``cache=none`` disks it switches to
the page cache by itself.

Theory of operation
-------------------
Each sync, the disks of running domains left out for O_DIRECT alone (``Want.adoptable``:
a local file or device, not ``io='native'``) that the config file's ``[adopt]`` names
(``Rules.adopts``) are candidates, and so are those their domain carries as adopted
(``adopted.mark``: adopted on the host it ran on before a migration or a save; in the
``[scope]``, whatever ``[adopt]`` says), once it runs here. One worker thread adopts them, one at a time, as
``vmdisktouch adopt`` does (``adapters.libvirt.adopt``, with every check it makes),
because a libvirt or QEMU call can hang and the loop must not. The listing after it
finds the disk adopted, and the service serves it within the one budget; when the
service stops, it releases what it adopted with the rest (``Service.close``).

Before a candidate is adopted its guest's I/O is timed for ``BASELINE_WINDOWS`` ticks
of ``WINDOW_S`` (QEMU's accounting, ``core.never_slower``), candidates together. Every
disk the service serves adopted (by it or by ``vmdisktouch adopt``, a libvirt domain's
or a drive adopted through a QEMU's QMP socket) is then timed each tick and judged
against the baseline its record keeps, in every mode (``run --libvirt`` or ``run
PATH``): one that got slower is released by itself, with the reason in the journal and
in ``status``, and held back from ``[adopt]`` until the operator adopts it again
(``adopted.hold_back``; a QMP drive's record goes, and nothing adopts one but the
operator). What differs between the two kinds is a small backend (``LibvirtDisks``,
``QmpDrives``: its counters, its record, its release), chosen by the disk's key
(``backend``); the judge, its ticks and the release when the service stops
(``release_when_stopping``) are the same.

A candidate is tried once while it stays one. "Not now" (the domain paused, a job, a
migration: exit 75 of adopt) is tried again ``RETRY_S`` later. A refusal (``io``,
advise's no gain, a page that stays cached, one released for good in this run of its
domain) is said once and not tried again until the disk stops being a candidate
(its domain stopped) or the config is reloaded (``forget_refusals``).
"""

from __future__ import annotations

import logging
import queue
import threading
import time

from vmdisktouch.adapters.advice_file import advice_path
from vmdisktouch.core import never_slower
from vmdisktouch.core.never_slower import Judge
from vmdisktouch.errors import VmdtError

log = logging.getLogger("vmdisktouch")

RETRY_S = 30.0          # a disk whose domain's state said "not now" is tried again after this
CLOSE_WAIT_S = 10.0     # the most ``close`` waits for an adoption under way
STOP_WAIT_S = 10.0      # the most a stopping service waits for libvirt or QEMU to release


class LibvirtDisks:
    """Adopted disks of libvirt's domains, by ``DOMAIN/TARGET`` (``adapters.libvirt.adopt``):
    one connection, made when first needed (``reset`` after a failure)."""

    def __init__(self, uri: str):
        self.uri, self._conn = uri, None

    def conn(self):
        if self._conn is None:
            from vmdisktouch.adapters.libvirt import libvirt_disks
            self._conn = libvirt_disks.connect(self.uri, readonly=False)
        return self._conn

    def reset(self) -> None:
        self._conn = None

    def counters(self, key: str):
        from vmdisktouch.adapters.libvirt import adopt
        domain, target = adopt.parse_key(key)
        return adopt.counters(adopt.lookup(self.conn(), domain), target)

    def record(self, key: str) -> dict:
        from vmdisktouch.adapters.libvirt import adopt, adopted
        domain, target = adopt.parse_key(key)
        uuid = adopt.lookup(self.conn(), domain).UUIDString()
        return adopted.by_disk().get((uuid, target)) or {}

    def release(self, key: str, why: str | None = None) -> tuple[str, bool]:
        from vmdisktouch.adapters.libvirt import adopt
        node, switched = adopt.release(self.conn(), key, why=why)
        return node.path, switched

    def again(self, key: str) -> str:
        return f"vmdisktouch adopt {key}"


class QmpDrives:
    """Drives adopted through a QEMU's QMP socket, by ``SOCKET DRIVE``
    (``adapters.qemu_socket``): a connection per call."""

    def reset(self) -> None:
        pass

    def counters(self, key: str):
        from vmdisktouch.adapters import qemu_socket
        return qemu_socket.counters(*qemu_socket.parse_key(key))

    def record(self, key: str) -> dict:
        from vmdisktouch.adapters import qemu_socket
        return qemu_socket.record_of(*qemu_socket.parse_key(key))

    def release(self, key: str, why: str | None = None) -> tuple[str, bool]:
        from vmdisktouch.adapters import qemu_socket
        return qemu_socket.release_drive(*qemu_socket.parse_key(key))

    def again(self, key: str) -> str:
        return "vmdisktouch adopt --qmp " + key


def is_qmp(key: str) -> bool:
    """A drive adopted through a QMP socket (``SOCKET DRIVE``, the socket's real path),
    not a libvirt disk (``DOMAIN/TARGET``: libvirt refuses a "/" in a domain's name)."""
    return key.startswith("/")


def backend(backends: tuple, key: str):
    """``(libvirt, qmp)``'s backend of ``key``."""
    return backends[1] if is_qmp(key) else backends[0]


def release_when_stopping(uri: str, keys: list[str], wait: float = STOP_WAIT_S) -> list[str]:
    """Release ``keys`` as the service stops, its holds gone (no disk stays adopted that
    nobody serves): one line each, what was done or why not. In a thread waited for at
    most ``wait`` s, since a libvirt or QEMU call can hang and a stop must not: what is
    left is said, and ``release --all`` finishes it."""
    lines: list[str] = []

    def work() -> None:
        backends = (LibvirtDisks(uri), QmpDrives())
        for key in keys:
            try:
                path, switched = backend(backends, key).release(key)
            except VmdtError as exc:
                lines.append(f"{key}: not released: {exc} (vmdisktouch release --all)")
                continue
            lines.append(f"{key}: released: {path} with O_DIRECT again (the service "
                         f"stopped)" if switched else f"{key}: not adopted any more")

    t = threading.Thread(target=work, name="vmdisktouch-release", daemon=True)
    t.start()
    t.join(wait)
    if t.is_alive():
        lines = [*lines, f"libvirt or QEMU did not answer within {wait:g} s: "
                         f"vmdisktouch release --all releases what is left"]
    return list(lines)


class Adopter:
    """The worker that adopts the candidates ``want`` names, and judges the adopted disks
    ``watch`` names (the module docstring)."""

    def __init__(self, uri: str, advice: str | None = None, clock=time.monotonic,
                 window: float = never_slower.WINDOW_S):
        self.uri, self.clock, self.window = uri, clock, window
        self.advice_path = advice or advice_path()
        self.libvirt = LibvirtDisks(uri)
        self.backends = (self.libvirt, QmpDrives())
        self._lock = threading.Lock()
        self._tried: dict[str, tuple[str, float]] = {}   # key -> (pending|later|refused|done, when)
        self._queue: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._watched: set[str] = set()
        self._carried: set[str] = set()
        self._figures: dict[str, tuple[float | None, float | None]] = {}
        self.adopted: set[str] = set()                 # DOMAIN/TARGET it adopted
        self.released: dict[str, str] = {}             # DOMAIN/TARGET it released -> why
        # the worker's own: the baselines being timed, and the judges of the adopted
        self._timing: dict[str, list] = {}
        self._judges: dict[str, tuple[Judge | None, object]] = {}

    def want(self, keys: list[str], carried=frozenset()) -> None:
        """The candidates now (``DOMAIN/TARGET``): each new one, or one whose "not now" is
        ``RETRY_S`` old, is queued; one no longer a candidate is forgotten. ``carried``:
        those their domain carries as adopted (adopted where it ran before)."""
        now = self.clock()
        with self._lock:
            self._carried = set(carried)
            for key in set(self._tried) - set(keys):
                if self._tried[key][0] != "pending":
                    del self._tried[key]
            queued = []
            for key in keys:
                state = self._tried.get(key)
                if state is None or (state[0] == "later" and now - state[1] >= RETRY_S):
                    self._tried[key] = ("pending", now)
                    queued.append(key)
        for key in queued:
            self._queue.put(key)
        if queued:
            self._start()

    def watch(self, keys) -> None:
        """The disks the service serves adopted now (``DOMAIN/TARGET``, or ``SOCKET DRIVE``
        for a drive adopted through a QMP socket): each is judged."""
        with self._lock:
            self._watched = set(keys)
            for key in set(self._figures) - self._watched:
                del self._figures[key]
        if keys:
            self._start()

    def figures(self, key: str) -> tuple[float | None, float | None]:
        """``(gain measured since the switch, gain advise forecast)`` of an adopted disk."""
        with self._lock:
            return self._figures.get(key, (None, None))

    def forget_refusals(self) -> None:
        """A reload: the refused are tried again."""
        with self._lock:
            for key in [k for k, (s, _) in self._tried.items() if s == "refused"]:
                del self._tried[key]

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="vmdisktouch-adopt",
                                            daemon=True)
            self._thread.start()

    def _work(self) -> None:
        said = None
        tick = self.clock() + self.window
        while True:
            try:
                key = self._queue.get(timeout=max(0.0, tick - self.clock()))
            except queue.Empty:
                key = ""
            if key is None:
                return
            try:
                if key:
                    self._candidate(key)
                if self.clock() >= tick:
                    tick = self.clock() + self.window
                    self._tick()
                said = None
            except Exception as exc:  # noqa: BLE001 - the worker must outlive any failure
                self.libvirt.reset()                   # libvirt unreachable, or a bug
                if key:
                    self._done(key, "later")
                why = str(exc) if isinstance(exc, VmdtError) else f"{type(exc).__name__}: {exc}"
                if why != said:                        # said once while it lasts
                    log.warning("[adopt]: %s (tried again in %.0f s)", why, RETRY_S)
                said = why

    def _done(self, key: str, state: str) -> None:
        self._timing.pop(key, None)
        with self._lock:
            self._tried[key] = (state, self.clock())

    def _refusal(self, key: str, call) -> bool:
        """Run ``call``; False, said and recorded, when it refuses."""
        from vmdisktouch.adapters.libvirt import adopt
        try:
            call()
            return True
        except adopt.NotNow as exc:
            self._done(key, "later")
            log.info("[adopt]: %s (tried again in %.0f s)", exc, RETRY_S)
        except adopt.Refused as exc:
            self._done(key, "refused")
            log.warning("[adopt]: not adopted: %s", exc)
        except VmdtError as exc:                      # a QMP command failed
            self._done(key, "later")
            log.warning("[adopt]: %s (tried again in %.0f s)", exc, RETRY_S)
        return False

    def _candidate(self, key: str) -> None:
        """A new candidate: checked, then timed from the next tick."""
        from vmdisktouch.adapters.libvirt import adopt
        if self._refusal(key, lambda: adopt.check(self.libvirt.conn(), key,
                                                  advice_path=self.advice_path,
                                                  by_config=True)):
            self._timing[key] = []

    def _tick(self) -> None:
        with self._lock:
            pending = {k for k, (state, _) in self._tried.items() if state == "pending"}
        for key in set(self._timing) - pending:          # no longer a candidate
            del self._timing[key]
        for key in list(self._timing):
            def read(key=key):
                self._timing[key].append(self.libvirt.counters(key))
            if not self._refusal(key, read):
                continue
            readings = self._timing[key]
            if len(readings) > never_slower.BASELINE_WINDOWS:
                baseline = [b.since(a) for a, b in zip(readings, readings[1:])]
                self._refusal(key, lambda key=key, baseline=baseline: self._adopt(
                    key, baseline))
        with self._lock:
            watched = sorted(self._watched)
        for key in set(self._judges) - set(watched):
            del self._judges[key]
        for key in watched:
            try:
                self._judge(key)
            except VmdtError as exc:
                backend(self.backends, key).reset()
                log.warning("%s: its I/O could not be timed: %s", key, exc)

    def _adopt(self, key: str, baseline: list) -> None:
        from vmdisktouch.adapters.libvirt import adopt
        node, _ = adopt.adopt(self.libvirt.conn(), key, advice_path=self.advice_path,
                              by_config=True, baseline=baseline)
        self._done(key, "done")
        self.adopted.add(key)
        with self._lock:
            how = ("adopted again, as where its domain ran before (the mark it carries)"
                   if key in self._carried else "adopted by [adopt]")
        log.info("%s: %s: %s through the host page cache (QEMU node %s, libvirt still says "
                 "cache=%s)", key, how, node.path, node.name, node.cache)

    def _judge(self, key: str) -> None:
        """One tick of an adopted disk: its window judged; released when it got slower."""
        from vmdisktouch.adapters.libvirt import adopted
        disks = backend(self.backends, key)
        now = disks.counters(key)
        if key not in self._judges:
            rec = disks.record(key)
            baseline = adopted.baseline_of(rec)
            judge = Judge(baseline) if baseline else None
            self._judges[key] = (judge, now)
            with self._lock:
                self._figures[key] = (None, rec.get("advised_gain"))
            return
        judge, before = self._judges[key]
        self._judges[key] = (judge, now)
        if judge is None:
            return
        verdict = judge.add(now.since(before))
        with self._lock:
            self._figures[key] = (judge.gain, self._figures.get(key, (None, None))[1])
        if verdict is None or not verdict.release:
            return
        disks.release(key, why=f"by vmdisktouch, slower: {verdict.reason}")
        del self._judges[key]
        with self._lock:
            self.released[key] = verdict.reason
            self._watched.discard(key)
        self.adopted.discard(key)
        log.warning("%s: released by itself: %s: with O_DIRECT again, and not adopted "
                    "again until %s", key, verdict.reason, disks.again(key))

    def close(self) -> None:
        """Stop the worker (an adoption under way finishes first, ``CLOSE_WAIT_S`` at most)."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(CLOSE_WAIT_S)
