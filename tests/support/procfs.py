"""A process's memory figures from ``/proc/PID/status``: the one VmLck reader of the project.

The daemon never reads its own VmLck (it counts what it holds); tests,
benchmarks and the demo watch processes that may be gone or a zombie (no
``Vm*`` lines) by the time they look, so here that is a value (``missing``),
not an error.
"""

from __future__ import annotations


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
