"""Opens of an image by any process, as a wake-up: inotify(7) ``IN_OPEN``.

A domain that takes an image arrives with QEMU opening it: QEMU must open the image
before it can activate it and drop its page cache (a restore's or an incoming
migration's end, ``daemon.arrival``). libvirt sends no event before a restore
completes, and a small guest's restore lasts a few tenths of a second, so a daemon
that holds an image no domain uses would see that domain only at its next cycle,
after the drop. ``OpenWatch`` wakes the loop at every open of a watched image
(``wake.set()``) from a thread of its own; the cycle that follows asks libvirt who
took it. An open tells nothing else: no pid, no flags; the resync decides.

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

from vmdisktouch.errors import VmdtError
from vmdisktouch.system import libc

log = logging.getLogger("vmdisktouch")

_EVENT = struct.Struct("iIII")       # wd, mask, cookie, len (then len bytes of name)


class OpenWatch:
    """Wakes ``wake`` (``.set()``) at every open of a watched path (``add``)."""

    def __init__(self, wake):
        self.wake = wake
        self._fd = libc.inotify_init1()
        self._stop_r, self._stop_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._paths: dict[int, str] = {}
        self._thread: threading.Thread | None = None

    def add(self, path: str) -> bool:
        """Watch ``path``'s opens; False (said at DEBUG) when it cannot be watched."""
        try:
            wd = libc.inotify_add_watch(self._fd, path, libc.IN_OPEN)
        except VmdtError as exc:
            log.debug("%s: opens not watched (%s)", path, exc)
            return False
        self._paths[wd] = path
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="image-opens", daemon=True)
            self._thread.start()
        return True

    def _run(self) -> None:
        while True:
            try:
                ready, _, _ = select.select([self._fd, self._stop_r], [], [])
            except (OSError, ValueError):
                return
            if self._stop_r in ready:
                return
            opened = self._read()
            if opened:
                log.debug("opened: %s", ", ".join(sorted(opened)))
                self.wake.set()

    def _read(self) -> set[str]:
        """The paths of the events buffered now (all of them read)."""
        opened: set[str] = set()
        while True:
            try:
                data = os.read(self._fd, 64 * 1024)
            except BlockingIOError:
                return opened
            except OSError:
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
