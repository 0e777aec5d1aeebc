"""Exact reads, writes, cache insertions and evictions of one disk image, from tracepoints.

Theory of operation. ``TraceReader(fd, name=...)`` makes a private tracefs
instance (``tracefs.Instance``) recording four tracepoints, filtered in the
kernel down to the image's page cache:

* ``filemap:mm_filemap_get_pages``: READ, pages ``index`` .. ``last_index``;
* ``writeback:writeback_dirty_folio``: WRITE, page ``index``;
* ``filemap:mm_filemap_add_to_page_cache``: ADD, ``index`` .. ``index + 2**order - 1``;
* ``filemap:mm_filemap_delete_from_page_cache``: DELETE, the same.

What the kernel reports (6.18, checked by the system tests): a READ per
batch of folios a read returns, so a cold long read repeats its tail
(``0-255, 4-255, 80-255``); a WRITE when a clean folio turns dirty (again
after each O_DSYNC write; once for rewrites of a page still dirty) naming the
folio's FIRST page only: a 16 KiB write into uncached pages made one 4-page
folio and one WRITE of its first page (its ADD gives the extent).

The page cache of a regular file is its inode's, so the filters are
``i_ino == st_ino && s_dev == <kernel dev_t of st_dev>``. A block device's
(a loop device, an LVM volume) is the inode of the kernel's internal bdev file
system, whose number is the device's kernel dev_t (``major << 20 | minor``):
the filter starts on ``i_ino`` alone and takes the ``s_dev`` of the first
event seen. Neither is trusted: the start makes one buffered read of page 0
(``pread``, never a write) and refuses with ``TraceUnavailable`` unless a READ
of page 0 came back, which also catches overlayfs, FUSE and the like. Then the
daemon's own loading thread (``exclude_tid``) is filtered out of READ and ADD,
not of DELETE (an eviction runs in whichever task reclaims).

The writeback event has no ``s_dev``: its filter is ``ino == st_ino && name ==
"MAJ:MIN"``, ``name`` being the bdi the kernel names (``bdi.name_of``: the whole
disk under the file system, or under the block device). Where sysfs does not
tell the bdi (CIFS, Ceph, 9p: a bdi named ``TYPE-N``) the filter is ``ino``
alone, said in the start's INFO line: the start cannot learn a bdi name (it
never writes), so a write to the same inode number on another file system is
then taken for the image's. (btrfs and tmpfs are refused at the start: the
READ of page 0 never comes back, on btrfs for its ``st_dev`` is not ``s_dev``.)

``drain()`` reads every CPU's ``trace_pipe_raw`` without blocking (one page
per read, until EAGAIN), parses the pages (``ringbuf``) and returns the
events sorted by time, CLOCK_MONOTONIC ns (``trace_clock`` ``mono``).
Lost events are counted twice by the kernel, as the per-CPU ``overrun``
counters and as the "missed events" of the next page read; per CPU the
larger of the two running totals is taken, so nothing is counted twice.
When events were lost the buffer doubles, up to ``max_buffer_kb``; so it does
when one CPU's drain found it half full, before the next burst overflows it.
``reserve(events)`` grows it ahead of a burst the caller foresees. A resize
while the instance records drops what is recorded meanwhile (6.18: 15-30 ms
of events, whatever the sizes) and no counter shows it: the last drain's rate
times the resize's time is added to the next drain's ``lost``, as
``direct_io`` does. So what a start foresees (``foreseen``: a restored
state's spill, the image's cached pages) sizes the buffer when the instance
is made, before its events are enabled, where nothing is lost; ``lost_why``
says why the last drain lost events.
``pending()`` tells, without reading, whether a ``drain`` has anything to give:
one poll(2) of every CPU's ``trace_pipe_raw`` with timeout 0, which says
readable as soon as that CPU holds one event because ``tracefs.Instance``
sets the instance's ``buffer_percent`` to 0 (where it could not, ``pending()``
is always True; set otherwise from outside, ``check_instance`` sets it back
with the other switches).

A read that waited for a page its thread added (a miss) is timed from that
insertion to the read's event, which the kernel emits once the read's pages
are up to date: in the kernel where reads are counted there
(``bpf_reads.added_program``), else from the events (``paired_misses``, the
same rule: a READ whose first page lies in the thread's first ADD since its
READ before; a thread's ADD still open at the end of a drain is carried to the
next, for a long wait spans drains: without it, behind a throttle of 400 reads
a second, the figure was 0.75 x the guest's). Each drain carries them (``Events.miss_wait_ns`` and
``misses_timed``, or the same of ``CountedReads``), for the miss cost
(``observe.miss_cost``).

``count_reads(pages_per_block, nblocks)`` (the trace source calls it at start
and when the image's size changes) moves the reads out of the ring buffer:
``bpf_reads`` counts them per block in the kernel, the READ event of the
instance is turned off, and every ``drain`` returns the counts since the
last one as ``Events.counted`` (with the drain's time); READs the ring buffer
recorded after the switch are dropped, so none counts twice. The probe is
then told by its own thread id, counted apart. Where eBPF is refused
(``counting_refused`` says why, once, in an INFO line) reads stay events.

Something outside may change the instance under us (``echo 0 >
events/enable``, ``tracing_on``, a filter, as ``trace-cmd reset`` does):
``check_instance()`` reads ``tracing_on`` and one event's ``enable``,
``filter`` and ``trigger`` each call, in turn (four small reads), and on a
change reads every switch (the triggers, ``tracing_cpumask`` and the pid
filters included) and sets back what changed (``tracefs.Instance.restore``;
what cannot be set back makes the instance anew). A ``probe()`` checks the
whole path as well: a read of page 0 from a thread of its own, whose READ
the next ``drain`` must bring back (``probe_seen``; taken out of the
events); every scheduled pass also checks every switch, because a guest's
pid in ``set_event_notrace_pid`` hides the guest's reads, not the probe's.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import select
import stat
import threading
import time

import numpy as np

from vmdisktouch.errors import ClosedError, SyscallError, VmdtError, file_kind
from vmdisktouch.system.trace import bdi, bpf_reads, ringbuf, tracefs
from vmdisktouch.system import files, libc
from vmdisktouch.system.trace.bdi import kernel_dev
from vmdisktouch.system.trace.ringbuf import CountedReads, Events, concat_events, no_events
from vmdisktouch.system.trace.tracefs import TraceUnavailable

log = logging.getLogger("vmdisktouch")

READ, WRITE, ADD, DELETE = 0, 1, 2, 3
GET_PAGES = "filemap/mm_filemap_get_pages"
DIRTY = "writeback/writeback_dirty_folio"
ADDED = "filemap/mm_filemap_add_to_page_cache"
DELETED = "filemap/mm_filemap_delete_from_page_cache"
KINDS = {GET_PAGES: READ, DIRTY: WRITE, ADDED: ADD, DELETED: DELETE}
CONFIRM_TRIES = 5
RESERVE_KB = 16384     # the most ``reserve`` sizes the buffer to, per CPU (each CPU gets it)

__all__ = ["ADD", "DELETE", "Events", "READ", "TraceReader", "TraceUnavailable", "WRITE",
           "kernel_dev"]


class TraceReader:
    """The page-cache events of the image open as ``fd`` (module docstring)."""

    def __init__(self, fd: int, *, name: str, buffer_kb: int = 1024, max_buffer_kb: int = 65536,
                 exclude_tid: int | None = None, root: str | None = None, foreseen: int = 0):
        self.name = name
        self.page_size = libc.PAGE_SIZE    # the unit of the events' page indices
        self.buffer_kb = int(buffer_kb)
        self.max_buffer_kb = max(int(max_buffer_kb), self.buffer_kb)
        self._blind = 0                    # events a resize lost, estimated (``_grow``)
        self._overflowed = 0               # of a drain's lost, those the kernel counted
        self._rate = 0.0                   # events a ns at the last drain
        self._collected_ns = time.monotonic_ns()
        self.lost_why: str | None = None   # why the last drain lost events
        self.exclude_tid = exclude_tid
        self._fds: dict[int, int] = {}
        self._closed = False
        self._fd, self._turn, self._probe_tid = fd, 0, None
        self._open = NO_OPEN                  # ADDs whose read may come in the next drain
        self._counter: bpf_reads.ReadCounter | None = None   # ``count_reads``
        self._counted: list[tuple] = []     # a replaced counter's last counts and samples
        self._sample_threshold = 0          # ``sample_below``
        self._ring_reads_until: int | None = None   # READs of the ring after this: counted
        self.counting_refused: str | None = None    # why reads cannot be counted in the kernel
        self.probe_seen: bool | None = None    # the last probe came back (None: none made)
        self._path = _fd_path(fd)
        try:
            st = files.fstat(fd)
        except SyscallError as exc:
            raise TraceUnavailable(f"{self._path}: {exc}") from None
        if stat.S_ISREG(st.st_mode) and st.st_size == 0:
            raise TraceUnavailable(f"{self._path} is empty: no read can confirm its inode")
        if stat.S_ISREG(st.st_mode):
            self._ino, self._sdev = st.st_ino, kernel_dev(st.st_dev)
        elif stat.S_ISBLK(st.st_mode):
            self._ino, self._sdev = kernel_dev(st.st_rdev), None
        else:
            raise TraceUnavailable(f"{self._path} is {file_kind(st.st_mode)}: page-cache "
                                   "tracepoints serve regular files and block devices")
        self._block, self._rdev = stat.S_ISBLK(st.st_mode), st.st_rdev
        self.bdi = bdi.name_of(st)     # what the writeback event names (None: not known)
        self.target = self._describe()
        root = tracefs.find_root() if root is None else root
        self.buffer_kb = max(self.buffer_kb, _foreseen_kb(root, foreseen))   # before enabled
        self.max_buffer_kb = max(self.max_buffer_kb, self.buffer_kb)
        self._inst = tracefs.Instance.create(name, self._filters(exclude=False),
                                             buffer_kb=self.buffer_kb, root=root)
        try:
            self._setup()
            self._confirm(fd)
            if exclude_tid is not None:
                self._apply_filters()
        except BaseException:
            self.close()
            raise

    # -- setup -------------------------------------------------------------------------

    def _describe(self) -> str:
        sdev = "" if self._sdev is None else f"{self._sdev >> 20}:{self._sdev & 0xFFFFF}"
        if self._block:
            on = f" on {sdev}" if sdev else ""
            return (f"block device {os.major(self._rdev)}:{os.minor(self._rdev)} "
                    f"(bdev inode {self._ino:#x}{on})")
        return f"inode {self._ino} on {sdev}"

    def _filters(self, *, exclude: bool) -> dict[str, str]:
        match = f"i_ino == {self._ino}"
        if self._sdev is not None:
            match += f" && s_dev == {self._sdev}"
        mine = f" && common_pid != {self.exclude_tid}" if exclude and \
            self.exclude_tid is not None else ""
        dirty = f"ino == {self._ino}" + (f' && name == "{self.bdi}"' if self.bdi else "")
        return {GET_PAGES: match + mine, DIRTY: dirty, ADDED: match + mine, DELETED: match}

    def _apply_filters(self) -> None:
        for event, expr in self._filters(exclude=True).items():
            self._inst.set_filter(event, expr)

    def _setup(self) -> None:
        inst = self._inst
        try:
            self._layout = ringbuf.parse_layout(inst.header_page(), inst.header_event(),
                                                inst.subbuf_bytes())
            self._formats = {ev: ringbuf.parse_format(inst.format_text(ev)) for ev in KINDS}
        except (ValueError, KeyError) as exc:
            raise TraceUnavailable(f"cannot read the ring buffer's layout in {inst.path}: "
                                   f"{exc}") from None
        for ev, need in ((GET_PAGES, ("index", "last_index", "s_dev")), (DIRTY, ("index",)),
                         (ADDED, ("index", "order")), (DELETED, ("index", "order"))):
            missing = [f for f in need + ("common_type", "common_pid")
                       if f not in self._formats[ev].fields]
            if missing:
                raise TraceUnavailable(f"tracepoint {ev} has no field {missing[0]} on this "
                                       f"kernel ({os.uname().release})")
        self._by_id = {fmt.id: (KINDS[ev], fmt) for ev, fmt in self._formats.items()}
        self._fds = inst.open_pipes()
        self._poll = select.poll()        # ``pending``: one poll(2) of every pipe
        for fd in self._fds.values():
            self._poll.register(fd, select.POLLIN)
        self._stats_base = inst.lost_counts(self._fds)
        self._pages_missed = dict.fromkeys(self._fds, 0)
        self._lost_seen = dict.fromkeys(self._fds, 0)
        self._pending: list[Events] = []     # collected at the start, for the first drain
        self.last_bytes = 0      # the most bytes one CPU gave at the last drain

    def _confirm(self, fd: int) -> None:
        """One buffered read of page 0 must come back as a READ of page 0 of this inode."""
        me = threading.get_native_id()
        for _ in range(CONFIRM_TRIES):
            try:
                files.pread(fd, self.page_size, 0)
            except SyscallError as exc:
                raise TraceUnavailable(f"cannot read page 0 of {self._path}: {exc}") from None
            events, sdev = self._collect_apart(me)
            self._pending.append(events)
            if sdev is not None:
                if self._sdev is None:
                    self._sdev = sdev
                    self.target = self._describe()
                    self._apply_filters()
                log.info("trace: %s: reads of %s seen on %s; writes told by %s", self.name,
                         self._path, self.target, f"bdi {self.bdi}" if self.bdi else
                         "inode number alone (its bdi has no name in sysfs)")
                return
        raise TraceUnavailable(f"tracepoints do not see reads of {self._path}: the page cache "
                               f"of {self._path} is not on {self.target} (overlayfs, FUSE, "
                               "O_DIRECT?)")

    def _collect_apart(self, tid: int) -> tuple[Events, int | None]:
        """Collect, the READ and ADD events of thread ``tid`` taken out; and the ``s_dev``
        of its READ of page 0 (None: none came)."""
        events, sources = self._collect()
        pid, sdev = sources.field("common_pid"), sources.field("s_dev")
        own = (pid == tid) & ((events.kind == READ) | (events.kind == ADD))
        hit = np.flatnonzero(own & (events.kind == READ) & (events.first == 0))
        keep = ~own
        return (Events(events.kind[keep], events.ts[keep], events.first[keep],
                       events.last[keep], events.lost), int(sdev[hit[0]]) if hit.size else None)

    # -- reads counted in the kernel ---------------------------------------------------

    def count_reads(self, pages_per_block: int, nblocks: int) -> bool:
        """From now, count the reads per block of ``pages_per_block`` pages in the kernel
        (``bpf_reads``), ``nblocks`` of them, and record them no more in the ring buffer:
        a drain's reads are then ``Events.counted``, whatever their rate. Called again
        when the image's size changes. False, said once, where the kernel or the
        daemon's privileges refuse it: reads stay events of the ring buffer."""
        self._check_open()
        if self.counting_refused is not None:
            return False
        fmt, add = self._formats[GET_PAGES], self._formats[ADDED]
        offsets = {k: fmt.fields[k].offset for k in ("i_ino", "s_dev", "index", "last_index")}
        added = (add.id, {k: add.fields[k].offset for k in ("i_ino", "s_dev", "index", "order")})
        start = time.monotonic_ns()
        try:
            new = bpf_reads.ReadCounter.create(
                fmt.id, offsets, ino=self._ino, sdev=self._sdev, exclude_tid=self.exclude_tid,
                pages_per_block=pages_per_block, nblocks=nblocks, added=added)
        except bpf_reads.BpfUnavailable as exc:
            self.counting_refused = str(exc)
            log.info("trace: %s: reads are recorded one by one (they cannot be counted in the "
                     "kernel: %s)", self.name, exc)
            return False
        old, self._counter = self._counter, new
        new.sample_below(self._sample_threshold)
        if old is not None:
            blocks, counts, _probe, _beyond = old.take()
            ranges, total, lost = old.take_samples()
            self._counted.append((*old.past_span(blocks, counts, ranges), ranges, total, lost,
                                  *old.take_misses()))
            old.close()
        else:
            self._ring_reads_until = start
            self._inst.drop(GET_PAGES)
        return True

    @property
    def times_misses(self) -> bool:
        """The reads that waited for a page added are timed: in the kernel with
        ``count_reads`` (``bpf_reads.added_program``), else from the events
        (``paired_misses``)."""
        return self._counter is None or self._counter.times_misses

    @property
    def counting(self) -> bool:
        """Reads are counted in the kernel (``count_reads``)."""
        return self._counter is not None

    def take_counted(self) -> CountedReads | None:
        """The reads counted in the kernel since the last take (``drain`` takes them too),
        the ring buffer left alone: a copy of the counters. None where reads are events.
        A probe made since (``probe``) is settled here, as by ``drain``."""
        self._check_open()
        if self._counter is None:
            return None
        blocks, counts, probe_hits, _beyond = self._counter.take()
        if self._probe_tid is not None:
            self._counter.set_probe(None)
            self._probe_tid, self.probe_seen = None, probe_hits > 0
        ranges, total, lost = self._counter.take_samples()
        blocks, counts = self._counter.past_span(blocks, counts, ranges)
        now = (blocks, counts, ranges, total, lost, *self._counter.take_misses())
        parts, self._counted = self._counted + [now], []
        if len(parts) > 1:
            allb = np.concatenate([p[0] for p in parts])
            allc = np.concatenate([p[1] for p in parts])
            blocks, inverse = np.unique(allb, return_inverse=True)
            counts = np.bincount(inverse, weights=allc).astype(np.int64)
        return CountedReads(blocks, counts, time.monotonic_ns(),
                            np.concatenate([p[2] for p in parts]),
                            sum(p[3] for p in parts), sum(p[4] for p in parts),
                            sum(p[5] for p in parts), sum(p[6] for p in parts))

    def sample_below(self, threshold: int) -> None:
        """The kernel samples for the miss-ratio curve the pages whose hash is under
        ``threshold`` (``core.mrc``; 0, the start: none)."""
        self._sample_threshold = int(threshold)
        if self._counter is not None:
            self._counter.sample_below(threshold)

    # -- the instance, as set up -------------------------------------------------------

    def check_instance(self, full: bool = False) -> dict[str, str]:
        """Whether the instance is as it was set up (module docstring; ``full``: every
        switch now): what had changed and was set back (control file -> what it read),
        or {}. ``TraceUnavailable`` when it cannot be set back."""
        self._turn += 1
        return self._inst.check(self._turn, full)

    def probe(self) -> None:
        """Read page 0 from a thread of its own: the next ``drain`` sets ``probe_seen``."""
        tid: list[int] = []

        def read() -> None:
            try:
                if self._counter is not None:
                    self._counter.set_probe(threading.get_native_id())
                files.pread(self._fd, self.page_size, 0)
                tid.append(threading.get_native_id())
            except SyscallError as exc:
                if self._counter is not None:
                    self._counter.set_probe(None)
                log.debug("trace: %s: the probe's read failed: %s", self.name, exc)
        t = threading.Thread(target=read, name="vmdisktouch-trace-probe", daemon=True)
        t.start()
        t.join()
        self._probe_tid, self.probe_seen = (tid[0] if tid else None), None

    # -- reading -----------------------------------------------------------------------

    def _read_pages(self, cpu: int, fd: int) -> bytes:
        """Every page buffered now on ``cpu`` (non-blocking), one page per read, at most
        the buffer's size and a little more (what arrives meanwhile waits for the next)."""
        size = self._layout.page_bytes
        pages: list[bytes] = []
        for _ in range(self.buffer_kb * 1024 // size + 64):
            try:
                page = os.read(fd, size)
            except BlockingIOError:
                break
            except OSError as exc:
                log.warning("trace: %s: reading cpu%d: %s", self.name, cpu, os.strerror(exc.errno))
                break
            if not page:
                break
            pages.append(page if len(page) == size else page + bytes(size - len(page)))
        return b"".join(pages)

    def _decode(self, recs: ringbuf.Records):
        """Records -> Events, one part per event kind; and where each part came from
        (``Sources.picks``)."""
        any_fmt = next(iter(self._formats.values()))
        types = recs.field(any_fmt.fields["common_type"])
        parts, picks = [], []
        for ident, (kind, fmt) in self._by_id.items():
            which = np.flatnonzero(types == ident)
            if which.size == 0:
                continue
            f = fmt.fields
            first = recs.field(f["index"], which).astype(np.int64)
            if kind == READ:
                last = recs.field(f["last_index"], which).astype(np.int64)
            elif kind == WRITE:
                last = first.copy()
            else:
                last = first + (np.int64(1) << recs.field(f["order"], which).astype(np.int64)) - 1
            parts.append(Events(np.full(which.size, kind, dtype=np.uint8), recs.ts[which],
                                first, last, 0))
            picks.append((recs, fmt, which))
        return parts, picks

    def _collect(self) -> tuple[Events, Sources]:
        """Read and decode all CPUs; account lost events. Returns Events, in time order,
        and their ``Sources``: a field only some drains need is read by those alone."""
        parts, picks = [], []
        self.last_bytes = 0
        for cpu, fd in self._fds.items():
            data = self._read_pages(cpu, fd)
            self.last_bytes = max(self.last_bytes, len(data))
            if not len(data):
                continue
            recs = ringbuf.parse_pages(data, self._layout)
            if recs.bad_pages:
                log.warning("trace: %s: %d unreadable pages from cpu%d", self.name,
                            recs.bad_pages, cpu)
            self._pages_missed[cpu] += recs.missed + recs.missed_unknown
            got, p = self._decode(recs)
            parts += got
            picks += p
        # Nothing buffered on any CPU: nothing can have been lost since the last look (an
        # overrun leaves a full buffer behind), so the stats files are not read.
        counted = self._account_lost() if self.last_bytes else 0
        lost, blind, self._blind = counted + self._blind, self._blind, 0
        self._overflowed += counted
        if lost:
            self.lost_why = "; ".join(
                ([f"the buffer of {self.buffer_kb} KiB per CPU overflowed"] if counted else [])
                + ([f"about {blind} while it grew (a resize drops what is recorded meanwhile)"]
                   if blind else []))
        now = time.monotonic_ns()
        self._rate = sum(len(p) for p in parts) / max(now - self._collected_ns, 1)
        self._collected_ns = now
        ts, order = ringbuf.time_order(parts)
        return concat_events(parts, lost, (ts, order)), Sources(picks, order)

    def _account_lost(self) -> int:
        stats = self._inst.lost_counts(self._fds)
        lost = 0
        for cpu in self._fds:
            now, base = stats.get(cpu), self._stats_base.get(cpu)
            counted = 0 if now is None or base is None else now - base
            if counted < 0:                     # the buffer was reset under us
                self._stats_base[cpu] = now
                counted = 0
            seen = max(counted, self._pages_missed[cpu], self._lost_seen[cpu])
            lost += seen - self._lost_seen[cpu]
            self._lost_seen[cpu] = seen
        return lost

    def _grow(self, why: str, want_kb: int = 0) -> None:
        """Double the per-CPU buffer, or more to reach ``want_kb``, up to ``max_buffer_kb``."""
        new = ringbuf.grown_kb(self.buffer_kb, want_kb, self.max_buffer_kb)
        if new <= self.buffer_kb:
            return
        try:
            blind = self._inst.grow(new, self._rate)
        except VmdtError as exc:
            log.warning("trace: %s: %s; cannot grow the buffer to %d KiB: %s",
                        self.name, why, new, exc)
            self.max_buffer_kb = self.buffer_kb
            return
        self._blind += blind
        log.info("trace: %s: %s; per-CPU buffer %d -> %d KiB (about %d events lost while it "
                 "grew)", self.name, why, self.buffer_kb, new, blind)
        self.buffer_kb = new

    def reserve(self, events: int) -> None:
        """Grow the per-CPU buffer, before they come, to hold ``events`` events on one CPU
        (at most ``RESERVE_KB``): a burst the caller foresees (``sources``: one fadvise
        DONTNEED deletes every unheld cached page of the image) comes in one system call
        on one CPU, faster than any drain; only the buffer's size keeps it."""
        want_kb = reserve_kb(events, self._formats.values())
        if want_kb > self.buffer_kb:
            self._grow(f"{int(events)} events foreseen", want_kb)

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError(f"trace reader {self.name} used after close()")

    def pending(self) -> bool:
        """Whether ``drain`` now has anything to give: an event buffered on any CPU (one
        poll(2), timeout 0, nothing read), events kept from the start, or a probe to
        settle. Always True where ``buffer_percent`` could not be set to 0.
        ``ClosedError`` after ``close()``, as ``drain``."""
        self._check_open()
        return bool(any(len(e) or e.lost for e in self._pending) or not self._inst.poll_ready
                    or self._probe_tid is not None or self._poll.poll(0)
                    or (self._counter is not None and self._counter.pending()))

    def drain(self) -> Events:
        """Everything buffered now, all CPUs, sorted by time; never blocks."""
        self._check_open()
        misses = (0, 0)
        if self._probe_tid is not None and self._counter is None:
            events, sdev = self._collect_apart(self._probe_tid)
            self._probe_tid, self.probe_seen = None, sdev is not None
        elif self._counter is None:             # reads are events: their misses are paired
            events, sources = self._collect()
            if self._open.ts.size or (events.kind == ADD).any():    # else: no miss to pair
                *misses, self._open = paired_misses(events, sources.field("common_pid"),
                                                    self._open)
        else:
            events, _ = self._collect()
        if self._pending:
            parts, self._pending = self._pending + [events], []
            events = concat_events(parts, sum(p.lost for p in parts))
        if self._ring_reads_until is not None:      # counted from then: not twice
            late = (events.kind == READ) & (events.ts >= self._ring_reads_until)
            if late.any():
                keep = ~late
                events = Events(events.kind[keep], events.ts[keep], events.first[keep],
                                events.last[keep], events.lost)
            self._ring_reads_until = None
        counted = self.take_counted()
        if counted is not None:
            events = dataclasses.replace(events, counted=counted)
        elif misses[1]:
            events = dataclasses.replace(events, miss_wait_ns=misses[0], misses_timed=misses[1])
        overflowed, self._overflowed = self._overflowed, 0
        if overflowed:             # not an estimate of a resize's: a resize is no overflow
            self._grow(f"{overflowed} events lost")
        elif self.last_bytes * 2 >= self.buffer_kb * 1024:
            # Half full at a drain: the next burst a little larger would be lost.
            self._grow(f"{self.last_bytes >> 10} KiB buffered on one CPU at a drain")
        return events

    def close(self) -> None:
        """Close the pipes and remove the instance; idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._counter is not None:
            self._counter.close()
            self._counter = None
        tracefs.close_pipes(self._fds)
        inst = getattr(self, "_inst", None)
        if inst is not None:
            inst.remove()

    def __enter__(self) -> TraceReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@dataclasses.dataclass(frozen=True)
class Sources:
    """Where a drain's events came from: each part's records, its format and the records
    it took (``picks``, in the order the parts were joined), and the ``order`` that put
    them in time order. ``field`` reads one more field of every event, in the events'
    order: the thread only where misses are paired, ``s_dev`` only at the start."""
    picks: list
    order: np.ndarray

    def field(self, name: str) -> np.ndarray:
        """Field ``name`` of each event (-1 where its format has none), int64."""
        cols = [recs.field(fmt.fields[name], which).astype(np.int64) if name in fmt.fields
                else np.full(which.size, -1, dtype=np.int64) for recs, fmt, which in self.picks]
        return np.concatenate(cols)[self.order] if cols else np.zeros(0, np.int64)


@dataclasses.dataclass(frozen=True)
class OpenAdds:
    """Each thread's first ADD since its last READ at the end of a drain (``paired_misses``):
    the read that waits for it may come in the next drain."""
    ts: np.ndarray
    first: np.ndarray
    last: np.ndarray
    pid: np.ndarray


NO_OPEN = OpenAdds(*(np.zeros(0, np.int64) for _ in range(4)))
OPEN_NS = 10_000_000_000   # an ADD no read of its thread followed within this is dropped


def paired_misses(events: Events, pid: np.ndarray,
                  carried: OpenAdds = NO_OPEN) -> tuple[int, int, OpenAdds]:
    """The reads among ``events`` (with each one's thread, ``pid``) that waited for a page
    their thread added since its read before, the rule of ``bpf_reads.added_program``:
    a READ whose first page is within the thread's first ADD since its last READ waited
    from that ADD to itself. ns waited, summed, how many, and the ADDs left open for the
    next drain (``carried`` are the last drain's: a long wait spans drains). A drain
    without an ADD (reads all hits) costs one pass; with them, 0.05-0.1 s a million events
    here (a radix sort by thread and a few passes), where parsing them cost 0.27 s."""
    added = events.kind == ADD
    if not added.any() and not carried.ts.size:
        return 0, 0, NO_OPEN
    mine = np.flatnonzero((events.kind == READ) | added)
    n0 = carried.ts.size                      # the carried ADDs first: they came before
    kind = np.r_[np.full(n0, ADD, np.uint8), events.kind[mine]]
    ts = np.r_[carried.ts, events.ts[mine]]
    first = np.r_[carried.first, events.first[mine]]
    last = np.r_[carried.last, events.last[mine]]
    key = thread = np.r_[carried.pid, pid[mine]]
    if int(key.max()) - int(key.min()) < 1 << 16:
        key = (key - key.min()).astype(np.uint16)    # a radix sort: 1M events in 14 ms
    order = np.argsort(key, kind="stable")           # by thread, in time order within each
    kind, tid = kind[order], key[order]
    starts = np.flatnonzero(np.r_[True, tid[1:] != tid[:-1]])
    group_start = np.repeat(starts, np.diff(np.r_[starts, tid.size]))
    reads = np.flatnonzero(kind == READ)
    before = np.r_[-1, reads[:-1]]
    j = np.maximum(before + 1, group_start[reads])        # the thread's first event since
    ok = j < reads
    ok[ok] = kind[j[ok]] == ADD
    read, add = order[reads[ok]], order[j[ok]]           # an ADD, then the thread's READ
    ok = (first[add] <= first[read]) & (first[read] <= last[add])
    waits = ts[read[ok]] - ts[add[ok]]
    # what stays open: each thread's first event after its last READ, where it is an ADD
    last_read = np.maximum.reduceat(np.where(kind == READ, np.arange(kind.size), -1), starts)
    cand = np.maximum(last_read + 1, starts)
    ends = np.r_[starts[1:], kind.size]
    cand = cand[cand < ends]
    cand = cand[kind[cand] == ADD]
    keep = order[cand]
    keep = keep[ts[keep] >= ts.max() - OPEN_NS]
    left = OpenAdds(ts[keep], first[keep], last[keep], thread[keep]) if keep.size else NO_OPEN
    return int(waits.sum()), int(waits.size), left


def reserve_kb(events: int, formats) -> int:
    """KiB per CPU that hold ``events`` events of ``formats`` on one CPU, at most
    ``RESERVE_KB``."""
    return min(ringbuf.buffer_kb_for(events, formats), RESERVE_KB)


def _foreseen_kb(root: str, events: int) -> int:
    """``reserve_kb`` of ``events`` of the four events, from the formats of the tracefs
    at ``root`` (every instance's are these); 0 for none."""
    if events <= 0:
        return 0
    tracefs.check_events(root, KINDS)      # a missing tracepoint is said as such
    try:
        formats = [ringbuf.parse_format(tracefs.read_text(os.path.join(root, "events", ev,
                                                                         "format")))
                   for ev in KINDS]
    except OSError as exc:
        raise TraceUnavailable(f"cannot read the events' formats in {root}: "
                               f"{os.strerror(exc.errno) if exc.errno else exc}") from None
    except (ValueError, KeyError) as exc:
        raise TraceUnavailable(f"cannot read the events' formats in {root}: {exc}") from None
    return reserve_kb(events, formats)


def _fd_path(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return f"fd {fd}"
