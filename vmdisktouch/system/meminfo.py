"""Host memory figures from procfs: MemAvailable, MemTotal, the lock limit.

``mem_available`` is what the holder's floor is checked against, before
every load chunk and after each cycle. (A process's ``VmLck``, which tests
and benchmarks check the holder against, is read by ``tests.support.procfs``.)

``procfs`` is a parameter so tests can point at a fake tree. Failures raise
``MemInfoError`` with a one-line message; ``FailSafe`` turns them into 0
(no memory to spare) for the daemon, which must never hold on a floor it
cannot check.

The real ``/proc/meminfo`` is opened once and kept (``keep_open``, which the
daemon calls before it serves anything; otherwise at the first read): each
read is a ``pread`` of that descriptor, so MemAvailable stays readable when
the process has no descriptor left to open a file with (a
flood of connections to ``--metrics-listen`` took them all, MemAvailable
read as 0 and every hold was shed). A fake tree (tests) is opened per read.
"""

from __future__ import annotations

import errno
import logging
import os
import resource
import threading
from typing import Callable

from vmdisktouch.errors import VmdtError

log = logging.getLogger("vmdisktouch")
CAP_IPC_LOCK = 14

_UNITS = {"kB": 1024, "mB": 1 << 20, "gB": 1 << 30, "B": 1}


class MemInfoError(VmdtError):
    """A procfs memory figure could not be read or parsed."""


PROC = "/proc"
_kept: dict[str, int] = {}          # path -> descriptor kept open (the real /proc only)
_kept_lock = threading.Lock()


def keep_open(procfs: str = PROC) -> None:
    """Open ``procfs/meminfo`` now and keep it (see the module docstring); idempotent.
    Raises ``MemInfoError`` when it cannot be opened."""
    _descriptor(os.path.join(procfs, "meminfo"))


def _descriptor(path: str) -> int:
    with _kept_lock:
        fd = _kept.get(path)
        if fd is None:
            try:
                fd = _kept[path] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError as exc:
                raise MemInfoError(f"cannot read {path}: {exc.strerror or exc}") from None
        return fd


def _pread_all(fd: int) -> bytes:
    """The whole file from offset 0 (procfs files regenerate their text for each read)."""
    size = 8192
    while True:
        data = os.pread(fd, size, 0)
        if len(data) < size:
            return data
        size *= 4


def _read(path: str) -> str:
    try:
        if os.path.dirname(path) == PROC:
            fd = _descriptor(path)
            try:
                data = _pread_all(fd)
            except OSError as exc:
                if exc.errno == errno.EBADF:     # closed behind our back: open it again
                    with _kept_lock:             # next time (never close a reused number)
                        if _kept.get(path) == fd:
                            del _kept[path]
                raise
        else:
            with open(path, "rb") as f:
                data = f.read()
    except OSError as exc:
        raise MemInfoError(f"cannot read {path}: {exc.strerror or exc}") from None
    return data.decode("ascii", errors="replace")


def _field(path: str, key: str) -> int:
    """Bytes of the ``Key:   123 kB`` line of a procfs file."""
    text = _read(path)
    prefix = key + ":"
    for line in text.splitlines():
        if line.startswith(prefix):
            parts = line[len(prefix):].split()
            try:
                value = int(parts[0])
                unit = _UNITS[parts[1]] if len(parts) > 1 else 1
            except (IndexError, ValueError, KeyError):
                raise MemInfoError(f"{path}: cannot parse {line.strip()!r}") from None
            if value < 0:
                raise MemInfoError(f"{path}: negative value in {line.strip()!r}")
            return value * unit
    raise MemInfoError(f"{path}: no {key} line (kernel older than 3.14?)"
                       if key == "MemAvailable" else f"{path}: no {key} line")


def mem_available(procfs: str = "/proc") -> int:
    """MemAvailable from ``/proc/meminfo``, in bytes."""
    return _field(os.path.join(procfs, "meminfo"), "MemAvailable")


def mem_free(procfs: str = "/proc") -> int:
    """MemFree from ``/proc/meminfo``, in bytes: memory nobody uses (the spill's gauge)."""
    return _field(os.path.join(procfs, "meminfo"), "MemFree")


def mem_total(procfs: str = "/proc") -> int:
    """MemTotal from ``/proc/meminfo``, in bytes."""
    return _field(os.path.join(procfs, "meminfo"), "MemTotal")


def memlock_allowance(procfs: str = "/proc") -> int | None:
    """Bytes this process may mlock, or None when unlimited.

    Unlimited with ``CAP_IPC_LOCK`` in the effective set (root has it unless
    a bounding set drops it) or an infinite ``RLIMIT_MEMLOCK``; otherwise
    the soft limit (mlock(2)).
    """
    soft, _hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    if soft == resource.RLIM_INFINITY:
        return None
    try:
        with open(os.path.join(procfs, "self", "status"), encoding="ascii",
                  errors="replace") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    if int(line.split()[1], 16) >> CAP_IPC_LOCK & 1:
                        return None
                    break
    except (OSError, ValueError, IndexError):
        pass
    return soft


class FailSafe:
    """A MemAvailable reader that reads 0 while the real one fails, logging once per streak."""

    def __init__(self, read: Callable[[], int]):
        self.read = read
        self.failures = 0

    def __call__(self) -> int:
        try:
            value = self.read()
        except VmdtError as exc:
            self.failures += 1
            if self.failures == 1:
                log.warning("%s; taking MemAvailable as 0: nothing is loaded, and the holds "
                            "are shed to the floor until it can be read", exc)
            return 0
        if self.failures:
            log.info("MemAvailable readable again after %d failed reads", self.failures)
            self.failures = 0
        return value
