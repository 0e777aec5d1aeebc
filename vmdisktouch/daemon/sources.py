"""Access sources: how a cycle sees the guest, by tracing its accesses or by polling.

Theory of operation
-------------------
A source answers, once per cycle (``observe``), what the guest did to the
image since the last cycle: the residency of every block, the blocks it
rewrote, and with tracing the blocks it read and those whose pages
refaulted. ``choose`` picks one at start (``--access-source``) and says
which in one log line.

* ``TraceSource`` (``trace``): the kernel's tracepoints, read from a private
  tracefs instance of this image (``system.trace_reader``). Reads of every
  block, held ones included, are the heat's evidence; writes are the
  rewritten evidence, exactly, with no checksum pass; a page added soon
  after the kernel deleted it is a refault (``core.access``). Residency is
  kept from the cache's own add and delete events and reconciled with a
  mincore pass (``ResidencyTracker``) every ``RECONCILE_EVERY`` cycles and
  whenever the kernel lost events; a cycle that lost events also takes the
  guest's residency as evidence of use, as polling does, since some of its
  reads were missed. So a lost event is never a lasting error. The events
  are drained between cycles too (``pump``), so the buffer holds about a
  second of them, not a whole cycle's.
* ``PollingSource`` (``mincore``, the paper's): residency scanned every
  cycle; writes seen by checksumming a rotating ``checksum_share`` of the
  held bytes (``BlockChecksums``), so the cost stays bounded.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from vmdisktouch.core.access import READ, AccessLog, EventResidency
from vmdisktouch.core.shift import ReadShift
from vmdisktouch.core.sparse import Sparse
from vmdisktouch.errors import ConfigError
from vmdisktouch.unitname import escape_path

log = logging.getLogger("vmdisktouch")

RECONCILE_EVERY = 12          # cycles between mincore passes of the trace source
NAME_LIMIT = 200              # bytes of an instance name (a directory name: at most 255)


@dataclass(frozen=True)
class Seen:
    """One cycle of the guest, as a source saw it."""
    resident: np.ndarray         # per block: the fraction cached
    resident_bytes: int
    rewritten: Sparse            # the share of each block rewritten
    reads: Sparse | None = None  # trace: blocks read; None: polling
    refaults: Sparse = field(default_factory=Sparse.empty)
    read_counts: Sparse | None = None  # trace: read events per block
    read_recent: Sparse | None = None  # trace: ... weighted by recency (core.access)
    reconcile: bool = False      # trace: events lost, residency stands in for reads


class PollingSource:
    """mincore residency and bounded checksums of the held blocks (the paper's way)."""

    name = "mincore"

    def __init__(self, tracker, sums):
        self.tracker = tracker
        self.sums = sums

    def observe(self, size: int, held: np.ndarray, config) -> Seen:
        res = self.tracker.scan(size)
        held_blocks = np.flatnonzero(held)
        part = self.sums.update(held_blocks, size, skip_unwritten=True,
                                share=config.checksum_share)
        hit = part > 0
        return Seen(res.fraction(), res.resident_pages * res.page_size,
                    Sparse(held_blocks[hit], part[hit]))

    def taken(self, blocks: np.ndarray, size: int) -> None:
        """Blocks just taken into hold: hashed now, so a write before the next cycle counts."""
        self.sums.baseline(blocks, size)

    def pump(self, *, between: bool = False) -> bool:
        return False

    def settled(self, held: np.ndarray) -> None:
        pass

    def resize(self, nblocks: int) -> None:
        self.sums.resize(nblocks)

    def status(self) -> dict:
        return {"access_source": self.name, "events_lost": 0}

    def close(self) -> None:
        self.sums.close()


class TraceSource:
    """The guest's reads, writes and refaults from kernel tracepoints."""

    name = "trace"

    def __init__(self, reader, tracker, block_size: int, nblocks: int, *,
                 page_size: int | None = None, clock_ns=time.monotonic_ns):
        self.reader = reader
        self.tracker = tracker
        self.block_size = block_size
        # The unit of the events' page indices: the reader's (``libc.PAGE_SIZE``).
        self.page_size = int(reader.page_size if page_size is None else page_size)
        self.clock_ns = clock_ns
        self.log = AccessLog(block_size, self.page_size)
        self.residency = EventResidency(nblocks, block_size, self.page_size)
        self.cycles = 0
        self.events_lost = 0
        self.last: dict = {}
        self.last_access = None              # the last cycle's Access (exact pages: tests)
        self.shift = ReadShift(self.log.pages_per_block)
        self.early_cycles = 0                # cycles asked for early by a read shift
        self._drained_ns: int | None = None   # the last drain, and the one before it
        self._previous_ns = 0                 # (the first drain: none before, no rate)

    def pump(self, *, between: bool = False) -> bool:
        """Drain the kernel's buffer into the cycle's log. ``between`` cycles, only when
        the buffer may be an eighth full by now at the rate of the last drain: a disk
        the guest reads little is drained once a cycle, not at every pump of a host
        loop serving tens of them. A burst beyond that shows as lost events: that cycle
        reconciles with mincore and the buffer grows (``TraceReader``).

        Returns True, between cycles, when the drained reads ask for a cycle now: they
        left the held blocks (``core.shift``)."""
        now = self.clock_ns()
        if between and self._drained_ns is not None:
            span = max(self._drained_ns - self._previous_ns, 1)
            expected = self.reader.last_bytes * (now - self._drained_ns) / span
            if expected < self.reader.buffer_kb * 1024 / 8:
                return False
        ev = self.reader.drain()
        self._previous_ns = now if self._drained_ns is None else self._drained_ns
        self._drained_ns = now
        self.log.feed(ev.kind, ev.ts, ev.first, ev.last, ev.lost)
        self.residency.feed(ev.kind, ev.first, ev.last)
        self.shift.count(ev.first[ev.kind == READ])
        return between and self.shift.wanted()

    def settled(self, held: np.ndarray) -> None:
        """The cycle ended holding ``held`` (per block)."""
        self.early_cycles += self.shift.woke
        self.last["woken_early"] = self.shift.woke
        self.shift.settled(held)

    def observe(self, size: int, held: np.ndarray, config) -> Seen:
        self.pump()
        n = held.size
        acc = self.last_access = self.log.take(n, now_ns=self.clock_ns())
        self.events_lost += acc.lost
        first = self.cycles == 0
        reconcile = acc.lost > 0 or self.cycles % RECONCILE_EVERY == 0    # the first too
        self.cycles += 1
        if reconcile:
            res = self.tracker.scan(size, known=held)    # held: mlocked, all cached
            self.residency.reconcile(res.fraction())
        else:
            # The daemon's own loads are not traced: a held block is all cached.
            self.residency.counts[held] = self.residency.pages_per_block
        self.last = {"reads": acc.read_events, "written_pages": int(acc.write_pages.size),
                     "refaulted_pages": acc.refault_pages, "lost": acc.lost,
                     "reconciled": bool(reconcile)}
        return Seen(self.residency.fraction(), self.residency.resident_pages() * self.page_size,
                    acc.writes, reads=acc.reads, refaults=acc.refaults,
                    read_counts=acc.read_counts, read_recent=acc.read_recent,
                    reconcile=first or acc.lost > 0)

    def taken(self, blocks: np.ndarray, size: int) -> None:
        pass

    def resize(self, nblocks: int) -> None:
        self.residency.resize(nblocks)

    def status(self) -> dict:
        return {"access_source": self.name, "events_lost": self.events_lost,
                "trace": {"instance": self.reader.name, "target": self.reader.target,
                          "buffer_kb": self.reader.buffer_kb,
                          "early_cycles": self.early_cycles, **self.last}}

    def close(self) -> None:
        self.reader.close()


def instance_name(path: str) -> str:
    """The trace instance of the daemon of ``path``: named after its unit instance."""
    name = "vmdisktouch@" + escape_path(path)
    if len(name.encode()) > NAME_LIMIT:
        digest = hashlib.sha256(name.encode()).hexdigest()[:16]
        name = name.encode()[:NAME_LIMIT - 17].decode(errors="ignore") + "-" + digest
    return name


def choose(image, config, tracker, make_sums, nblocks: int):
    """The source ``config.access_source`` asks for; ``auto`` falls back to polling.

    ``make_sums()`` makes the checksums (a descriptor of their own), for polling only.
    """
    want = config.access_source
    if want != "mincore":
        from vmdisktouch.system import trace_reader
        try:
            reader = trace_reader.TraceReader(image.fd, name=instance_name(image.path),
                                              exclude_tid=threading.get_native_id())
        except trace_reader.TraceUnavailable as exc:
            if want == "trace":
                raise ConfigError(f"access_source trace: tracing is not usable: {exc}") from None
            log.warning("access source: mincore (tracing is not usable: %s); checksums of "
                        "%.3g of the held bytes per cycle", exc, config.checksum_share)
        else:
            log.info("access source: trace (%s, tracefs instance %s)", reader.target,
                     reader.name)
            return TraceSource(reader, tracker, config.block_size, nblocks)
    else:
        log.info("access source: mincore (as configured); checksums of %.3g of the held "
                 "bytes per cycle", config.checksum_share)
    return PollingSource(tracker, make_sums())

