"""Opens of an image by any process, as a wake-up: inotify(7) ``IN_OPEN``.

A domain that takes an image arrives with QEMU opening it: QEMU must open the image
before it can activate it and drop its page cache (a restore's or an incoming
migration's end, ``daemon.arrival``). libvirt sends no event before a restore
completes, and a small guest's restore lasts a few tenths of a second, so a daemon
that holds an image no domain uses would see that domain only at its next cycle,
after the drop. ``OpenWatch`` wakes the loop at every open of a watched image
(``wake.set()``) from a thread of its own; the cycle that follows asks libvirt who
took it. An open tells nothing else: no pid, no flags; the resync decides.

Only the opens of an image that is ``armed`` wake (the caller arms those a new
domain could take unseen: held, no domain using them), and at most one wake every
``GAP`` seconds: an open within it wakes at its end, so a process that opens the
image in a loop costs at most ten cycles a second, and an arrival is seen at most
``GAP`` later. What woke the loop is told apart from libvirt's events (``take``):
the loop asks libvirt at once, and runs a cycle only when the answer changes what is
held (``service._wait_for_next_cycle``), so a reader that opens the image often adds
listings, not cycles.

inotify sees the opens made on this host through the watched inode (a symbolic link
is followed when the watch is added; a block device through any of its aliases that
resolve to the same device node), on any file system, network ones included. The
daemon's own opens wake it too: it opens an image only when it starts serving it,
before the watch is added.
"""

from __future__ import annotations

import logging
import os
import select
import struct
import threading
import time

from vmdisktouch.errors import VmdtError
from vmdisktouch.system import libc

log = logging.getLogger("vmdisktouch")

_EVENT = struct.Struct("iIII")       # wd, mask, cookie, len (then len bytes of name)
GAP = 0.1                            # seconds: the least time between two wakes


class OpenWatch:
    """Wakes ``wake`` (``.set()``) at every open of a watched path (``add``)."""

    def __init__(self, wake, clock=time.monotonic):
        self.wake, self.clock = wake, clock
        self._fd = libc.inotify_init1()
        self._stop_r, self._stop_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._paths: dict[int, str] = {}
        self._armed: set[str] = set()    # the paths whose opens wake (``arm``)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._woke = False               # a wake was for an open, not taken yet (``take``)

    def add(self, path: str, fd: int | None = None) -> bool:
        """Watch ``path``'s opens; False (said at DEBUG) when it cannot be watched. With
        ``fd``, a descriptor of the image the daemon verified, the watch is on that file
        (``/proc/self/fd/N``), never on what the path names by now."""
        try:
            wd = libc.inotify_add_watch(self._fd, path if fd is None else
                                        f"/proc/self/fd/{fd}", libc.IN_OPEN)
        except VmdtError as exc:
            log.debug("%s: opens not watched (%s)", path, exc)
            return False
        with self._lock:
            self._paths[wd] = path
            self._armed.add(path)
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="image-opens", daemon=True)
            self._thread.start()
        return True

    def take(self) -> bool:
        """Whether an open woke the loop since the last ``take`` (and forget it)."""
        with self._lock:
            woke, self._woke = self._woke, False
        return woke

    def arm(self, path: str, on: bool) -> None:
        """Whether the opens of ``path`` (as given to ``add``) wake the loop."""
        with self._lock:
            (self._armed.add if on else self._armed.discard)(path)

    def _run(self) -> None:
        last, pending = float("-inf"), False
        while True:
            wait = max(0.0, last + GAP - self.clock()) if pending else None
            try:
                ready, _, _ = select.select([self._fd, self._stop_r], [], [], wait)
            except (OSError, ValueError):
                return
            if self._stop_r in ready:
                return
            if self._fd in ready:
                opened = self._read()
                with self._lock:
                    opened &= self._armed
                if opened:
                    log.debug("opened: %s", ", ".join(sorted(opened)))
                    pending = True
            if pending and self.clock() - last >= GAP:
                with self._lock:
                    self._woke = True
                self.wake.set()
                last, pending = self.clock(), False

    def _read(self) -> set[str]:
        """The paths of the events buffered now (all of them read)."""
        opened: set[str] = set()
        while True:
            try:
                data = os.read(self._fd, 64 * 1024)
            except OSError:                  # BlockingIOError: all read
                return opened
            i = 0
            while i + _EVENT.size <= len(data):
                wd, mask, _, n = _EVENT.unpack_from(data, i)
                i += _EVENT.size + n
                if mask & libc.IN_OPEN:
                    opened.add(self._paths.get(wd, "?"))

    def close(self) -> None:
        try:
            os.write(self._stop_w, b"x")
        except OSError:
            pass
        if self._thread is not None:
            self._thread.join(1.0)
        for fd in (self._fd, self._stop_r, self._stop_w):
            try:
                os.close(fd)
            except OSError:
                pass
