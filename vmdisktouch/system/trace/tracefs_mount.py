"""Where tracefs is and whether it can serve us: the mount, its permissions, the events.

``find_root()`` finds the tracefs mount (mounting it where none is),
``check_root`` refuses one we cannot use (not tracefs, read-only, no
permission), ``check_events`` a kernel without one of our tracepoints; each
refusal is one ``TraceUnavailable`` line. ``system.trace.tracefs`` (the instances)
re-exports them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

from vmdisktouch.errors import EX_CONFIG, SyscallError, VmdtError
from vmdisktouch.system import libc

DEFAULT_ROOT = "/sys/kernel/tracing"


class TraceUnavailable(VmdtError):
    """Kernel tracing cannot serve us here; ``str()`` is one line saying why."""

    exit_code = EX_CONFIG


def reason(exc: OSError) -> str:
    return os.strerror(exc.errno) if exc.errno else str(exc)


def _unescape(field: str) -> str:
    """A /proc/self/mounts field: spaces and the like are octal escapes (``\\040``)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _has_instances(root: str) -> bool:
    try:
        return os.path.isdir(os.path.join(root, "instances")) and os.access(root, os.W_OK)
    except OSError:
        return False


def _read_only(root: str) -> bool:
    try:
        return bool(os.statvfs(root).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def find_root(mounts: str = "/proc/self/mounts", default: str = DEFAULT_ROOT) -> str:
    """The tracefs mount point: a ``tracefs`` line of ``mounts``, else ``default`` if it has
    ``instances``, else tracefs mounted at ``default`` now (mount(2))."""
    try:
        with open(mounts) as f:
            lines = f.read().splitlines()
    except OSError:
        lines = []
    mounted = [_unescape(p[1]) for p in map(str.split, lines) if len(p) >= 3
               and p[2] == "tracefs"]
    for root in mounted + [default]:
        if _has_instances(root):
            return root
    for root in mounted:
        if _read_only(root):
            raise TraceUnavailable(f"tracefs at {root} is mounted read-only (a systemd unit's "
                                   "ProtectKernelTunables= does this: see docs/unit.md)")
        if not os.access(root, os.R_OK | os.W_OK | os.X_OK):
            raise TraceUnavailable(f"permission denied on {root}: kernel tracing needs root")
    if mounted:
        raise TraceUnavailable(f"tracefs at {mounted[0]} has no instances directory")
    try:
        libc.mount("nodev", default, "tracefs")
    except SyscallError as exc:
        raise TraceUnavailable(f"tracefs is not mounted, and mounting it at {default} failed: "
                               f"{exc}") from None
    if not _has_instances(default):
        raise TraceUnavailable(f"tracefs mounted at {default} has no instances directory")
    return default


def check_root(root: str) -> None:
    """``root`` is a usable tracefs: an ``instances`` directory we may write to."""
    try:
        os.stat(os.path.join(root, "instances"))
    except PermissionError:
        raise TraceUnavailable(f"permission denied on {root}: kernel tracing needs root") from None
    except OSError as exc:
        raise TraceUnavailable(f"{root} is not a tracefs mount (no instances directory: "
                               f"{reason(exc)})") from None
    if not os.path.isdir(os.path.join(root, "instances")) or \
            not os.path.isdir(os.path.join(root, "events")):
        raise TraceUnavailable(f"{root} is not a tracefs mount (no instances and events "
                               "directories)")
    if _read_only(root):
        raise TraceUnavailable(f"tracefs at {root} is mounted read-only")
    if not os.access(os.path.join(root, "instances"), os.W_OK):
        raise TraceUnavailable(f"permission denied on {root}/instances: kernel tracing needs root")


def check_events(root: str, events: Iterable[str]) -> None:
    """Each ``GROUP/EVENT`` is a tracepoint of this kernel (its ``format`` file exists)."""
    for event in events:
        if not os.path.isfile(os.path.join(root, "events", event, "format")):
            group, _, name = event.partition("/")
            raise TraceUnavailable(f"this kernel ({os.uname().release}) has no tracepoint "
                                   f"{group}:{name} ({root}/events/{event}/format is missing)")


def read_text(path: str) -> str:
    with open(path) as f:
        return f.read()


def online_cpus(path: str = "/sys/devices/system/cpu/online") -> set[int] | None:
    """The online CPUs ("0-3,6"), or None when the file cannot be read."""
    try:
        text = read_text(path).strip()
    except OSError:
        return None
    out: set[int] = set()
    for part in filter(None, text.split(",")):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


__all__ = ["DEFAULT_ROOT", "TraceUnavailable", "check_events", "check_root", "find_root",
           "online_cpus", "read_text", "reason"]
