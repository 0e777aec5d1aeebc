"""The reading side of a tracefs instance (``tracefs.Instance``): its event formats, its
per-CPU ring buffers (size, pipes) and the events they lost.

A mixin of ``Instance`` so that the instance's control files (``tracefs``) and
its buffers each fit one module; every file is opened through the instance's
``_open`` (its ``instances`` directory descriptor, see ``tracefs``).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable

from vmdisktouch.system import libc
from vmdisktouch.system.trace.tracefs_mount import TraceUnavailable, online_cpus, reason

log = logging.getLogger("vmdisktouch")

_STATS_LOST = ("overrun", "commit overrun", "dropped events")


class Buffers:
    """The reading methods of ``tracefs.Instance`` (which gives ``path``, ``_open``,
    ``_text``, ``_read`` and ``_write``)."""

    def format_text(self, event: str) -> str:
        return self._read(f"events/{event}/format")

    def header_page(self) -> str:
        return self._read("events/header_page")

    def header_event(self) -> str:
        return self._read("events/header_event")

    def subbuf_bytes(self) -> int:
        """Bytes of one sub-buffer, the unit of ``trace_pipe_raw`` reads."""
        try:
            return int(self._text("buffer_subbuf_size_kb").split()[0]) * 1024
        except FileNotFoundError:
            return libc.PAGE_SIZE
        except OSError as exc:
            raise TraceUnavailable(f"cannot read {self.path}/buffer_subbuf_size_kb: "
                                   f"{reason(exc)}") from None

    def buffer_kb(self) -> int:
        return int(self._read("buffer_size_kb").split()[0])

    def resize(self, kb: int) -> None:
        """Set the per-CPU buffer size; ``TraceUnavailable`` when the kernel refuses."""
        self._write("buffer_size_kb", str(int(kb)))

    def grow(self, kb: int, rate: float) -> int:
        """``resize`` while the instance records; the events it lost meanwhile, estimated
        from ``rate`` (events a nanosecond), since the kernel drops what is recorded during
        a resize without counting it (6.18: 15-30 ms of events, whatever the sizes)."""
        t0 = time.monotonic_ns()
        self.resize(kb)
        return round(rate * (time.monotonic_ns() - t0))

    def cpus(self) -> list[int]:
        """The CPUs with a per-CPU buffer now (``per_cpu/cpuN``) that are online."""
        try:
            fd = self._open("per_cpu", os.O_RDONLY | os.O_DIRECTORY)
            try:
                names = os.listdir(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            raise TraceUnavailable(f"cannot list {self.path}/per_cpu: {reason(exc)}") from None
        cpus = sorted(int(n[3:]) for n in names if n.startswith("cpu") and n[3:].isdigit())
        online = online_cpus()
        return [c for c in cpus if online is None or c in online]

    def open_pipe(self, cpu: int) -> int:
        """``per_cpu/cpuN/trace_pipe_raw``, non-blocking: a read gives a page or EAGAIN."""
        return self._open(f"per_cpu/cpu{cpu}/trace_pipe_raw", os.O_RDONLY | os.O_NONBLOCK)

    def open_pipes(self) -> dict[int, int]:
        """CPU -> its ``open_pipe``, for each of ``cpus()`` whose pipe opens;
        ``TraceUnavailable`` when none does."""
        fds: dict[int, int] = {}
        for cpu in self.cpus():
            try:
                fds[cpu] = self.open_pipe(cpu)
            except OSError as exc:
                log.debug("tracefs: cpu%d has no ring buffer to read: %s", cpu, exc)
        if not fds:
            raise TraceUnavailable(f"cannot open any per_cpu/cpuN/trace_pipe_raw of {self.path}")
        return fds

    def lost_counts(self, cpus: Iterable[int]) -> dict[int, int | None]:
        """Per CPU, the events lost so far (``overrun`` + ``commit overrun`` + ``dropped
        events`` of ``per_cpu/cpuN/stats``); None where the stats cannot be read."""
        out: dict[int, int | None] = {}
        for cpu in cpus:
            try:
                text = self._text(f"per_cpu/cpu{cpu}/stats")
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
