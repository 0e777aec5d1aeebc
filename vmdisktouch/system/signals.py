"""What the daemon's signals ask of its loop, with no lock taken in a handler.

Theory of operation
-------------------
A Python signal handler runs in the main thread between two bytecodes,
wherever that thread is: inside ``threading.Event.wait()``, inside a
logging handler, inside the holder's paced load. A handler that takes a
lock the interrupted code holds deadlocks the daemon: ``Event.set()`` from
a SIGTERM handler while the main thread sat in ``Event.wait()`` on the same
Event's (non-reentrant) lock left a daemon spinning with its memory locked,
deaf to SIGTERM and SIGINT until SIGKILL.

So the handlers here only store a value in an attribute (a plain store,
no lock, nothing that can recurse), and the loop is woken through a
self-pipe: ``signal.set_wakeup_fd`` makes the C-level handler write the
signal number to the pipe's non-blocking write end, from whatever thread
the kernel delivered the signal to, and the loop's ``wait`` sleeps in
``select`` on the read end. Other threads (the libvirt watcher) wake it the
same way with ``set()``. ``warn_on_full_buffer=False``: a flood of signals
that fills the pipe loses only wake-up bytes, never a request (the flags are
set either way), and prints nothing.

Requests are coalesced: any number of SIGHUPs before the loop looks is one
reload (``take_reload``); the first SIGTERM or SIGINT is the stop, and the
later ones change nothing.

``vmdisktouch advise`` takes the same handlers with SIGHUP a stop too (a
closed terminal ends its watch as Ctrl-C does) and no reload, and
``keep_ignored``: a signal ignored when it starts stays ignored, as Python
leaves an inherited ignored SIGINT (``nohup`` ignores SIGHUP, a background
job of a non-interactive shell SIGINT).
"""

from __future__ import annotations

import math
import os
import select
import signal
import time
from typing import Callable

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
RELOAD_SIGNAL = signal.SIGHUP


class LoopSignals:
    """Stop and reload requests from signals, and a wake-up the loop can sleep on.

    ``install()`` in the main thread; ``restore()`` puts the previous
    handlers and wake-up fd back and closes the pipe.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic, *,
                 stop_signals: tuple = STOP_SIGNALS, reload_signal: int | None = RELOAD_SIGNAL,
                 keep_ignored: bool = False) -> None:
        self.clock = clock
        self.stop_signals, self.reload_signal = stop_signals, reload_signal
        self.keep_ignored = keep_ignored       # a signal ignored at install stays ignored
        self._r, self._w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.stop_signal: int | None = None   # the first stop signal received
        self._reload = False
        self._woken = False              # set() from another thread
        self._saved: dict[int, object] = {}
        self._saved_fd: int | None = None

    # -- handlers: stores only ------------------------------------------------

    def _on_stop(self, signum, _frame) -> None:
        if self.stop_signal is None:
            self.stop_signal = signum

    def _on_reload(self, _signum, _frame) -> None:
        self._reload = True

    # -- set up and tear down ---------------------------------------------------

    def install(self) -> "LoopSignals":
        for sig in self.stop_signals:
            self._take(sig, self._on_stop)
        if self.reload_signal is not None:
            self._take(self.reload_signal, self._on_reload)
        self._saved_fd = signal.set_wakeup_fd(self._w, warn_on_full_buffer=False)
        return self

    def _take(self, sig: int, handler) -> None:
        if self.keep_ignored and signal.getsignal(sig) == signal.SIG_IGN:
            return
        self._saved[sig] = signal.signal(sig, handler)

    def restore(self) -> None:
        if self._saved_fd is not None:
            signal.set_wakeup_fd(self._saved_fd)
            self._saved_fd = None
        for sig, handler in self._saved.items():
            signal.signal(sig, handler)
        self._saved.clear()
        for fd in (self._r, self._w):
            if fd >= 0:
                os.close(fd)
        self._r = self._w = -1

    # -- the loop's side ------------------------------------------------------------

    @property
    def stopping(self) -> bool:
        return self.stop_signal is not None

    def stop_name(self) -> str:
        return signal.Signals(self.stop_signal).name if self.stop_signal else ""

    def take_reload(self) -> bool:
        """True once per batch of reload requests (SIGHUP), then False until the next."""
        asked, self._reload = self._reload, False
        return asked

    @property
    def reload_pending(self) -> bool:
        return self._reload

    def set(self) -> None:
        """Wake ``wait`` from another thread (the libvirt watcher's ``wake.set()``)."""
        self._woken = True
        try:
            os.write(self._w, b"\0")
        except OSError:
            pass     # the pipe is full (a wake-up is pending anyway) or closed

    def wait(self, timeout: float) -> bool:
        """Sleep up to ``timeout`` s; True as soon as something asks the loop to act.

        That is a stop, a reload, or ``set()``, pending now or arriving while
        it sleeps. A timeout that is not a finite number counts as 0.
        """
        if not self._asked():
            if not (isinstance(timeout, (int, float)) and math.isfinite(timeout)) \
                    or timeout < 0:
                timeout = 0.0
            ready, _, _ = select.select([self._r], [], [], timeout)
            if ready:
                self._drain()
        return self._asked()

    def sleep(self, seconds: float) -> bool:
        """Sleep ``seconds`` unless a stop is asked; True when stopping (the holder's pace).

        A reload or a wake-up does not cut the sleep short: they wait for the
        end of the cycle.
        """
        deadline = self.clock() + (seconds if math.isfinite(seconds) else 0.0)
        while not self.stopping:
            remaining = deadline - self.clock()
            if remaining <= 0:
                break
            ready, _, _ = select.select([self._r], [], [], remaining)
            if ready:
                self._drain()
        return self.stopping

    def _asked(self) -> bool:
        woken, self._woken = self._woken, False
        return self.stopping or self._reload or woken

    def _drain(self) -> None:
        try:
            while os.read(self._r, 4096):
                pass
        except OSError:
            pass
