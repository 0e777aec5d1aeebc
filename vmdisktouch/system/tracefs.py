"""tracefs instances: a private trace buffer with only the events we enable.

Theory of operation. The kernel's tracing file system (tracefs, normally at
``/sys/kernel/tracing``) has one global trace buffer and any number of
*instances*: ``mkdir instances/NAME`` makes a new set of per-CPU ring
buffers with its own event switches, filters, clock and size, unseen by
other tracers; ``rmdir`` frees it. An instance survives its creator: a
daemon killed by SIGKILL leaves it behind, still recording, so
``Instance.create`` first removes an instance of the same name: rmdir (it
succeeds with events enabled; failing for another reason than EBUSY, the
events are disabled and rmdir tried again). EBUSY means a live process holds
one of its files open: the name is in use, and that instance is left as it
is.

``Instance.create`` sets ``trace_clock`` to ``mono`` (event times are then
CLOCK_MONOTONIC nanoseconds, the clock of ``time.monotonic_ns()``), the
per-CPU size (``buffer_size_kb``), overwrite mode (a full buffer drops its
oldest events and counts them in ``per_cpu/cpuN/stats``), each event's
``filter`` (evaluated in the kernel before the event is stored), then each
event's ``enable``. The events are checked first in the top-level
``events/GROUP/EVENT/format``: an older kernel without one is refused with
one line, like a missing mount, a permission error or a read-only tracefs.
Every refusal is ``TraceUnavailable``; ``remove()`` never raises.
"""

from __future__ import annotations

import errno
import logging
import os
import re
from collections.abc import Iterable, Mapping

from vmdisktouch.errors import EX_CONFIG, SyscallError, VmdtError
from vmdisktouch.system import libc

log = logging.getLogger("vmdisktouch")

DEFAULT_ROOT = "/sys/kernel/tracing"
CLOCK = "mono"
NAME_MAX = 255
_STATS_LOST = ("overrun", "commit overrun", "dropped events")


class TraceUnavailable(VmdtError):
    """Kernel tracing cannot serve us here; ``str()`` is one line saying why."""

    exit_code = EX_CONFIG


def _why(exc: OSError) -> str:
    return os.strerror(exc.errno) if exc.errno else str(exc)


def _unescape(field: str) -> str:
    """A /proc/self/mounts field: spaces and the like are octal escapes (``\\040``)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _has_instances(root: str) -> bool:
    try:
        return os.path.isdir(os.path.join(root, "instances")) and os.access(root, os.W_OK)
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
                               f"{_why(exc)})") from None
    if not os.path.isdir(os.path.join(root, "instances")) or \
            not os.path.isdir(os.path.join(root, "events")):
        raise TraceUnavailable(f"{root} is not a tracefs mount (no instances and events "
                               "directories)")
    try:
        read_only = bool(os.statvfs(root).f_flag & os.ST_RDONLY)
    except OSError:
        read_only = False
    if read_only:
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


def write_text(path: str, text: str) -> None:
    """Write a tracefs control file in one write(2), as ``echo TEXT > PATH`` does."""
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode() + b"\n")
    finally:
        os.close(fd)


class Instance:
    """One private tracefs instance ``ROOT/instances/NAME``: made by ``create``."""

    def __init__(self, root: str, name: str):
        self.root = root
        self.name = name
        self.path = os.path.join(root, "instances", name)
        self.events: list[str] = []
        self.removed = False

    @classmethod
    def create(cls, name: str, filters: Mapping[str, str], *, buffer_kb: int = 1024,
               root: str | None = None) -> Instance:
        """A fresh instance recording the events of ``filters`` (``"GROUP/EVENT"`` ->
        filter expression, ``""`` for none), on the ``mono`` clock, ``buffer_kb`` per CPU.

        A stale instance of that name is removed first. Raises ``TraceUnavailable``.
        """
        if not name or "/" in name or "\0" in name or name in (".", "..") \
                or len(name.encode()) > NAME_MAX:
            raise TraceUnavailable(f"{name!r} cannot name a tracefs instance (a directory name "
                                   f"of 1-{NAME_MAX} bytes without '/')")
        root = find_root() if root is None else root
        check_root(root)
        check_events(root, filters)
        inst = cls(root, name)
        if os.path.lexists(inst.path):
            inst._remove_stale()
        try:
            os.mkdir(inst.path)
        except OSError as exc:
            raise TraceUnavailable(f"cannot create the tracefs instance {inst.path}: "
                                   f"{_why(exc)}") from None
        try:
            inst._configure(filters, buffer_kb)
        except BaseException:
            inst.remove()
            raise
        return inst

    def _remove_stale(self) -> None:
        """Remove an instance of our name left by a killed process. A plain rmdir first:
        EBUSY means a live process has its files open, and then it is left untouched."""
        try:
            os.rmdir(self.path)
        except OSError as exc:
            if exc.errno == errno.EBUSY:
                raise TraceUnavailable(f"tracefs instance {self.path} is in use by another "
                                       "process (another vmdisktouch on this image?)") from None
            self._teardown()                 # its events disabled first, then rmdir again
        if os.path.lexists(self.path):
            raise TraceUnavailable(f"tracefs instance {self.path} exists and cannot be removed")
        log.warning("tracefs: removed the stale instance %s (left by a killed daemon)", self.path)

    def _configure(self, filters: Mapping[str, str], buffer_kb: int) -> None:
        clocks = self._read("trace_clock").replace("[", " ").replace("]", " ").split()
        if CLOCK not in clocks:
            raise TraceUnavailable(f"tracefs offers no {CLOCK} trace clock (has: "
                                   f"{' '.join(clocks)})")
        self._write("trace_clock", CLOCK)
        self.resize(buffer_kb)
        if os.path.exists(os.path.join(self.path, "options", "overwrite")):
            self._write("options/overwrite", "1")
        self._write("tracing_on", "1")
        for event, expr in filters.items():
            self.set_filter(event, expr)
        for event in filters:
            self._write(f"events/{event}/enable", "1")
            self.events.append(event)

    def _read(self, rel: str) -> str:
        try:
            return read_text(os.path.join(self.path, rel))
        except OSError as exc:
            raise TraceUnavailable(f"cannot read {self.path}/{rel}: {_why(exc)}") from None

    def _write(self, rel: str, text: str) -> None:
        try:
            write_text(os.path.join(self.path, rel), text)
        except OSError as exc:
            raise TraceUnavailable(f"cannot write {text!r} to {self.path}/{rel}: "
                                   f"{_why(exc)}{self._error_log()}") from None

    def _error_log(self) -> str:
        """The last error of the instance's ``error_log`` (a filter's syntax), or ""."""
        try:
            text = read_text(os.path.join(self.path, "error_log"))
        except OSError:
            return ""
        errors = [ln.split("]", 1)[-1].strip() for ln in text.splitlines() if ln.startswith("[")]
        return f" ({errors[-1]})" if errors else ""

    def set_filter(self, event: str, expr: str) -> None:
        """Set (or with ``""`` clear) the kernel-side filter of ``GROUP/EVENT``."""
        self._write(f"events/{event}/filter", expr or "0")

    def format_text(self, event: str) -> str:
        return self._read(f"events/{event}/format")

    def header_page(self) -> str:
        return self._read("events/header_page")

    def header_event(self) -> str:
        return self._read("events/header_event")

    def subbuf_bytes(self) -> int:
        """Bytes of one sub-buffer, the unit of ``trace_pipe_raw`` reads."""
        path = os.path.join(self.path, "buffer_subbuf_size_kb")
        if os.path.exists(path):
            return int(self._read("buffer_subbuf_size_kb").split()[0]) * 1024
        return libc.PAGE_SIZE

    def buffer_kb(self) -> int:
        return int(self._read("buffer_size_kb").split()[0])

    def resize(self, kb: int) -> None:
        """Set the per-CPU buffer size; ``TraceUnavailable`` when the kernel refuses."""
        self._write("buffer_size_kb", str(int(kb)))

    def cpus(self) -> list[int]:
        """The CPUs with a per-CPU buffer now (``per_cpu/cpuN``) that are online."""
        try:
            names = os.listdir(os.path.join(self.path, "per_cpu"))
        except OSError as exc:
            raise TraceUnavailable(f"cannot list {self.path}/per_cpu: {_why(exc)}") from None
        cpus = sorted(int(n[3:]) for n in names if n.startswith("cpu") and n[3:].isdigit())
        online = _online_cpus()
        return [c for c in cpus if online is None or c in online]

    def open_pipe(self, cpu: int) -> int:
        """``per_cpu/cpuN/trace_pipe_raw``, non-blocking: a read gives a page or EAGAIN."""
        return os.open(os.path.join(self.path, "per_cpu", f"cpu{cpu}", "trace_pipe_raw"),
                       os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)

    def lost_counts(self, cpus: Iterable[int]) -> dict[int, int | None]:
        """Per CPU, the events lost so far (``overrun`` + ``commit overrun`` + ``dropped
        events`` of ``per_cpu/cpuN/stats``); None where the stats cannot be read."""
        out: dict[int, int | None] = {}
        for cpu in cpus:
            try:
                text = read_text(os.path.join(self.path, "per_cpu", f"cpu{cpu}", "stats"))
            except OSError:
                out[cpu] = None
                continue
            total = 0
            for line in text.splitlines():
                key, _, value = line.partition(":")
                if key.strip() in _STATS_LOST and value.strip().isdigit():
                    total += int(value)
            out[cpu] = total
        return out

    def _teardown(self) -> bool:
        """Disable every event of the instance, then rmdir it; True when it is gone."""
        for rel in ["events/enable"] + [f"events/{e}/enable" for e in self.events]:
            try:
                write_text(os.path.join(self.path, rel), "0")
            except OSError:
                pass
        try:
            os.rmdir(self.path)
        except FileNotFoundError:
            return True
        except OSError as exc:
            log.warning("tracefs: cannot remove the instance %s: %s", self.path, _why(exc))
            return False
        return True

    def remove(self) -> None:
        """Disable the events and rmdir the instance. Idempotent; never raises."""
        if self.removed:
            return
        try:
            self.removed = self._teardown()
        except Exception as exc:   # noqa: BLE001 - a cleanup path: log, never raise
            log.warning("tracefs: cannot remove the instance %s: %s", self.path, exc)


def _online_cpus(path: str = "/sys/devices/system/cpu/online") -> set[int] | None:
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


__all__ = ["DEFAULT_ROOT", "Instance", "TraceUnavailable", "check_events", "check_root",
           "find_root"]
