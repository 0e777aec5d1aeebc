"""A process's memory figures from ``/proc/PID/status``: the one VmLck reader of the project.

The daemon never reads its own VmLck (it counts what it holds); tests,
benchmarks and the demo watch processes that may be gone or a zombie (no
``Vm*`` lines) by the time they look, so here that is a value (``missing``),
not an error.
"""

from __future__ import annotations

import contextlib
import os

CLK_TCK = os.sysconf("SC_CLK_TCK")


def status_fields(pid: int | str = "self") -> dict[str, str]:
    """``/proc/PID/status`` as ``{key: value text}``; raises OSError if the process is gone."""
    with open(f"/proc/{pid}/status") as f:
        return {k: v.strip() for k, _, v in (line.partition(":") for line in f)}


def memory_fields(pid: int | str, keys) -> dict[str, int]:
    """The ``kB`` fields ``keys`` of ``/proc/PID/status``, in bytes (absent keys are left out)."""
    fields = status_fields(pid)
    return {k: int(fields[k].split()[0]) * 1024 for k in keys if k in fields}


def vmlck(pid: int | str = "self", missing: int | None = 0) -> int | None:
    """Bytes mlocked by a process (``VmLck``); ``missing`` if it is gone or a zombie."""
    try:
        return memory_fields(pid, ("VmLck",)).get("VmLck", missing)
    except (FileNotFoundError, ProcessLookupError):
        return missing


def cpu_ticks(pid: int) -> tuple[int, int]:
    """(utime, stime) of the whole process (all threads), in clock ticks (``CLK_TCK``)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]), int(fields[12])         # fields 14 and 15 of proc(5)


def cpu_seconds(pid: int) -> float:
    """utime + stime of the whole process, in seconds."""
    return sum(cpu_ticks(pid)) / CLK_TCK


def cpu_ns(pid: int) -> int:
    """Sum of the run time (ns) of the process's live threads, from schedstat."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
    return total


def o_direct(pid: int, path) -> bool:
    """Whether QEMU ``pid`` has ``path`` open with O_DIRECT (every descriptor of it)."""
    flags = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == str(path):
                info = open(f"/proc/{pid}/fdinfo/{fd}").read()
                flags.append(int(info.split("flags:")[1].split()[0], 8))
        except OSError:
            continue
    assert flags, f"QEMU {pid} does not have {path} open"
    return all(f & os.O_DIRECT for f in flags)
