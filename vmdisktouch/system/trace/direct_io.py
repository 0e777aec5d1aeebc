"""The O_DIRECT reads and writes of one disk image (QEMU ``cache=none``), from tracepoints.

Theory of operation. Direct I/O passes none of ``trace_reader``'s page-cache
tracepoints. ``DirectIOTracer(image, name=...)`` (an open ``Image``) makes a private
tracefs instance (``tracefs.Instance``) recording a submission and a completion event per I/O,
filtered in the kernel, and ``drain()`` pairs them:

* a file on ext4 or xfs (``kind`` "iomap"): ``iomap:iomap_dio_rw_begin`` and
  ``iomap_dio_complete`` on ``dev`` (kernel dev_t of ``st_dev``) and ``ino``,
  from Linux 6.4 (``IOMAP_DIO_SINCE``: commit 3fd41721cd5c "iomap: Add DIO
  tracepoints", pull "iomap: new code for 6.4", 2023-04-29; Debian 12's 6.1
  has none). The completion's ``pos`` is the begin's plus ``ret`` (less for a
  short read at EOF). A sync write has no WRITE in ``ki_flags`` (6.18): a
  begin is a write when the next event of its task is an ``iomap:iomap_iter``
  of flags WRITE|DIRECT at its ``pos`` (the first iteration runs in the
  submitter, before the I/O is sent; an aio completion runs in any task).
  Buffered I/O of the file fires none of them.
* a block device (``kind`` "block"): blk-mq (loop, NVMe, SCSI: ``mq`` in sysfs)
  by ``block:block_rq_issue``/``block_rq_complete``; bio-based (LVM/dm, zram,
  md) by ``block_bio_queue``/``block_bio_complete``: ``bio_endio`` traces the
  bio queued on the device once (BIO_TRACE_COMPLETION) while its requests run
  on the disks below. dm passes on the rest of a bio crossing a target by
  ``bio_trim``, which moves its start, not its end: pairs are keyed by END
  sector and R/W (``rwbs``), offset and length taken from the submission. A
  partition of a blk-mq disk is traced on the disk, filtered to its sectors.
  Checked on 6.18 with loop and zram (no device-mapper in this kernel). An I/O
  beyond the device's limits comes as several requests; buffered I/O of the
  device (misses, writeback) makes requests too, reported alike.

Every completion is an I/O (its offset, length and direction are all in
it), the submission only gives its wait: so only the submissions at 1 in
``latency_every`` (16) of the 4 KiB offsets are traced (a filter on ``pos``,
or ``sector``), halving the events a guest's reads cost the kernel and us,
and the wait is measured on that spatial sample (-1 for the rest). Where
there is no submission, a file's completion tells the direction itself for
aio (``ki_flags`` WRITE, its bit read from the event's print format), and a
synchronous one completes in its submitting task: a write if that task's
event before it is a write iter; a block completion has ``rwbs``.

The start reads 4 KiB at offset 0 with O_DIRECT (never a write, nothing
cached, through ``Image.reopen_direct``: the verified file, ``O_NOATIME`` where
permitted) and refuses (``DirectIOUnavailable``) unless that submission comes
back; what was submitted before is dropped: at a traced offset it completes as
``unpaired``.
``drain()`` reads every CPU's ``trace_pipe_raw`` without blocking, parses the
pages (``ringbuf``) and pairs in numpy (``pair``: sorted by key and time, a
completion takes the submission just before it; several in flight at one key,
a short loop). Completions and iters recorded after the drain began wait for
the next (their submission may be on a CPU read before); unanswered
submissions wait up to ``PENDING_S``. Losses are counted as in
``trace_reader`` and grow the buffer; the kernel drops what is recorded during
a resize (6.18: 20-30 ms of events, whatever the size) without counting it:
``lost`` adds an estimate (the last drain's event rate times the resize).
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import re
import stat
import threading
import time
from dataclasses import dataclass

import numpy as np

from vmdisktouch.errors import ClosedError, ImageError, SyscallError, file_kind
from vmdisktouch.system import files, libc
from vmdisktouch.system.trace import ringbuf, tracefs
from vmdisktouch.system.trace.tracefs import PREFIX
from vmdisktouch.system.trace.bdi import kernel_dev
from vmdisktouch.system.trace.tracefs_mount import TraceUnavailable, reason

log = logging.getLogger("vmdisktouch")

IOMAP_DIO_SINCE = (6, 4)       # the first Linux with the iomap direct-I/O tracepoints
BEGIN, DONE, ITER = "iomap/iomap_dio_rw_begin", "iomap/iomap_dio_complete", "iomap/iomap_iter"
RQ = ("block/block_rq_issue", "block/block_rq_complete")
BIO = ("block/block_bio_queue", "block/block_bio_complete")
FIELDS = {BEGIN: ("pos", "count", "done_before"),
          DONE: ("pos", "ret", "error", "ki_flags", "aio"), ITER: ("pos",),
          **dict.fromkeys((RQ[0], BIO[0]), ("sector", "nr_sector", "rwbs")),
          **dict.fromkeys((RQ[1], BIO[1]), ("sector", "nr_sector", "rwbs", "error"))}
IOMAP_WRITE, IOMAP_DIRECT = 1, 16          # iomap_iter flags (its print fmt)
IOMAP_FS = {0xEF53: "ext4", 0x58465342: "xfs"}
OTHER_FS = {0x01021994: "tmpfs", 0x858458F6: "ramfs", 0x9123683E: "btrfs", 0x6969: "nfs",
            0x794C7630: "overlayfs", 0x65735546: "fuse", 0x2FC12FC1: "zfs", 0xFF534D42: "cifs"}
PROBE = 4096                   # bytes the start reads at offset 0
LATENCY_EVERY = 16             # submissions traced: those of 1 in 16 of the 4 KiB offsets
IOCB_WRITE = 1 << 18           # ki_flags' WRITE where the format does not say (6.18's)
CONFIRM_TRIES = 5
PENDING_S = 60                 # a submission unanswered this long is forgotten
PENDING_MAX = 1 << 16

SUB = np.dtype([("ts", "i8"), ("key", "i8"), ("off", "i8"), ("len", "i8"), ("pid", "i8"),
                ("pos", "i8"), ("write", "?")])
END = np.dtype([("ts", "i8"), ("key", "i8"), ("len", "i8"), ("ok", "?"), ("pid", "i8"),
                ("aio_write", "?"), ("aio", "?")])
ITERS = np.dtype([("ts", "i8"), ("pid", "i8"), ("pos", "i8")])

__all__ = ["DirectIOEvents", "DirectIOTracer", "DirectIOUnavailable", "IOMAP_DIO_SINCE",
           "PREFIX", "support"]


class DirectIOUnavailable(TraceUnavailable):
    """The direct I/O of this image cannot be traced here; ``str()`` is one line why."""


@dataclass(frozen=True)
class DirectIOEvents:
    """The I/O completed since the last drain, sorted by completion time."""
    ts: np.ndarray        # int64 CLOCK_MONOTONIC ns of completion
    offset: np.ndarray    # int64 byte offset in the image
    length: np.ndarray    # int64 bytes (completed)
    write: np.ndarray     # bool
    latency: np.ndarray   # int64 ns, submission to completion; -1 where the submission
    #                       was not traced (``latency_every``)
    lost: int             # events lost since the last drain (the kernel's count, and an
    #                       estimate of those a buffer resize drops uncounted)
    unpaired: int         # completions at a traced offset with no submission seen (they
    #                       began before the start)

    def __len__(self) -> int:
        return int(self.ts.size)


@dataclass(frozen=True)
class _Plan:
    kind: str                   # "iomap" or "block"
    filters: dict               # event -> kernel filter: submission, completion[, iter]
    first_sector: int           # a partition's start on its disk, else 0
    target: str                 # for messages


def _sysfs(dev: str, name: str) -> str:
    with open(f"/sys/dev/block/{dev}/{name}") as f:
        return f.read().strip()


def _plan(image, every: int = LATENCY_EVERY) -> _Plan:
    """What to trace for ``image`` (an open ``system.image.Image``: its descriptor's
    device and inode; or, for ``support`` only, a path, stat'ed, never opened):
    ``ImageError`` for a bad path, ``DirectIOUnavailable`` where these tracepoints
    cannot see its direct I/O. Submissions only at the offsets whose bits 12 and up,
    modulo ``every`` (a power of two), are 0."""
    pos_bits = f" && !(pos & {(every - 1) << 12})" if every > 1 else ""
    sector_bits = f" && !(sector & {(every - 1) << 3})" if every > 1 else ""
    path = image if isinstance(image, str) else image.path
    try:
        if isinstance(image, str):
            st = os.stat(path)
            fs = libc.fs_type_at(path) if stat.S_ISREG(st.st_mode) else None
        else:
            st, fs = files.fstat(image.fd), libc.fs_type(image.fd)
    except OSError as exc:
        raise ImageError(f"{path}: {reason(exc)}") from None
    except SyscallError as exc:
        raise ImageError(f"{path}: {exc}") from None
    if stat.S_ISREG(st.st_mode):
        if fs not in IOMAP_FS:
            raise DirectIOUnavailable(
                f"{path} is on {OTHER_FS.get(fs) or f'a file system of type {fs or 0:#x}'}: "
                "only images on ext4 or xfs can be traced (their O_DIRECT I/O passes the "
                "iomap tracepoints)")
        match = f"dev == {kernel_dev(st.st_dev)} && ino == {st.st_ino}"
        return _Plan("iomap", {BEGIN: match + " && count > 0" + pos_bits, DONE: match,
                               ITER: f"{match} && flags & {IOMAP_WRITE} && flags & {IOMAP_DIRECT}"},
                     0, f"inode {st.st_ino} on {os.major(st.st_dev)}:{os.minor(st.st_dev)}")
    if not stat.S_ISBLK(st.st_mode):
        raise ImageError(f"{path}: is {file_kind(st.st_mode)}; only regular files and block "
                         "devices are supported")
    disk = own = f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"
    first, rng = 0, ""
    try:
        if os.path.exists(f"/sys/dev/block/{own}/partition"):
            first, size = int(_sysfs(own, "start")), int(_sysfs(own, "size"))
            disk, rng = _sysfs(own, "../dev"), f" && sector >= {first} && sector < {first + size}"
    except (OSError, ValueError) as exc:
        raise DirectIOUnavailable(f"{path}: cannot read its partition in sysfs: {exc}") from None
    mq = os.path.isdir(f"/sys/dev/block/{disk}/mq")
    if rng and not mq:
        raise DirectIOUnavailable(f"{path} is a partition of the bio-based device {disk}: "
                                  "its I/O cannot be told apart")
    major, minor = map(int, disk.split(":"))
    match = f'dev == {major << 20 | minor} && nr_sector > 0 && (rwbs ~ "*R*" || rwbs ~ "*W*")'
    issue, done = RQ if mq else BIO
    return _Plan("block", {issue: match + rng + sector_bits, done: match + rng}, first,
                 f"block device {own} ({'request' if mq else 'bio'}-based"
                 f"{f', on {disk}' if rng else ''})")


def _tracing(root: str | None, plan: _Plan, path: str) -> str:
    """The usable tracefs root with every event of ``plan``; else ``DirectIOUnavailable``."""
    try:
        root = tracefs.find_root() if root is None else root
        tracefs.check_root(root)
    except TraceUnavailable as exc:
        raise DirectIOUnavailable(str(exc)) from None
    missing = [e.replace("/", ":") for e in plan.filters
               if not os.path.isfile(os.path.join(root, "events", e, "format"))]
    if missing:
        need = (f"Linux {'.'.join(map(str, IOMAP_DIO_SINCE))} or later" if plan.kind == "iomap"
                else "a kernel with block tracepoints (CONFIG_EVENT_TRACING)")
        raise DirectIOUnavailable(f"this kernel ({os.uname().release}) has no tracepoint "
                                  f"{', '.join(missing)}: tracing the O_DIRECT I/O of "
                                  f"{path} needs {need}")
    return root


def support(image, *, root: str | None = None) -> str | None:
    """None when the direct I/O of ``image`` (an open ``Image``, or a path) can be traced
    here, else one line saying why not. Makes no I/O and opens nothing
    (``DirectIOTracer`` checks the rest, on the open image)."""
    path = image if isinstance(image, str) else image.path
    try:
        _tracing(root, _plan(image), path)
    except (ImageError, TraceUnavailable) as exc:
        return str(exc)
    return None


def pair(sub_ts, sub_key, end_ts, end_key) -> np.ndarray:
    """For each completion, the index of its submission or -1: the latest one of its key
    at or before it that no other took."""
    ns = sub_ts.size
    keys, ts = np.concatenate([sub_key, end_key]), np.concatenate([sub_ts, end_ts])
    order = np.lexsort((ts, keys))             # stable: at one time, a submission first
    at = np.arange(order.size)
    # per element in that order, the last submission at or before it of the same key
    last = np.maximum.accumulate(np.where(order < ns, at, -1))
    group = np.maximum.accumulate(np.where(np.r_[True, keys[order][1:] != keys[order][:-1]],
                                           at, 0))
    ends = np.flatnonzero((order >= ns) & (last >= group))
    # the first completion after a submission takes it (a re-read of a page completes
    # after the read before it: its own submission comes between)
    firsts = np.unique(last[ends], return_index=True)[1]
    match = np.full(end_ts.size, -1, dtype=np.int64)
    match[order[ends[firsts]] - ns] = order[last[ends[firsts]]]
    left = np.flatnonzero(match < 0)
    if left.size:                              # several in flight at one key, or none seen
        taken = np.zeros(ns, dtype=bool)
        taken[match[match >= 0]] = True
        free = np.flatnonzero(~taken & np.isin(sub_key, end_key[left]))
        left = left[np.isin(end_key[left], sub_key[free])]   # the rest: not traced
        by_key: dict[int, list[int]] = {}
        for i in free[np.argsort(sub_ts[free], kind="stable")].tolist():
            by_key.setdefault(int(sub_key[i]), []).append(i)
        for j in left[np.argsort(end_ts[left], kind="stable")].tolist():
            cands = by_key.get(int(end_key[j]), [])
            k = next((k for k in range(len(cands) - 1, -1, -1)
                      if sub_ts[cands[k]] <= end_ts[j]), None)
            if k is not None:
                match[j] = cands.pop(k)
    return match


def writes(subs: np.ndarray, iters: np.ndarray) -> np.ndarray:
    """Which iomap begins are writes: the next event of their task is a write iter at
    their ``pos``."""
    ns = subs.size
    pid = np.concatenate([subs["pid"], iters["pid"]])
    pos = np.concatenate([subs["pos"], iters["pos"]])
    order = np.lexsort((np.concatenate([subs["ts"], iters["ts"]]), pid))   # stable
    at = np.flatnonzero(order[1:] >= ns) + 1
    prev, cur = order[at - 1], order[at]
    out = np.zeros(ns, dtype=bool)
    out[prev[(prev < ns) & (pid[prev] == pid[cur]) & (pos[prev] == pos[cur])]] = True
    return out


class DirectIOTracer:
    """The direct I/O of ``image`` (an open, verified ``system.image.Image``; module
    docstring): its device and inode are traced, and its start reads it through
    ``Image.reopen_direct``, never by path. ``name``: the tracefs instance's,
    ``PREFIX`` put in front when missing (``tracefs.sweep`` removes it if a killed
    process leaves it). Raises ``ImageError`` or ``DirectIOUnavailable``."""

    def __init__(self, image, *, name: str, buffer_kb: int = 1024,
                 max_buffer_kb: int = 65536, root: str | None = None,
                 latency_every: int = LATENCY_EVERY):
        self.image = image
        path = self.path = image.path
        if latency_every < 1 or latency_every & (latency_every - 1):
            raise ValueError(f"latency_every must be a power of two, not {latency_every}")
        self.latency_every = latency_every
        self.name = name if name.startswith(PREFIX) else PREFIX + name
        self.buffer_kb = int(buffer_kb)
        self.max_buffer_kb = max(int(max_buffer_kb), self.buffer_kb)
        self._fds: dict[int, int] = {}
        self._closed = False
        plan = _plan(image, latency_every)
        self.kind, self.target, self._first = plan.kind, plan.target, plan.first_sector
        root = _tracing(root, plan, path)
        try:
            self._inst = tracefs.Instance.create(self.name, plan.filters,
                                                 buffer_kb=self.buffer_kb, root=root)
        except TraceUnavailable as exc:
            raise DirectIOUnavailable(str(exc)) from None
        try:
            self._setup(list(plan.filters))
            self._confirm()
        except BaseException:
            self.close()
            raise

    def _setup(self, events: list[str]) -> None:
        inst = self._inst
        try:
            self._layout = ringbuf.parse_layout(inst.header_page(), inst.header_event(),
                                                inst.subbuf_bytes())
            texts = [inst.format_text(ev) for ev in events]
            fmts = [ringbuf.parse_format(t) for t in texts]
        except ValueError as exc:
            raise DirectIOUnavailable(f"cannot read the ring buffer's layout in {inst.path}: "
                                      f"{exc}") from None
        for ev, fmt in zip(events, fmts):
            lack = [f for f in FIELDS[ev] + ("common_type", "common_pid") if f not in fmt.fields]
            if lack:
                raise DirectIOUnavailable(f"tracepoint {ev} has no field {lack[0]} on this "
                                          f"kernel ({os.uname().release})")
        self._events = events
        bit = re.search(r'\{\s*\(1 << (\d+)\),\s*"WRITE"\s*\}', texts[1])
        self._iocb_write = 1 << int(bit.group(1)) if bit else IOCB_WRITE
        self._type = fmts[0].fields["common_type"]
        self._role = {fmt.id: (role, fmt.fields) for role, fmt in enumerate(fmts)}
        self._fds = inst.open_pipes()
        self._pending = np.zeros(0, SUB)
        self._later = (np.zeros(0, END), np.zeros(0, ITERS))
        self._last_was_iter: dict[int, int] = {}    # pid -> its last event was a write iter
        self._start_counts()

    def _start_counts(self) -> None:
        self._blind, self._last = 0, time.monotonic_ns()
        self._base = self._inst.lost_counts(self._fds)
        self._missed = dict.fromkeys(self._fds, 0)
        self._seen = dict.fromkeys(self._fds, 0)

    def _confirm(self) -> None:
        """One O_DIRECT read of offset 0 must come back as a submission (of this thread,
        for a file): the filters catch this image's direct I/O."""
        me, t0 = threading.get_native_id(), time.monotonic_ns()
        buf = mmap.mmap(-1, PROBE)
        try:
            fd = self.image.reopen_direct()
            try:
                os.preadv(fd, [buf], 0)
            finally:
                os.close(fd)
        except (OSError, SyscallError) as exc:
            raise DirectIOUnavailable(f"cannot read {self.path} with O_DIRECT: "
                                      f"{reason(exc) if isinstance(exc, OSError) else exc}"
                                      ) from None
        finally:
            buf.close()
        for _ in range(CONFIRM_TRIES):
            cutoff = time.monotonic_ns()
            subs = self._collect(cutoff)[1]
            if ((subs["ts"] >= t0) & ((subs["pid"] == me) | (self.kind == "block"))).any():
                self._pending = self._pending[self._pending["ts"] >= cutoff]   # the start
                self._start_counts()
                log.info("trace: %s: direct I/O of %s seen on %s", self.name, self.path,
                         self.target)
                return
            time.sleep(0.01)
        raise DirectIOUnavailable(f"an O_DIRECT read of {self.path} did not come back from "
                                  f"the tracepoints of {self.target} "
                                  f"({', '.join(self._events)})")

    # -- reading -----------------------------------------------------------------------

    def _decode(self, recs: ringbuf.Records) -> list[np.ndarray]:
        """Records -> [submissions, completions, iters] (structured arrays)."""
        types = recs.field(self._type)
        out = [np.zeros(0, SUB), np.zeros(0, END), np.zeros(0, ITERS)]
        for ident, (role, f) in self._role.items():
            w = np.flatnonzero(types == ident)
            if not w.size:
                continue
            get = (lambda n: recs.field(f[n], w).astype(np.int64))
            a = np.zeros(w.size, (SUB, END, ITERS)[role])
            a["ts"] = recs.ts[w]
            if role == 2 or (role == 0 and self.kind == "iomap"):
                a["pos"], a["pid"] = get("pos"), get("common_pid")
                if role == 0:
                    a["key"] = a["off"] = a["pos"] - get("done_before")
                    a["len"] = get("count")
            elif self.kind == "iomap":
                ret = get("ret")
                a["key"], a["len"], a["ok"] = get("pos") - np.maximum(ret, 0), ret, \
                    (get("error") == 0) & (ret > 0)
                a["pid"], a["aio"] = get("common_pid"), get("aio") != 0
                a["aio_write"] = (get("ki_flags") & self._iocb_write) != 0
            else:                     # block: keyed by end sector and R/W
                at = recs.start[w] + f["rwbs"].offset
                wr = (recs.buf[at] == ord("W")) | (recs.buf[at + 1] == ord("W"))
                sector, nr = get("sector"), get("nr_sector")
                a["key"] = (sector + nr) * 2 + wr
                a["len"] = nr * 512
                if role == 0:
                    a["write"], a["off"] = wr, (sector - self._first) * 512
                else:
                    a["ok"] = get("error") == 0
            out[role] = np.concatenate([out[role], a])
        return out

    def _read(self, fd: int) -> bytes:
        """The pages buffered on one CPU now, one per read (non-blocking)."""
        size, pages = self._layout.page_bytes, []
        with contextlib.suppress(OSError):       # EAGAIN: all read
            for _ in range(self.buffer_kb * 1024 // size + 64):
                page = os.read(fd, size)
                if not page:
                    break
                pages.append(page.ljust(size, b"\0"))
        return b"".join(pages)

    def _collect(self, cutoff: int) -> tuple[DirectIOEvents, np.ndarray]:
        """Read every CPU; pair what completed before ``cutoff``. Also the new submissions."""
        parts, most, records = [], 0, 0
        for cpu, fd in self._fds.items():
            data = self._read(fd)
            most = max(most, len(data))
            if data:
                recs = ringbuf.parse_pages(data, self._layout)
                self._missed[cpu] += recs.missed + recs.missed_unknown
                records += len(recs)
                parts.append(self._decode(recs))
        new = [np.concatenate([p[r] for p in parts]) if parts else np.zeros(0, d)
               for r, d in enumerate((SUB, END, ITERS))]
        ends, iters = (np.concatenate([old, n]) for old, n in zip(self._later, new[1:]))
        self._later = (ends[ends["ts"] >= cutoff], iters[iters["ts"] >= cutoff])
        ends, iters = ends[ends["ts"] < cutoff], iters[iters["ts"] < cutoff]
        subs = np.concatenate([self._pending, new[0]])
        if iters.size:
            subs["write"] |= writes(subs, iters)
        # where each I/O started, on the image or the disk under it: the filter's offsets
        start = ends["key"] if self.kind == "iomap" else \
            (ends["key"] >> 1) * 512 - ends["len"]
        traced = (start & ((self.latency_every - 1) << 12)) == 0
        match = np.full(ends.size, -1, dtype=np.int64)
        at = np.flatnonzero(traced)               # only these can have a submission
        match[at] = pair(subs["ts"], subs["key"], ends["ts"][at], ends["key"][at])
        got = match >= 0
        keep = subs["ts"] >= cutoff - PENDING_S * 10**9
        keep[match[got]] = False
        self._pending = subs[keep][-PENDING_MAX:]
        done = ends["ok"]
        order = np.argsort(ends["ts"][done], kind="stable")
        e, m, traced = ends[done][order], match[done][order], traced[done][order]
        paired = m >= 0
        s = subs[np.maximum(m, 0)] if subs.size else np.zeros(e.size, SUB)
        if self.kind == "iomap":
            offset, length = e["key"], e["len"]
            mine = new[0][new[0]["ts"] < cutoff]
            write = np.where(paired, s["write"], np.where(e["aio"], e["aio_write"],
                                                          self._after_write(e, mine, iters)))
        else:                   # the submission's extent: dm trims what it hands on
            offset = np.where(paired, s["off"],
                              (e["key"] >> 1) * 512 - e["len"] - self._first * 512)
            length, write = np.where(paired, s["len"], e["len"]), (e["key"] & 1) == 1
        latency = np.where(paired, e["ts"] - s["ts"], -1)
        lost, self._blind = (self._lost() if most else 0) + self._blind, 0
        rate = records / max(cutoff - self._last, 1)          # events per ns
        self._last = cutoff
        if lost or most * 2 >= self.buffer_kb * 1024:
            self._grow(f"{lost} events lost" if lost else
                       f"{most >> 10} KiB buffered on one CPU at a drain", 4 * most >> 10, rate)
        return DirectIOEvents(e["ts"], offset, length, write, latency, lost,
                              int((traced & ~paired).sum())), new[0]

    def _after_write(self, e: np.ndarray, subs: np.ndarray, iters: np.ndarray) -> np.ndarray:
        """Which synchronous completions ``e`` end a write: their task's event before them
        is a write iter (a sync I/O completes in the task that submitted it, and only
        writes have iters here). Each task's last event of the drain before carries over."""
        last = self._last_was_iter
        if not iters.size and not any(last.values()):
            return np.zeros(e.size, dtype=bool)       # no write in sight: read, read only
        carried = np.array(list(last.items()), dtype=np.int64).reshape(-1, 2)
        pid = np.concatenate([carried[:, 0], subs["pid"], iters["pid"], e["pid"]])
        ts = np.concatenate([np.full(len(carried), -1), subs["ts"], iters["ts"], e["ts"]])
        is_iter = np.concatenate([carried[:, 1] == 1, np.zeros(subs.size, bool),
                                  np.ones(iters.size, bool), np.zeros(e.size, bool)])
        order = np.lexsort((ts, pid))
        first_end = len(carried) + subs.size + iters.size
        prev_same = np.zeros(pid.size, bool)
        prev_same[order[1:]] = (pid[order[1:]] == pid[order[:-1]]) & is_iter[order[:-1]]
        tail = order[np.append(pid[order[1:]] != pid[order[:-1]], True)]
        self._last_was_iter = {int(p): int(i) for p, i in zip(pid[tail], is_iter[tail])}
        return prev_same[first_end:]

    def _lost(self) -> int:
        """Events lost since the last call: per CPU the larger of the stats' and the pages'
        running counts (the kernel reports a loss in both)."""
        stats, total = self._inst.lost_counts(self._fds), 0
        for cpu in self._fds:
            now, base = stats.get(cpu), self._base.get(cpu)
            counted = 0 if now is None or base is None else max(now - base, 0)
            seen = max(counted, self._missed[cpu], self._seen[cpu])
            total += seen - self._seen[cpu]
            self._seen[cpu] = seen
        return total

    def _grow(self, why: str, want_kb: int, rate: float) -> None:
        """Double the per-CPU buffer, or more up to ``want_kb``. What is recorded while it
        is resized is lost and not counted by the kernel (about 25 ms of events here,
        whatever the size): estimated from ``rate`` (events/ns), added to the next loss."""
        new = ringbuf.grown_kb(self.buffer_kb, want_kb, self.max_buffer_kb)
        if new <= self.buffer_kb:
            return
        try:
            self._blind = self._inst.grow(new, rate)
        except TraceUnavailable as exc:
            log.warning("trace: %s: %s; cannot grow the buffer: %s", self.name, why, exc)
            self.max_buffer_kb = self.buffer_kb
            return
        log.info("trace: %s: %s; per-CPU buffer %d -> %d KiB (about %d events lost while it "
                 "grew)", self.name, why, self.buffer_kb, new, self._blind)
        self.buffer_kb = new

    def drain(self) -> DirectIOEvents:
        """The I/O completed since the last drain and before this one began, sorted by
        completion time; never blocks. ``ClosedError`` after ``close()``."""
        if self._closed:
            raise ClosedError(f"direct I/O tracer {self.name} used after close()")
        return self._collect(time.monotonic_ns())[0]

    def close(self) -> None:
        """Close the pipes and remove the instance; idempotent."""
        if self._closed:
            return
        self._closed = True
        tracefs.close_pipes(self._fds)
        inst = getattr(self, "_inst", None)
        if inst is not None:
            inst.remove()

    def __enter__(self) -> DirectIOTracer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
