"""Access sources: how a cycle sees the guest, by tracing its accesses or by polling.

Theory of operation
-------------------
A source answers, once per cycle (``observe``), what the guest did to the
image since the last cycle: the residency of every block, the blocks it
rewrote, and with tracing the blocks it read and those whose pages
refaulted. ``choose`` picks one at start (``--access-source``) and says
which in one log line.

* ``TraceSource`` (``trace``): the kernel's tracepoints, read from a private
  tracefs instance of this image (``system.trace.trace_reader``). Reads of every
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

  The instance is the daemon's, but anyone root can change it: each cycle
  a few of its switches are read (``TraceReader.check_instance``: three
  small files), and a change (events disabled, ``tracing_on`` 0, another
  filter, as ``trace-cmd reset`` does) is set back and said in one warning;
  at each scheduled mincore pass a read of the daemon's own must come back as
  an event (``TraceReader.probe``), else every switch is checked and, if
  none changed, the instance made anew (``make_reader``), or when that fails
  the source goes on with a mincore pass every cycle, the residency standing
  in for the reads. Either way that cycle's residency is evidence of use,
  as after lost events. At start (``choose``) the instances of daemons that
  are gone are removed (``tracefs.sweep``), whatever image they traced.
* ``PollingSource`` (``mincore``, the paper's): residency scanned every
  cycle; writes seen by checksumming a rotating ``checksum_share`` of the
  held bytes (``BlockChecksums``), so the cost stays bounded.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from dataclasses import dataclass, field, replace

import numpy as np

from vmdisktouch.core.access import ADD, READ, AccessLog, EventResidency
from vmdisktouch.core.mrc import Batches, MissRatioCurve
from vmdisktouch.core.shift import ReadShift
from vmdisktouch.core.sparse import Sparse
from vmdisktouch.core.what_if import cache_hit_ratio
from vmdisktouch.errors import ConfigError, VmdtError
from vmdisktouch.system.observe.miss_cost import GuestMisses
from vmdisktouch.system.trace.ringbuf import no_events
from vmdisktouch.system.trace.tracefs import PREFIX   # of every instance (``instance_name``)
from vmdisktouch.unitname import escape_path

log = logging.getLogger("vmdisktouch")

RECONCILE_EVERY = 12          # cycles between mincore passes of the trace source
NAME_LIMIT = 200              # bytes of an instance name (a directory name: at most 255)
WARN_EVERY = 600.0            # seconds: a changed instance warns at most this often
LOST_WARN_EVERY = 60.0        # seconds: lost events warn at most this often (else info)
SIZED_AFTER = 3               # cycles in a row that neither lose events nor grow the trace
                              # buffer end its sizing at start (``TraceSource.sizing``)


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
    misses: tuple[int, int] | None = None   # trace: the guest's reads that waited for a
                                 # page added, ns waited and how many (None: not timed)


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

    cold = False                 # no evidence to act on sooner: loads stay paced

    def pump(self, *, between: bool = False) -> bool:
        return False

    def settled(self, held: np.ndarray) -> None:
        pass

    def resize(self, nblocks: int) -> None:
        self.sums.resize(nblocks)

    def brace(self, held: np.ndarray, unlocked_bytes: int) -> None:
        pass

    def cached(self, runs) -> None:
        pass                     # the next cycle's mincore pass sees what the spill read

    def status(self) -> dict:
        return {"access_source": self.name, "events_lost": 0, "curve": None, "gain": None,
                "mrc": {"none": "the mincore source sees no reads one by one, so no reuse "
                                "distances: the trace source gives a curve"}}

    def close(self) -> None:
        self.sums.close()


class TraceSource:
    """The guest's reads, writes and refaults from kernel tracepoints."""

    name = "trace"

    def __init__(self, reader, tracker, block_size: int, nblocks: int, *,
                 page_size: int | None = None, clock_ns=time.monotonic_ns, make_reader=None):
        self.reader = reader                 # None: gone, a mincore pass every cycle
        self.make_reader = make_reader       # a new reader (instance) when it went blind
        self._warned_ns: int | None = None
        self.tracker = tracker
        self.block_size = block_size
        # The unit of the events' page indices: the reader's (``libc.PAGE_SIZE``).
        self.page_size = int(reader.page_size if page_size is None else page_size)
        self.clock_ns = clock_ns
        self.log = AccessLog(block_size, self.page_size)
        self.residency = EventResidency(nblocks, block_size, self.page_size)
        self.cycles = 0
        self.events_lost = 0                 # lost after the start's sizing (warned)
        self.lost_at_start = 0               # lost while the buffer was sized (expected)
        self.sizing = True                   # the buffer is being sized at start (``_sized``)
        self._quiet = 0                      # cycles in a row with no loss and no growth
        self._buffer_kb = getattr(reader, "buffer_kb", 0)
        self._grew = False                   # the last cycle grew the buffer
        self.lost_at: float | None = None    # Unix time of the last cycle that lost events
        self.lost_why: str | None = None     # why, as the reader said
        self._lost_warned_ns: int | None = None   # the last warning of lost events
        self._lost_quiet = 0                 # cycles that lost events since that warning
        self.last: dict = {}
        self.last_access = None              # the last cycle's Access (exact pages: tests)
        self.shift = ReadShift()
        self.nblocks = nblocks
        self.mrc = MissRatioCurve.for_image(nblocks * block_size // self.page_size)
        self._mrc_ns = self._mrc_fed_ns = clock_ns()     # the last cycle's end, last feed
        self._pages_read = 0                 # pages the guest read this cycle
        self._misses = GuestMisses()         # its reads that waited for a page added
        self._batches = Batches()            # READ events -> the ranges read (ring buffer)
        self.gain: dict | None = None        # what memory served in the last cycle
        self._count_reads()
        self.early_cycles = 0                # cycles asked for early by a read shift
        self.kinds = np.zeros(4, dtype=np.int64)   # events drained this cycle, by kind
        self._drained_ns: int | None = None   # the last drain, and the one before it
        self._previous_ns = 0                 # (the first drain: none before, no rate)

    def pump(self, *, between: bool = False) -> bool:
        """Drain the kernel's buffer into the cycle's log. ``between`` cycles, only when
        the buffer may be an eighth full by now at the rate of the last drain: a disk
        the guest reads little is drained once a cycle, not at every pump of a host
        loop serving tens of them. A burst beyond that shows as lost events: that cycle
        reconciles with mincore and the buffer grows (``TraceReader``). A cold disk
        (``ReadShift.cold``) is drained whenever anything is buffered (``pending``: one
        poll), so the guest's first reads start a cycle within a second. Where reads are
        counted in the kernel (``TraceReader.counting``), a pump that leaves the buffer
        takes the counted reads all the same (the counters of the chunks that moved): the
        reads leaving what is held are seen within a second however few events the buffer
        has. A pump that finds nothing pending (``pending``) takes nothing: an idle disk's
        pump is one poll.

        Returns True, between cycles, when the drained reads ask for a cycle now: they
        left the held blocks (``core.shift``)."""
        now = self.clock_ns()
        if self.reader is None:
            return False
        if between and self._drained_ns is not None:
            span = max(self._drained_ns - self._previous_ns, 1)
            expected = self.reader.last_bytes * (now - self._drained_ns) / span
            if expected < self.reader.buffer_kb * 1024 / 8:
                if not self.reader.pending():          # nothing buffered, nothing counted
                    return False
                if not self.shift.cold:                # a cold disk's first reads: drained
                    counted = self.reader.take_counted()
                    if counted is None:
                        return False
                    return self._fold(no_events(), counted) and self.shift.wanted()
        ev = self.reader.drain()
        self._previous_ns = now if self._drained_ns is None else self._drained_ns
        self._drained_ns = now
        return self._fold(ev, ev.counted) and between and self.shift.wanted()

    def _fold(self, ev, counted) -> bool:
        """One drain's events and counted reads into the log, the residency and the read
        shift; True (for ``and``)."""
        self.kinds += np.bincount(ev.kind, minlength=4)[:4]
        blocks, counts = self.log.feed(ev.kind, ev.ts, ev.first, ev.last, ev.lost, counted)
        if counted is not None:
            self.kinds[READ] += counted.total
        self.residency.feed(ev.kind, ev.first, ev.last)
        self.shift.count(blocks, counts)
        now = self.clock_ns()
        seconds, self._mrc_fed_ns = (now - self._mrc_fed_ns) / 1e9, now
        if counted is not None:
            self.mrc.feed_ranges(counted.sampled[:, 0], counted.sampled[:, 1], counted.pages,
                                 counted.samples_lost, seconds)
            self._pages_read += counted.pages
        timed = counted if counted is not None else ev
        self._misses.add(timed)
        if counted is None:
            reads = ev.kind == READ
            first, last = self._batches.ranges(ev.first[reads], ev.last[reads], ev.ts[reads])
            self.mrc.feed_ranges(first, last, seconds=seconds)
            self._pages_read += int((last - first + 1).sum())
        if self.reader is not None:
            self.reader.sample_below(self.mrc.threshold)
        return True

    @property
    def cold(self) -> bool:
        """No scheduled cycle has seen the guest read yet (``ReadShift.cold``)."""
        return self.shift.cold

    def settled(self, held: np.ndarray) -> None:
        """The cycle ended holding ``held`` (per block)."""
        self.early_cycles += self.shift.woke
        self.last["woken_early"] = self.shift.woke
        self.shift.settled(held)

    def quiet(self) -> bool:
        """Whether this cycle has nothing to observe, so the disk may skip it
        (``DiskWatcher.prepare``): the last observation saw no event and lost none, none
        came since (what the pumps folded, then one poll of the ring buffer and of the
        kernel's counters' chunks), and no mincore reconciliation is due. A cycle skipped
        counts toward the next reconciliation, which also checks the tracefs instance: an
        idle disk still runs a full cycle every ``RECONCILE_EVERY``."""
        if (self.reader is None or self.cycles % RECONCILE_EVERY == 0
                or self.last.get("lost") != 0 or any(self.last.get("events", {}).values())
                or self.kinds.any() or self._pages_read or not self.log.empty
                or self.reader.pending()):
            return False
        self.cycles += 1
        return True

    def observe(self, size: int, held: np.ndarray, config) -> Seen:
        first = self.cycles == 0
        scheduled = self.cycles % RECONCILE_EVERY == 0    # the first too
        self.cycles += 1
        probing = scheduled and not first and size > 0 and self.reader is not None
        if probing:
            self.reader.probe()
        self.pump()
        missed = self._check()
        now = self.clock_ns()
        cycle_seconds, self._mrc_ns = (now - self._mrc_ns) / 1e9, now
        self.mrc.decay(cycle_seconds)
        acc = self.last_access = self.log.take(held.size, now_ns=now)
        if self._sized(acc.lost):
            self.events_lost += acc.lost
            if acc.lost:
                self.lost_at, self.lost_why = time.time(), getattr(self.reader, "lost_why", None)
                self._say_lost(acc.lost, now)
        else:
            self.lost_at_start += acc.lost
            if acc.lost:
                log.info("trace: %s: %d events lost in this cycle while the buffer is sized at "
                         "start (%d so far, expected): %s", self.reader.name if self.reader
                         else "-", acc.lost, self.lost_at_start,
                         getattr(self.reader, "lost_why", None) or "why is not known")
        if probing and not missed and acc.lost == 0 and self.reader.probe_seen is False:
            missed = self._unseen()
        elif probing and not missed:     # a pid filter may hide the guest, not the probe
            missed = self._check(full=True)
        missed = missed or self.reader is None
        if missed:       # a changed instance's events are not the guest's: none are used
            none = Sparse.empty()
            acc = replace(acc, reads=none, writes=none, refaults=none, read_counts=none,
                          read_recent=none)
        reconcile = acc.lost > 0 or scheduled or missed
        if reconcile:
            res = self.tracker.scan(size, known=held)    # held: mlocked, all cached
            self.residency.reconcile(res.fraction())
        else:
            # The daemon's own loads are not traced: a held block is all cached.
            self.residency.counts[held] = self.residency.pages_per_block
        kinds, self.kinds = self.kinds, np.zeros(4, dtype=np.int64)
        misses = self._misses.take()
        timed = self.reader is not None and self.reader.times_misses and not missed
        self.gain = self._gain(acc, kinds, held, cycle_seconds)
        self.last = {"reads": acc.read_events, "written_pages": int(acc.write_pages.size),
                     "refaulted_pages": acc.refault_pages, "lost": acc.lost,
                     "reconciled": bool(reconcile),
                     "events": dict(zip(("read", "write", "add", "delete"),
                                        map(int, kinds)))}
        return Seen(self.residency.fraction(), self.residency.resident_pages() * self.page_size,
                    acc.writes, reads=acc.reads, refaults=acc.refaults,
                    read_counts=acc.read_counts, read_recent=acc.read_recent,
                    # Not the first cycle's scan: what a dd or a backup left cached is no
                    # evidence of use; under a shared budget it took budget from disks the
                    # guests read. The trace source waits for reads.
                    reconcile=acc.lost > 0 or missed, misses=misses if timed else None)

    def _sized(self, lost: int) -> bool:
        """Whether this cycle's lost events are steady ones (counted in ``events_lost`` and
        warned), not the start's. At start the buffer grows from its first size to what
        the guest's rate needs, losing events on the way (an overrun before each doubling,
        and what each resize drops). The start's sizing lasts until ``SIZED_AFTER``
        cycles in a row neither lose events nor grow the buffer; a cycle that loses events
        with no growth in it or the cycle before (the buffer at its largest, or a loss the
        growth does not explain) ends it too, and is steady."""
        kb = getattr(self.reader, "buffer_kb", self._buffer_kb)    # no reader: unchanged
        grew, self._buffer_kb = kb > self._buffer_kb, kb
        grew_before, self._grew = self._grew, grew
        if not self.sizing:
            return True
        if lost and not (grew or grew_before):
            self._end_sizing()
            return True
        self._quiet = 0 if lost or grew else self._quiet + 1
        if self._quiet >= SIZED_AFTER:
            self._end_sizing()
        return False

    def _end_sizing(self) -> None:
        self.sizing = False
        if self.lost_at_start:
            log.info("trace: %s: the buffer is sized (%d KiB per CPU); %d events were lost "
                     "while it grew at start (expected; not counted in events_lost)",
                     self.reader.name if self.reader else "-", self._buffer_kb,
                     self.lost_at_start)

    def _say_lost(self, lost: int, now: int) -> None:
        """A warning for a cycle that lost events, at most one each ``LOST_WARN_EVERY``
        seconds (the cycles between at INFO, counted in the next warning), since a busy
        guest may lose some every cycle and the log must not be a line a cycle of them."""
        quiet = self._lost_warned_ns is not None and \
            now - self._lost_warned_ns < LOST_WARN_EVERY * 1e9
        since = (f"; {self._lost_quiet} cycles since the last warning lost events too"
                 if self._lost_quiet and not quiet else "")
        log.log(logging.INFO if quiet else logging.WARNING,
                "trace: %s: %d events lost in this cycle (%d since start%s): %s; this cycle's "
                "residency taken from a mincore pass", self.reader.name if self.reader else
                "-", lost, self.events_lost, since, self.lost_why or "why is not known")
        if quiet:
            self._lost_quiet += 1
        else:
            self._lost_warned_ns, self._lost_quiet = now, 0

    def _gain(self, acc, kinds, held: np.ndarray, seconds: float) -> dict:
        """What memory served the guest in the cycle, and what a GiB more would (the
        curve): the share of the pages read that needed no page added to the cache (an
        add also comes from readahead: a lower bound), the share of the read events on
        held blocks and their rate, the curve's next GiB and what it wants."""
        pages, self._pages_read = self._pages_read, 0
        seconds = max(seconds, 1e-3)
        rc = acc.read_counts
        on_held = rc.blocks < held.size
        held_reads = float(rc.values[on_held][held[rc.blocks[on_held]]].sum())
        events = float(rc.values.sum())
        held_bytes = int(held.sum()) * self.block_size
        image = self.nblocks * self.block_size
        per_second = pages / seconds
        return {"pages_read_per_second": round(per_second, 1),
                "cache_hit_ratio": (None if not pages
                                    else round(cache_hit_ratio(pages, kinds[ADD]), 4)),
                "held_read_share": round(held_reads / events, 4) if events else None,
                "held_reads_per_second": round(held_reads / seconds, 1),
                "next_gib": self.mrc.next_gib(held_bytes, self.page_size, per_second),
                "wants_bytes": self.mrc.wants(image, self.page_size)}

    # -- the instance changed under us -----------------------------------------------

    def _check(self, full: bool = False, why: str = "") -> bool:
        """A few of the instance's switches (every one with ``full``): True when something
        outside had changed them (set back now, said with ``why`` first), or they cannot be
        set back (the instance made anew, or tracing given up)."""
        if self.reader is None:
            return False
        try:
            changed = self.reader.check_instance(full)
        except VmdtError as exc:
            self._remake(f"{why}its tracefs instance cannot be set back ({exc})")
            return True
        if changed:
            self._warn("trace: %s: %sthe tracefs instance was changed from outside (%s); set "
                       "back, this cycle's evidence of use taken from the page cache",
                       self.reader.name, why,
                       ", ".join(f"{k} was {v!r}" for k, v in changed.items()))
        return bool(changed)

    def _unseen(self) -> bool:
        """The probe's read did not come back: a switch changed, else the instance is
        blind some other way and is made anew; else tracing is given up. True."""
        why = "a read of the image's did not come back as an event"
        if self._check(full=True, why=why + ": ") or self.reader is None:
            return True
        self._remake(why + ", though its switches are as set (changed from outside?)")
        return True

    def _remake(self, why: str) -> None:
        """The instance made anew (its name is the new one's), said once; else given up."""
        old = self.reader
        old.close()
        self.reader = None
        if self.make_reader is None:
            return self._lose(why, old.name)
        try:
            self.reader = self.make_reader()
        except VmdtError as exc:
            return self._lose(f"{why}, and a new instance cannot be made: {exc}", old.name)
        self._count_reads()
        self._warn("trace: %s: %s; the instance was made anew, this cycle's evidence of use "
                   "taken from the page cache", old.name, why)

    def _lose(self, why: str, name: str = "") -> None:
        """Tracing given up: its instance removed, a mincore pass every cycle from now on."""
        name = name or self.reader.name
        if self.reader is not None:
            self.reader.close()
            self.reader = None
        log.warning("trace: %s: %s; from now on a mincore pass every cycle stands in for the "
                    "reads (writes are not seen; restart the daemon to trace again)", name, why)

    def _warn(self, fmt: str, *args) -> None:
        """A warning, or an INFO line within ``WARN_EVERY`` seconds of the last one."""
        now = self.clock_ns()
        quiet = self._warned_ns is not None and now - self._warned_ns < WARN_EVERY * 1e9
        log.log(logging.INFO if quiet else logging.WARNING, fmt, *args)
        if not quiet:
            self._warned_ns = now

    def taken(self, blocks: np.ndarray, size: int) -> None:
        pass

    def cached(self, runs) -> None:
        """Block runs the daemon's own thread cached whole (the spill): its additions are
        not traced, so their residency is set here, as a held block's is; every page the
        kernel deletes from them later is seen."""
        ppb = self.residency.pages_per_block
        for a, b in runs:
            self.residency.counts[a:b] = ppb

    def brace(self, held: np.ndarray, unlocked_bytes: int) -> None:
        """The buffer sized for the deletes that can come at once: one fadvise DONTNEED
        (QEMU's of an arriving VM's image, a backup's) deletes every cached page not held,
        in one call on one CPU, faster than any drain: the events were lost. ``unlocked_bytes``: what
        the daemon cached without holding it (the spill), whose adds are never traced."""
        if self.reader is not None:
            counts = self.residency.counts[:held.size]
            unheld = int(counts[~held[:counts.size]].sum())
            self.reader.reserve(unheld + unlocked_bytes // self.page_size)

    def resize(self, nblocks: int) -> None:
        self.residency.resize(nblocks)
        self.nblocks = nblocks
        self._count_reads()

    def _count_reads(self) -> None:
        """Reads counted per block in the kernel where it allows (``TraceReader.count_reads``):
        the cost of a read no longer the daemon's."""
        if self.reader is not None:
            self.reader.sample_below(self.mrc.threshold)
            self.reader.count_reads(self.log.pages_per_block, self.nblocks)

    def status(self) -> dict:
        r = self.reader
        return {"access_source": self.name, "events_lost": self.events_lost,
                "trace": {"instance": r and r.name, "target": r and r.target,
                          "buffer_kb": r.buffer_kb if r else 0,
                          "reads_counted_in_kernel": bool(r and r.counting),
                          "early_cycles": self.early_cycles, "lost_at": self.lost_at,
                          "lost_why": self.lost_why, "lost_at_start": self.lost_at_start,
                          "sizing": self.sizing,
                          **self.last},
                **self.mrc.status(self.nblocks * self.block_size, self.page_size),
                "gain": self.gain}

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()


def instance_name(path: str) -> str:
    """The trace instance of the daemon of ``path``: named after its unit instance."""
    name = PREFIX + escape_path(path)
    if len(name.encode()) > NAME_LIMIT:
        digest = hashlib.sha256(name.encode()).hexdigest()[:16]
        name = name.encode()[:NAME_LIMIT - 17].decode(errors="ignore") + "-" + digest
    return name


def choose(image, config, tracker, make_sums, nblocks: int, foreseen_bytes: int = 0):
    """The source ``config.access_source`` asks for; ``auto`` falls back to polling.

    ``make_sums()`` makes the checksums (a descriptor of their own), for polling only.
    The trace buffer is sized when it is made, before its events are enabled, for the
    deletes ``brace`` would size it for after the first cycle: one per page of the image
    cached now, and per page of ``foreseen_bytes`` (``restored_spill``); sized later,
    while it records, the resize would drop events uncounted (``TraceReader``).
    """
    want = config.access_source
    if want != "mincore":
        from vmdisktouch.system.trace import trace_reader
        sweep_instances()
        tid, name = threading.get_native_id(), instance_name(image.path)

        def make_reader(foreseen: int = 0):
            return trace_reader.TraceReader(image.fd, name=name, exclude_tid=tid,
                                            foreseen=foreseen)
        try:
            now = tracker.scan(image.size)
            reader = make_reader(now.resident_pages + foreseen_bytes // now.page_size)
        except trace_reader.TraceUnavailable as exc:
            if want == "trace":
                raise ConfigError(f"access_source trace: tracing is not usable: {exc}") from None
            log.warning("access source: mincore (tracing is not usable: %s); checksums of "
                        "%.3g of the held bytes per cycle", exc, config.checksum_share)
        else:
            log.info("access source: trace (%s, tracefs instance %s)", reader.target,
                     reader.name)
            try:
                return TraceSource(reader, tracker, config.block_size, nblocks,
                                   make_reader=make_reader)
            except BaseException:
                reader.close()               # never an instance left behind
                raise
    else:
        log.info("access source: mincore (as configured); checksums of %.3g of the held "
                 "bytes per cycle", config.checksum_share)
    return PollingSource(tracker, make_sums())


def restored_spill(config, size: int) -> int:
    """Bytes a restored heat's first selection may spill at once (``spill`` x ``max_hold``,
    at most the image), cached unlocked and so deleted in one burst by a cache drop: the
    trace buffer is sized for them when it is made (``choose``)."""
    return min(int(size), int(config.spill * config.max_hold))


def sweep_instances() -> list[str]:
    """Remove the trace instances of daemons that are gone (``tracefs.sweep``: each one
    logged), whatever image they traced: a killed daemon's costs every I/O on its inode."""
    from vmdisktouch.system.trace import tracefs
    try:
        root = tracefs.find_root()
    except tracefs.TraceUnavailable:
        return []                            # said by the reader's refusal
    return tracefs.sweep(root, PREFIX, time.time())
