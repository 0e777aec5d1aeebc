"""The host service's own adoptions (``[adopt]``): the ``cache=none`` disks it switches to
the page cache by itself.

Theory of operation
-------------------
Each sync, the disks of running domains left out for O_DIRECT alone (``Want.adoptable``:
a local file or device, not ``io='native'``) that the config file's ``[adopt]`` names
(``Rules.adopts``) are candidates. One worker thread adopts them, one at a time, as
``vmdisktouch adopt`` does (``adapters.libvirt.adopt``, with every check it makes),
because a libvirt or QEMU call can hang and the loop must not. The listing after it
finds the disk adopted, and the service serves it within the one budget; when the
service stops, it releases what it adopted with the rest (``Service.close``).

A candidate is tried once while it stays one. "Not now" (the domain paused, a job, a
migration: exit 75 of adopt) is tried again ``RETRY_S`` later. A refusal (``io``,
advise's no gain, a page that stays cached, one the operator released in this run of
its domain) is said once and not tried again until the disk stops being a candidate
(its domain stopped) or the config is reloaded (``forget_refusals``).
"""

from __future__ import annotations

import logging
import queue
import threading
import time

from vmdisktouch.adapters.advice_file import ADVICE_FILE
from vmdisktouch.errors import VmdtError

log = logging.getLogger("vmdisktouch")

RETRY_S = 30.0          # a disk whose domain's state said "not now" is tried again after this
CLOSE_WAIT_S = 10.0     # the most ``close`` waits for an adoption under way


class Adopter:
    """The worker that adopts the candidates ``want`` names (the module docstring)."""

    def __init__(self, uri: str, advice_path: str = ADVICE_FILE, clock=time.monotonic):
        self.uri, self.advice_path, self.clock = uri, advice_path, clock
        self._lock = threading.Lock()
        self._tried: dict[str, tuple[str, float]] = {}   # key -> (pending|later|refused|done, when)
        self._queue: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self.adopted: set[str] = set()                 # DOMAIN/TARGET it adopted

    def want(self, keys: list[str]) -> None:
        """The candidates now (``DOMAIN/TARGET``): each new one, or one whose "not now" is
        ``RETRY_S`` old, is queued; one no longer a candidate is forgotten."""
        now = self.clock()
        with self._lock:
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
        if queued and self._thread is None:
            self._thread = threading.Thread(target=self._work, name="vmdisktouch-adopt",
                                            daemon=True)
            self._thread.start()

    def forget_refusals(self) -> None:
        """A reload: the refused are tried again."""
        with self._lock:
            for key in [k for k, (s, _) in self._tried.items() if s == "refused"]:
                del self._tried[key]

    def _work(self) -> None:
        from vmdisktouch.adapters.libvirt import adopt, libvirt_disks
        conn = None
        while True:
            key = self._queue.get()
            if key is None:
                return
            try:
                if conn is None:
                    conn = libvirt_disks.connect(self.uri, readonly=False)
                node = adopt.adopt(conn, key, advice_path=self.advice_path, by_config=True)
                state = "done"
                self.adopted.add(key)
                log.info("%s: adopted by [adopt]: %s through the host page cache (QEMU node "
                         "%s, libvirt still says cache=%s)", key, node.path, node.name,
                         node.cache)
            except adopt.NotNow as exc:
                state = "later"
                log.info("[adopt]: %s (tried again in %.0f s)", exc, RETRY_S)
            except adopt.Refused as exc:
                state = "refused"
                log.warning("[adopt]: not adopted: %s", exc)
            except VmdtError as exc:           # libvirt unreachable, a QMP command failed
                state, conn = "later", None
                log.warning("[adopt]: %s (tried again in %.0f s)", exc, RETRY_S)
            with self._lock:
                self._tried[key] = (state, self.clock())

    def close(self) -> None:
        """Stop the worker (an adoption under way finishes first, ``CLOSE_WAIT_S`` at most)."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(CLOSE_WAIT_S)
