"""Host memory figures from procfs: MemAvailable, MemTotal, the lock limit.

``mem_available`` is what the holder's floor is checked against, before
every load chunk and after each cycle. (A process's ``VmLck``, which tests
and benchmarks check the holder against, is read by ``tools.procfs``.)

``procfs`` is a parameter so tests can point at a fake tree. Failures raise
``MemInfoError`` with a one-line message; ``FailSafe`` turns them into 0
(no memory to spare) for the daemon, which must never hold on a floor it
cannot check.
"""

from __future__ import annotations

import logging
import os
import resource
from typing import Callable

from vmdisktouch.errors import VmdtError

log = logging.getLogger("vmdisktouch")
CAP_IPC_LOCK = 14

_UNITS = {"kB": 1024, "mB": 1 << 20, "gB": 1 << 30, "B": 1}


class MemInfoError(VmdtError):
    """A procfs memory figure could not be read or parsed."""


def _field(path: str, key: str) -> int:
    """Bytes of the ``Key:   123 kB`` line of a procfs file."""
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            text = f.read()
    except OSError as exc:
        raise MemInfoError(f"cannot read {path}: {exc.strerror or exc}") from None
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
