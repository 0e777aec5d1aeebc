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
is. An instance holds one of its own files open from its ``mkdir`` to its
``rmdir``, so that is always so while its owner lives, and ``sweep(root,
prefix, now)`` removes, at any start, every ``PREFIX*`` instance left
behind by a process that is gone, whatever its name (a killed daemon's
instance costs every I/O on its inode until it is removed). Every file of
an instance is opened through a descriptor of the ``instances`` directory
kept from its creation, so tracefs unmounted under its owner (``umount
-l``) neither stops its reads nor its removal.

What an instance was set up with (``switches()``: its filters, clock,
``buffer_percent``, ``tracing_cpumask``, pid filters, ``tracing_on``, enables,
and no trigger on its events) can be read back (``changed``) and set again
(``restore``), when something outside (``echo 0 > events/enable``,
``trace-cmd reset``, ``echo traceoff > events/G/E/trigger``) changed it. A
trigger is removed by its ``!COMMAND`` line (kernel
Documentation/trace/events.rst, "Event triggers"): a ``traceoff`` trigger
turns ``tracing_on`` off at its event's next hit, so setting ``tracing_on``
back alone left the instance blind again at once. What still reads
otherwise once set back (a trigger on another event disabling ours again) is
``TraceUnavailable``: its owner makes the instance anew.

``Instance.create`` sets ``trace_clock`` to ``mono`` (event times are then
CLOCK_MONOTONIC nanoseconds, the clock of ``time.monotonic_ns()``), the
per-CPU size (``buffer_size_kb``), overwrite mode (a full buffer drops its
oldest events and counts them in ``per_cpu/cpuN/stats``), ``buffer_percent``
to 0 (a poll(2) of ``trace_pipe_raw`` then says readable as soon as that CPU
holds one event, not at the default 50 % full; reads, which never block here,
do not look at it: ``poll_ready`` says whether it could be set), each event's
``filter`` (evaluated in the kernel before the event is stored), then each
event's ``enable``. The events are checked first in the top-level
``events/GROUP/EVENT/format``: an older kernel without one is refused with
one line, like a missing mount, a permission error or a read-only tracefs.
Every refusal is ``TraceUnavailable``; ``remove()`` never raises.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import logging
import os
import re
from collections.abc import Iterable, Mapping

from vmdisktouch.system.trace.tracefs_buffers import Buffers
from vmdisktouch.system.trace.tracefs_mount import (DEFAULT_ROOT, TraceUnavailable,
                                              reason, check_events, check_root, find_root,
                                              read_text)

log = logging.getLogger("vmdisktouch")

CLOCK = "mono"
NAME_MAX = 255
PID_FILTERS = ("set_event_pid", "set_event_notrace_pid")   # empty as made: every pid traced


class Instance(Buffers):
    """One private tracefs instance ``ROOT/instances/NAME``: made by ``create``.

    It keeps two descriptors until ``remove``: one of the ``instances``
    directory, through which every file of the instance is opened (``_open``),
    so tracefs unmounted under the daemon (``umount -l``) changes nothing for
    it, its removal included; and, once made, one of its own ``tracing_on``
    (the hold), so the kernel refuses to rmdir it (EBUSY) from the moment it
    exists until it is removed: ``sweep`` tells a live owner's instance from
    one left behind by that.
    """

    def __init__(self, root: str, name: str):
        self.root = root
        self.name = name
        self.path = os.path.join(root, "instances", name)
        self.events: list[str] = []
        self.filters: dict[str, str] = {}     # as set: what ``changed`` expects
        self.dropped: list[str] = []          # events turned off after ``create`` (``drop``)
        self.poll_ready = False               # buffer_percent is 0: poll(2) says "not empty"
        self.cpumask: str | None = None       # tracing_cpumask as made (every CPU)
        self.pid_filters: list[str] = []      # of PID_FILTERS, those this kernel has
        self.removed = False
        self._hold: int | None = None
        try:
            self._dirfd: int | None = os.open(os.path.join(root, "instances"),
                                              os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            self._dirfd = None

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
        try:
            if os.path.lexists(inst.path):
                inst._remove_stale()
            try:
                inst._mkdir()
            except OSError as exc:
                raise TraceUnavailable(f"cannot create the tracefs instance {inst.path}: "
                                       f"{reason(exc)}") from None
        except BaseException:
            inst._close_fds()
            raise
        atexit.register(inst.remove)         # an exception out of the daemon, too
        try:
            try:
                inst._hold = inst._open("tracing_on", os.O_RDONLY)
            except OSError as exc:
                raise TraceUnavailable(f"cannot open {inst.path}/tracing_on: {reason(exc)}") \
                    from None
            inst._configure(filters, buffer_kb)
        except BaseException:
            inst.remove()
            raise
        return inst

    def _mkdir(self) -> None:
        if self._dirfd is None:
            os.mkdir(self.path)
        else:
            os.mkdir(self.name, dir_fd=self._dirfd)

    def _rmdir(self) -> None:
        if self._dirfd is None:
            os.rmdir(self.path)
        else:
            os.rmdir(self.name, dir_fd=self._dirfd)

    def _remove_stale(self) -> None:
        """Remove an instance of our name left by a killed process. A plain rmdir first:
        EBUSY means a live process has its files open, and then it is left untouched."""
        try:
            self._rmdir()
        except OSError as exc:
            if exc.errno == errno.EBUSY:
                raise TraceUnavailable(f"tracefs instance {self.path} is in use by another "
                                       "process (another vmdisktouch on this image?)") from None
            self._teardown()                 # its events disabled first, then rmdir again
        if os.path.lexists(self.path):
            raise TraceUnavailable(f"tracefs instance {self.path} exists and cannot be removed")
        log.warning("tracefs: removed the stale instance %s (left by a process that is gone)",
                    self.path)

    def _configure(self, filters: Mapping[str, str], buffer_kb: int) -> None:
        clocks = self._read("trace_clock").replace("[", " ").replace("]", " ").split()
        if CLOCK not in clocks:
            raise TraceUnavailable(f"tracefs offers no {CLOCK} trace clock (has: "
                                   f"{' '.join(clocks)})")
        self._write("trace_clock", CLOCK)
        self.resize(buffer_kb)
        try:
            self._put("buffer_percent", "0")
            self.poll_ready = True
        except OSError as exc:
            log.info("tracefs: cannot set %s/buffer_percent to 0 (%s): a poll of the buffers "
                     "cannot tell them empty", self.path, reason(exc))
        self._write("options/overwrite", "1", missing_ok=True)
        try:
            self.cpumask = self._text("tracing_cpumask").strip() or None
        except OSError:
            self.cpumask = None
        self.pid_filters = [f for f in PID_FILTERS if self._exists(f)]
        self._write("tracing_on", "1")
        for event, expr in filters.items():
            self.set_filter(event, expr)
        for event in filters:
            self._write(f"events/{event}/enable", "1")
            self.events.append(event)

    # -- its files, opened through the ``instances`` directory ---------------------------

    def _open(self, rel: str, flags: int) -> int:
        if self._dirfd is None:
            return os.open(os.path.join(self.path, rel), flags | os.O_CLOEXEC)
        return os.open(f"{self.name}/{rel}", flags | os.O_CLOEXEC, dir_fd=self._dirfd)

    def _text(self, rel: str) -> str:
        fd = self._open(rel, os.O_RDONLY)
        try:
            chunks = []
            while chunk := os.read(fd, 65536):
                chunks.append(chunk)
        finally:
            os.close(fd)
        return b"".join(chunks).decode(errors="replace")

    def _put(self, rel: str, text: str) -> None:
        """Write a control file in one write(2), as ``echo TEXT > FILE`` does."""
        fd = self._open(rel, os.O_WRONLY | os.O_TRUNC)
        try:
            os.write(fd, text.encode() + b"\n")
        finally:
            os.close(fd)

    def _exists(self, rel: str) -> bool:
        try:
            os.close(self._open(rel, os.O_RDONLY))
            return True
        except OSError:
            return False

    def _read(self, rel: str) -> str:
        try:
            return self._text(rel)
        except OSError as exc:
            raise TraceUnavailable(f"cannot read {self.path}/{rel}: {reason(exc)}") from None

    def _write(self, rel: str, text: str, missing_ok: bool = False) -> None:
        try:
            self._put(rel, text)
        except FileNotFoundError:
            if not missing_ok:
                raise TraceUnavailable(f"cannot write {text!r} to {self.path}/{rel}: "
                                       f"{os.strerror(errno.ENOENT)}") from None
        except OSError as exc:
            raise TraceUnavailable(f"cannot write {text!r} to {self.path}/{rel}: "
                                   f"{reason(exc)}{self._error_log()}") from None

    def _error_log(self) -> str:
        """The last error of the instance's ``error_log`` (a filter's syntax), or ""."""
        try:
            text = self._text("error_log")
        except OSError:
            return ""
        errors = [ln.split("]", 1)[-1].strip() for ln in text.splitlines() if ln.startswith("[")]
        return f" ({errors[-1]})" if errors else ""

    def set_filter(self, event: str, expr: str) -> None:
        """Set (or with ``""`` clear) the kernel-side filter of ``GROUP/EVENT``."""
        self._write(f"events/{event}/filter", expr or "0")
        self.filters[event] = expr

    def drop(self, event: str) -> None:
        """Stop recording ``GROUP/EVENT`` (made by ``create``): from now it is expected off."""
        self._write(f"events/{event}/enable", "0")
        self.events.remove(event)
        self.filters.pop(event, None)
        self.dropped.append(event)

    # -- the switches as set up, and set back ------------------------------------------

    def switches(self) -> dict[str, tuple[str, str]]:
        """Each control file this instance was set up through -> (its value as read back,
        the text that sets it), in the order ``restore`` sets them: the triggers first (a
        ``traceoff`` would turn ``tracing_on`` off again), ``tracing_on`` and the enables
        last, as ``create``. A trigger file reads back without its ``#`` lines."""
        out = {f"events/{e}/trigger": ("", "") for e in self.events + self.dropped}
        out.update({f"events/{e}/filter": (expr or "none", expr or "0")
                    for e, expr in self.filters.items()})
        out["trace_clock"] = (f"[{CLOCK}]", CLOCK)
        if self.poll_ready:
            out["buffer_percent"] = ("0", "0")
        if self.cpumask:
            out["tracing_cpumask"] = (self.cpumask, self.cpumask)
        out.update({f: ("", "") for f in self.pid_filters})
        out["tracing_on"] = ("1", "1")
        out.update({f"events/{e}/enable": ("0", "0") for e in self.dropped})
        out.update({f"events/{e}/enable": ("1", "1") for e in self.events})
        return out

    def _value(self, rel: str) -> str:
        """What ``rel`` reads, a trigger file's ``#`` lines (its help) left out."""
        text = self._text(rel)
        if rel.endswith("/trigger"):
            text = "\n".join(ln for ln in text.splitlines() if not ln.startswith("#"))
        return text

    def changed(self, rels: Iterable[str]) -> dict[str, str]:
        """Which of the control files ``rels`` (of ``switches()``) read otherwise than they
        were set: each -> what it read (a file that cannot be read counts as changed)."""
        want, out = self.switches(), {}
        for rel in rels:
            try:
                text = self._value(rel)
            except OSError as exc:
                out[rel] = f"unreadable ({reason(exc)})"
                continue
            if text.strip() != want[rel][0] and (not want[rel][0]
                                                 or want[rel][0] not in text.split()):
                out[rel] = " ".join(text.split())[:80]
        return out

    def restore(self, rels: Iterable[str]) -> None:
        """Set the control files ``rels`` back as they were set up, then read them again:
        ``TraceUnavailable`` when one cannot be written or still reads otherwise."""
        rels = set(rels)
        for rel, (_, text) in self.switches().items():
            if rel in rels and rel.endswith("/trigger"):
                self._untrigger(rel)
            elif rel in rels:
                self._write(rel, text)
        still = self.changed(r for r in self.switches() if r in rels)
        if still:
            raise TraceUnavailable(f"{self.path}: set back, but it reads otherwise again: "
                                   + ", ".join(f"{k} {v!r}" for k, v in still.items()))

    def _untrigger(self, rel: str) -> None:
        """Remove every trigger of the file ``rel``: ``!COMMAND[:EVENT]`` per line read
        (its count and ``if`` filter left out: the kernel matches a trigger without them)."""
        for line in self._value(rel).splitlines():
            parts = line.split(" if ", 1)[0].strip().split(":")
            if len(parts) > 1 and re.fullmatch(r"unlimited|count=\d+|\d+", parts[-1]):
                parts.pop()
            if parts[0]:
                self._write(rel, "!" + ":".join(parts))

    def check(self, turn: int, full: bool = False) -> dict[str, str]:
        """Four small reads: ``tracing_on`` and the ``enable``, ``filter`` and ``trigger`` of
        event ``turn`` (of ``events``, in turn). On a change (or ``full``), every switch is
        read and what changed set back; returns that (file -> what it read), or {}.
        ``TraceUnavailable`` when it cannot be set back (``restore``)."""
        ev = self.events[turn % len(self.events)] if self.events else None
        if not full and not self.changed(["tracing_on"] + (
                [f"events/{ev}/{f}" for f in ("enable", "filter", "trigger")]
                if ev is not None else [])):
            return {}
        changed = self.changed(self.switches())
        self.restore(changed)
        return changed

    # -- removal ---------------------------------------------------------------------

    def _teardown(self) -> bool:
        """Let go of the hold, disable every event, then rmdir; True when it is gone."""
        if self._hold is not None:
            os.close(self._hold)
            self._hold = None
        for rel in ["events/enable"] + [f"events/{e}/enable" for e in self.events]:
            try:
                self._put(rel, "0")
            except OSError:
                pass
        try:
            self._rmdir()
        except FileNotFoundError:
            log.warning("tracefs: the instance %s was gone already (removed by someone else%s)",
                        self.path, "" if self._dirfd is not None else ", or tracefs unmounted")
            return True
        except OSError as exc:
            log.warning("tracefs: cannot remove the instance %s: %s", self.path, reason(exc))
            return False
        return True

    def _close_fds(self) -> None:
        for fd in (self._hold, self._dirfd):
            if fd is not None:
                os.close(fd)
        self._hold = self._dirfd = None

    def remove(self) -> None:
        """Disable the events and rmdir the instance. Idempotent; never raises."""
        if self.removed:
            return
        try:
            self.removed = self._teardown()
        except Exception as exc:   # noqa: BLE001 - a cleanup path: log, never raise
            log.warning("tracefs: cannot remove the instance %s: %s", self.path, exc)
        if self.removed:
            self._close_fds()
            atexit.unregister(self.remove)


PREFIX = "vmdisktouch@"   # of every instance this project makes (``sweep`` removes them)
SWEEP_MIN_AGE = 3.0      # seconds: an instance younger than this is never swept


def close_pipes(fds: dict[int, int]) -> None:
    """Close every CPU's pipe of ``fds`` (cpu -> descriptor), errors ignored; empty it."""
    for fd in fds.values():
        with contextlib.suppress(OSError):
            os.close(fd)
    fds.clear()


def sweep(root: str, prefix: str, now: float, min_age: float = SWEEP_MIN_AGE) -> list[str]:
    """Remove the instances named ``PREFIX*`` left behind by processes that are gone (a
    SIGKILL, a crash): their names, each logged. Never raises.

    A live owner holds a file of its instance open from the moment it made it until
    it removes it (``Instance``), so the kernel refuses the rmdir (EBUSY) and the
    instance is left alone. So is one younger than ``min_age`` seconds by its
    inode's change time (when it was made; ``now`` is the wall clock): a process of
    an earlier version, which held nothing while it set its instance up, is not raced.
    """
    try:
        names = sorted(n for n in os.listdir(os.path.join(root, "instances"))
                       if n.startswith(prefix))
    except OSError:
        return []
    removed = []
    for name in names:
        inst = Instance(root, name)
        try:
            if now - os.lstat(inst.path).st_ctime >= min_age:
                inst._remove_stale()
                removed.append(name)
        except (OSError, TraceUnavailable):
            pass                                   # in use, or gone meanwhile
        finally:
            inst._close_fds()
    return removed


__all__ = ["DEFAULT_ROOT", "PREFIX", "Instance", "close_pipes", "TraceUnavailable", "check_events", "check_root",
           "find_root", "read_text", "sweep"]
