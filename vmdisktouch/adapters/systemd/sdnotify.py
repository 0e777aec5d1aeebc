"""A minimal sd_notify(3) client, without dependencies.

Under ``Type=notify`` systemd passes the path of a datagram socket in
``NOTIFY_SOCKET``; the service sends newline-separated ``KEY=VALUE``
assignments to it. A path starting with ``@`` is an abstract socket (the
``@`` stands for the leading NUL byte). Outside systemd the variable is unset
and every call here is a no-op that returns False, so the daemon needs no
"am I under systemd?" branches.

How ``vmdisktouch run`` uses it (see systemd/vmdisktouch@.service):

* ``ready(status)`` after the first scan: ``systemctl start`` returns then;
* ``status(text)`` once per cycle: the line ``systemctl status`` shows;
* ``watchdog_ping()`` at least every ``watchdog_interval() / 2`` seconds
  (``WatchdogSec=`` in the unit; systemd kills and restarts a daemon that
  stays silent for the whole interval);
* ``reloading()`` on SIGHUP, then ``ready()`` once the new config is applied.
  The unit is ``Type=notify`` with ``ExecReload=/bin/kill -HUP $MAINPID``
  (systemd 252 on Debian 12 has no ``Type=notify-reload``, added in 253), so
  ``systemctl reload`` returns as soon as the signal is sent; the
  ``RELOADING=1`` / ``READY=1`` pair still shows "reloading" in
  ``systemctl status`` while it lasts. ``MONOTONIC_USEC`` is sent with
  ``RELOADING=1`` because ``Type=notify-reload`` requires it, so the same code
  works if the unit is ever switched to that type;
* ``stopping()`` when SIGTERM arrives, before the holds are released.

Failures to send are logged at debug level and reported as False: a daemon
must not die because its supervisor's socket went away.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from typing import Mapping

log = logging.getLogger("vmdisktouch")


def _address(environ: Mapping[str, str]) -> str | None:
    addr = environ.get("NOTIFY_SOCKET")
    if not addr:
        return None
    if addr.startswith("@"):
        return "\0" + addr[1:]
    if addr.startswith("/"):
        return addr
    log.debug("NOTIFY_SOCKET=%r is neither a path nor an abstract socket; ignored", addr)
    return None


def notify(state: str, environ: Mapping[str, str] | None = None) -> bool:
    """Send ``state`` (newline-separated KEY=VALUE lines) to systemd.

    Returns True if the datagram was sent, False when not under systemd
    (``NOTIFY_SOCKET`` unset) or when sending failed.
    """
    addr = _address(os.environ if environ is None else environ)
    if addr is None:
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.sendto(state.encode("utf-8", "replace"), addr)
        return True
    except OSError as exc:
        log.debug("sd_notify(%r) to %r failed: %s", state, addr, exc)
        return False


def _one_line(text: str) -> str:
    return " ".join(str(text).splitlines())


def ready(status_text: str | None = None, environ: Mapping[str, str] | None = None) -> bool:
    """``READY=1``: start-up (or a reload) is finished; optionally with a STATUS line."""
    state = "READY=1"
    if status_text is not None:
        state += "\nSTATUS=" + _one_line(status_text)
    return notify(state, environ)


def status(text: str, environ: Mapping[str, str] | None = None) -> bool:
    """``STATUS=text``: one line for ``systemctl status`` (newlines become spaces)."""
    return notify("STATUS=" + _one_line(text), environ)


def watchdog_ping(environ: Mapping[str, str] | None = None) -> bool:
    """``WATCHDOG=1``: still alive. Send at least every ``watchdog_interval() / 2``."""
    return notify("WATCHDOG=1", environ)


def stopping(environ: Mapping[str, str] | None = None) -> bool:
    """``STOPPING=1``: shutting down (releasing the holds)."""
    return notify("STOPPING=1", environ)


def reloading(environ: Mapping[str, str] | None = None) -> bool:
    """``RELOADING=1`` with ``MONOTONIC_USEC`` (CLOCK_MONOTONIC, microseconds).

    Send ``ready()`` when the reload is done.
    """
    usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    return notify(f"RELOADING=1\nMONOTONIC_USEC={usec}", environ)


def extend_timeout(seconds: float, environ: Mapping[str, str] | None = None) -> bool:
    """``EXTEND_TIMEOUT_USEC``: the current start/stop step needs up to ``seconds`` more."""
    return notify(f"EXTEND_TIMEOUT_USEC={int(seconds * 1_000_000)}", environ)


def watchdog_interval(environ: Mapping[str, str] | None = None) -> float | None:
    """The watchdog timeout in seconds (``WatchdogSec=``), or None if there is none.

    Like sd_watchdog_enabled(3): ``WATCHDOG_USEC`` must be a positive integer
    and, when ``WATCHDOG_PID`` is set, it must be this process's PID (so a
    child that inherited the environment does not ping for its parent).
    Ping at half this interval. A value below ``MIN_WATCHDOG_USEC`` (1 s) is
    raised to it, with one warning: the loop waits half the period at a time.
    """
    env = os.environ if environ is None else environ
    usec = env.get("WATCHDOG_USEC")
    if not usec:
        return None
    try:
        value = int(usec)
    except ValueError:
        return None
    if value <= 0:
        return None
    pid = env.get("WATCHDOG_PID")
    if pid:
        try:
            if int(pid) != os.getpid():
                return None
        except ValueError:
            return None
    if value < MIN_WATCHDOG_USEC:
        _warn_short_once(value)
        value = MIN_WATCHDOG_USEC
    return value / 1_000_000


# A period below a second is clamped to one: the daemon waits in slices of half the
# period, so WATCHDOG_USEC=1 (a 0.5 us slice) spun at 50-57 % of a core;
# systemd's own WatchdogSec= is in seconds, and no daemon answers a microsecond.
MIN_WATCHDOG_USEC = 1_000_000
_warned = [False]          # said once per process: the period is read at start and reload


def _warn_short_once(value: int) -> None:
    if not _warned[0]:
        _warned[0] = True
        log.warning("WATCHDOG_USEC=%d is below one second: the watchdog is pinged as if it "
                    "were 1 s (WatchdogSec= of at least 2 s leaves room for a slow cycle)",
                    value)
