"""Host memory figures from procfs: MemAvailable and a process's VmLck.

``mem_available`` is what the holder's floor is checked against, before
every load chunk and after each cycle. ``vm_locked`` is the locked memory a
process has (``VmLck``, the pages of its mlocked mappings): tests and
metrics use it to check the holder never locks more than its budget.

``procfs`` is a parameter so tests can point at a fake tree. Failures raise
``MemInfoError`` with a one-line message.
"""

from __future__ import annotations

import os

from vmdisktouch.errors import VmdtError

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


def vm_locked(pid: int | str = "self", procfs: str = "/proc") -> int:
    """VmLck of a process from ``/proc/PID/status``, in bytes."""
    return _field(os.path.join(procfs, str(pid), "status"), "VmLck")
