"""Reads counted per block in the kernel: a small eBPF program on the read tracepoint.

Theory of operation. A guest that reads its cached disk as fast as it can
brings a million ``filemap:mm_filemap_get_pages`` events a second; copied
out of the ring buffer and parsed, each costs the daemon about 0.27 µs, a
quarter of a core (docs/benchmarks/busy-cost.md). The daemon only ever
needs, per block, how many read events touched it, so the counting is done
where the event happens: ``ReadCounter`` loads a program of a few dozen
instructions (written here as raw eBPF, no compiler, no libbpf), attaches
it to the same tracepoint through perf_event_open(2), and the program adds
one to the 8-byte counter of every block the read touches, in an array map
the daemon maps into its memory (``BPF_F_MMAPABLE``). Each read also adds
one to the counter of the chunk (``CHUNK`` blocks) of its first block and
of its last, after the blocks'; a drain copies the chunks' counters and
reads only the blocks of the chunks that moved, whatever the read rate and
the image's size: nothing can be lost, and reads stay exact.

The program matches what the tracefs filter matched: ``i_ino`` and
``s_dev`` of the image, never the daemon's own loading thread
(``exclude_tid``). Slot 0 of the map holds a thread id set by ``probe``: a
read by that thread counts in slot 1 instead (the probe's read proves the
path without counting as the guest's). Slot 2 counts reads that start
beyond the blocks the map has (the image grew); blocks start at slot 3,
the chunks' counters follow them. A
read range longer than ``span_blocks`` blocks (8, or as many as 512 pages
cover, at most 256, for smaller blocks) counts for its first ones here; the
rest of the batch it read, past them, is counted when the daemon takes the
sample ring, where such a range always goes whole (``past_span``): a batch
of 31 large folios is up to 62 MiB.

The same program samples the pages read for the disk's miss-ratio curve
(``core.mrc``): a page whose hash (the curve's ``page_hash``) is under the
threshold the daemon writes into a second map goes into a ring of
``RING`` page numbers there (its slot taken with an atomic fetch-add, the
number stored plus one so that an empty slot reads 0); the map also counts
every page read, the curve's denominator. The ring is taken with the
counters; what overran it is counted lost.

The kernel reports a long read once per batch of folios (at most 31), each
time from the batch's first page to the request's end (``0-4095, 31-4095,
62-4095``); sampled as reported, a 16 MiB read counted each page ~17 times and
looked like reuse. So each thread keeps its last range pending in the sample
map (a slot per thread id modulo ``PEND_SLOTS``: thread, first and last page),
and the range is sampled at the thread's next read: up to that read's first
page when it continues the same request (same thread, same last page, a first
page within the range), else whole (a thread that moved to another CPU
mid-request still finds its range). Every page of the range counts: a range
of up to ``SAMPLE_SPAN`` pages is sampled here page by page; a longer one (a
batch of 31 large folios is up to 62 MiB) goes into the ring whole, as two
entries (its first page marked ``RANGE_FIRST``, its last ``RANGE_LAST``), and
the daemon samples its pages under the same threshold (``mrc.sample_ranges``):
only the first ``SAMPLE_SPAN`` pages of each were sampled before, so a
64 MiB zone read in 4 MiB requests looked a quarter of its size. A take also
takes what is pending and was pending at the take before (a range pending
once may still be continued by a read in flight), so an idle disk's last read
waits one take at most (``mrc.Batches`` is the same rule for the ring
buffer's READ events).

A second program, on ``filemap:mm_filemap_add_to_page_cache`` with the same
filter, times the guest's misses (``added_program``), for the miss cost
(``observe.miss_cost``): it keeps, in a slot per thread of a third map
(``MISS_SLOTS``, by thread id modulo), the time and the folio's pages of the
first page the thread added since its last read. A read of that thread that
starts within those pages waited from the insertion to its own event, which
the kernel emits once the batch's pages are up to date (6.18: an evicted 4 KiB
page, 190 µs from insertion to the read's event in a read that took 264 µs
as its caller timed it; 29 in 34 on a warm device); the read program adds
the wait and a count to the map's first two slots. Any read of the thread
closes its slot, so pages added by readahead ahead of the read, by a write,
or by ``fadvise`` are not timed unless the thread's next read starts in them.
Where reads stay events, ``trace_reader.paired_misses`` applies the same rule
to them (the system tests give both the same reads).

It needs CAP_BPF and CAP_PERFMON (root has both) and a kernel with
``CONFIG_BPF_EVENTS``; ``ReadCounter.create`` raises ``BpfUnavailable`` with
the reason otherwise, and the reader keeps the read events in its ring
buffer (``trace_reader``).
"""

from __future__ import annotations

import errno
import mmap
import os
import struct

import numpy as np

from vmdisktouch.core.mrc import HASH_BITS, HASH_MUL
from vmdisktouch.errors import SyscallError, VmdtError
from vmdisktouch.system import libc

MAX_SPAN = 8               # blocks one read range counts for, at most, with blocks of
SPAN_PAGES = 512           # ... up to this many pages: smaller blocks count more of a range
MOST_SPAN = 256            # and at most this many blocks (the program's size: 14 each)
MAX_SLOTS = 1 << 22        # 32 MiB of counters: a bigger map is not made
CHUNK_SHIFT = 8            # a chunk: 256 blocks (at least MOST_SPAN: a range touches 2 at most)
CHUNK = 1 << CHUNK_SHIFT
PROBE_TID, PROBE_HITS, BEYOND, FIRST_BLOCK = 0, 1, 2, 3
SAMPLE_SPAN = 256          # pages of a range the kernel samples; a longer one goes whole
RING = 1 << 16             # sampled pages the ring holds between two takes (512 KiB)
S_PAGES, S_THRESHOLD, S_HEAD, S_RING = 0, 1, 2, 4   # the sample map's 8-byte slots
S_PEND = S_RING + RING     # then per thread slot: the range not yet taken (thread, page, last)
PEND_SLOTS = 256           # the threads' slots (a thread's is its id modulo this), 4 words each
RANGE_FIRST = 1 << 62      # a ring entry of a long range's first page (+1), then its last's
RANGE_LAST = 1 << 61
M_SUM, M_COUNT, M_PEND = 0, 1, 2   # the miss map's 8-byte slots: waits summed, misses timed,
MISS_SLOTS = 256           # then per thread (its id modulo this) 4 words: thread, time, pages
_MAP_VALUE = 2             # BPF_PSEUDO_MAP_VALUE: ld_imm64 of a map value's address

_BPF_MAP_CREATE = 0
_MAP_ARRAY, _F_MMAPABLE, _PROG_TRACEPOINT = 2, 1 << 10, 5
_PERF_TYPE_TRACEPOINT, _PERF_SAMPLE_RAW, _PERF_FLAG_FD_CLOEXEC = 2, 1 << 10, 8
_IOC_SET_BPF, _IOC_ENABLE = 0x40042408, 0x2400
_FUNC_MAP_LOOKUP, _FUNC_KTIME, _FUNC_CPU, _FUNC_PID_TGID = 1, 5, 8, 14


class BpfUnavailable(VmdtError):
    """The kernel or the daemon's privileges do not allow the counting program."""


# The kernel runs at most 64 programs on one tracepoint, host-wide (BPF_TRACE_MAX_PROGS;
# E2BIG past it): a disk each, so the 65th disk's reads, or any disk's while other tools
# hold the tracepoint's programs, are events of the ring buffer.
TRACEPOINT_FULL = ("the kernel's 64 programs a tracepoint, host-wide, are all taken "
                   "(each disk counted in the kernel takes one)")


# -- eBPF instructions (linux/bpf.h, Documentation/bpf/standardization) -------------------

def _insn(op: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", op, (src << 4) | dst, off, imm)


def _ld_imm64(dst: int, value: int, src: int = 0) -> bytes:
    value &= (1 << 64) - 1
    lo, hi = value & 0xFFFFFFFF, value >> 32
    return (struct.pack("<BBhI", 0x18, (src << 4) | dst, 0, lo)
            + struct.pack("<BBhI", 0, 0, 0, hi))


def _ldx(size: str, dst: int, src: int, off: int) -> bytes:
    return _insn(0x61 | {"w": 0x00, "b": 0x10, "dw": 0x18}[size], dst, src, off)


def _mov(dst: int, src: int) -> bytes:
    return _insn(0xbf, dst, src)


def _mov_k(dst: int, imm: int) -> bytes:
    return _insn(0xb7, dst, 0, 0, imm)


def _add_k(dst: int, imm: int) -> bytes:
    return _insn(0x07, dst, 0, 0, imm)


def _div_k(dst: int, imm: int) -> bytes:
    return _insn(0x37, dst, 0, 0, imm)


def _stx_dw(dst: int, src: int, off: int) -> bytes:
    return _insn(0x7b, dst, src, off)


def _atomic_add_dw(dst: int, src: int, off: int = 0, *, fetch: bool = False) -> bytes:
    """lock *(u64 *)(dst + off) += src; ``fetch``: src = the value before."""
    return _insn(0xdb, dst, src, off, 1 if fetch else 0)


def _alu(op: str, dst: int, *, src: int | None = None, imm: int = 0) -> bytes:
    """64-bit ALU: dst op= src (a register) or imm."""
    code = {"add": 0x00, "sub": 0x10, "mul": 0x20, "or": 0x40, "and": 0x50, "lsh": 0x60,
            "rsh": 0x70}[op]
    if src is not None:
        return _insn(0x07 | code | 0x08, dst, src)
    return _insn(0x07 | code, dst, 0, 0, imm)


def _jump(op: str, dst: int, off: int, *, src: int | None = None, imm: int = 0) -> bytes:
    code = {"ja": 0x05, "jeq": 0x15, "jne": 0x55, "jgt": 0x25, "jge": 0x35}[op]
    if src is not None:
        return _insn(code | 0x08, dst, src, off)
    return _insn(code, dst, 0, off, imm)


def chunks_of(nblocks: int) -> int:
    """The chunks of ``nblocks`` blocks: each has a counter of the read events that
    touched it, after the blocks' (``ReadCounter.take`` reads only the chunks that moved)."""
    return -(-int(nblocks) // CHUNK)


def span_blocks(pages_per_block: int) -> int:
    """The blocks one read range counts for, at most: ``MAX_SPAN``, or for blocks smaller
    than ``SPAN_PAGES / MAX_SPAN`` pages enough to cover ``SPAN_PAGES`` pages (a 1 MiB read
    of 4 KiB blocks touches 256), at most ``MOST_SPAN``."""
    return max(MAX_SPAN, min(MOST_SPAN, -(-SPAN_PAGES // int(pages_per_block)) + 1))


_CALL_LOOKUP = _insn(0x85, 0, 0, 0, _FUNC_MAP_LOOKUP)
_CALL_PID_TGID = _insn(0x85, 0, 0, 0, _FUNC_PID_TGID)
_CALL_CPU = _insn(0x85, 0, 0, 0, _FUNC_CPU)
_CALL_KTIME = _insn(0x85, 0, 0, 0, _FUNC_KTIME)
_EXIT = _insn(0x95)


class _Asm:
    """Instructions with forward jumps to named labels, resolved at ``code``."""

    def __init__(self):
        self.insns: list[bytes | tuple] = []

    def emit(self, *items) -> None:
        for it in items:
            if isinstance(it, tuple):
                self.insns.append(it)
            else:
                self.insns.extend(it[i:i + 8] for i in range(0, len(it), 8))

    def jump(self, op: str, dst: int, label: str, *, src: int | None = None,
             imm: int = 0) -> None:
        self.insns.append((op, dst, label, src, imm))

    def label(self, name: str) -> None:
        self.insns.append(name)

    def code(self) -> bytes:
        where, n = {}, 0
        for it in self.insns:
            if isinstance(it, str):
                where[it] = n
            else:
                n += 1
        out, n = [], 0
        for it in self.insns:
            if isinstance(it, str):
                continue
            if isinstance(it, tuple):
                op, dst, label, src, imm = it
                it = _jump(op, dst, where[label] - n - 1, src=src, imm=imm)
            out.append(it)
            n += 1
        return b"".join(out)


def program(offsets: dict[str, int], *, map_fd: int, ino: int, sdev: int | None,
            exclude_tid: int | None, pages_per_block: int, nblocks: int,
            sample_fd: int | None = None, miss_fd: int | None = None) -> bytes:
    """The counting program (module docstring), for the record layout ``offsets``
    (``i_ino``, ``s_dev``, ``index``, ``last_index``); with ``sample_fd`` (the sample
    map) it samples the pages read too; with ``miss_fd`` (the miss map, which
    ``added_program`` fills) it times the reads that waited for a page added."""
    a = _Asm()

    def lookup() -> bytes:
        """r0 = &map[r9] (the key stored at r10 - 8); clobbers r1-r5."""
        return _stx_dw(10, 9, -8) + _ld_imm64(1, map_fd, src=1) + _mov(2, 10) + \
            _add_k(2, -8) + _CALL_LOOKUP

    def count() -> bytes:
        """map[r9] += 1, atomically (an array's lookup within bounds never fails)."""
        return lookup() + _jump("jeq", 0, 2, imm=0) + _mov_k(1, 1) + _atomic_add_dw(0, 1)

    # r6: the record; r7, r8: first and last block; r9: the slot being counted.
    a.emit(_mov(6, 1), _ldx("dw", 2, 6, offsets["i_ino"]), _ld_imm64(3, ino))
    a.jump("jne", 2, "out", src=3)
    if sdev is not None:
        a.emit(_ldx("w", 2, 6, offsets["s_dev"]), _ld_imm64(3, sdev))
        a.jump("jne", 2, "out", src=3)
    # The record's common fields are not the program's to read: the thread id is the low
    # half of bpf_get_current_pid_tgid().
    a.emit(_CALL_PID_TGID, _insn(0xbc, 7, 0))        # w7 = w0 (zero-extended)
    if exclude_tid is not None:
        a.jump("jeq", 7, "out", imm=int(exclude_tid))
    # Slot 0: the probe's thread id; its reads count in slot 1.
    a.emit(_mov_k(9, PROBE_TID))
    a.emit(lookup())
    a.jump("jeq", 0, "out", imm=0)
    a.emit(_ldx("dw", 3, 0, 0))
    a.jump("jne", 7, "reads", src=3)
    a.emit(_mov_k(9, PROBE_HITS), count())
    a.jump("ja", 0, "out")
    a.label("reads")
    if miss_fd is not None:
        _time_miss(a, offsets, miss_fd)
    a.emit(_ldx("dw", 7, 6, offsets["index"]), _ldx("dw", 8, 6, offsets["last_index"]),
           _div_k(7, pages_per_block), _div_k(8, pages_per_block))
    a.jump("jge", 7, "beyond", imm=nblocks)
    done = "out" if sample_fd is None else "sample"
    a.emit(_stx_dw(10, 7, -16))                      # the first block, for its chunk
    for i in range(span_blocks(pages_per_block)):
        a.emit(_mov(9, 7), _add_k(9, FIRST_BLOCK), count())
        a.emit(_add_k(7, 1))
        a.jump("jgt", 7, "chunks", src=8)
        a.jump("jge", 7, "chunks", imm=nblocks)
    # The chunks of the first and the last block counted (r7 - 1), once each, after the
    # blocks: a take that sees a chunk's count move finds its blocks' counts there.
    a.label("chunks")
    first_chunk = FIRST_BLOCK + nblocks
    a.emit(_mov(9, 7), _add_k(9, -1), _alu("rsh", 9, imm=CHUNK_SHIFT), _add_k(9, first_chunk),
           count(), _ldx("dw", 8, 10, -16), _alu("rsh", 8, imm=CHUNK_SHIFT),
           _add_k(8, first_chunk))
    a.jump("jeq", 8, done, src=9)
    a.emit(_mov(9, 8), count())
    a.jump("ja", 0, done)
    a.label("beyond")
    a.emit(_mov_k(9, BEYOND), count())
    if sample_fd is not None:
        a.jump("ja", 0, "out")
        _sample(a, offsets, sample_fd)
    a.label("out")
    a.emit(_mov_k(0, 0), _EXIT)
    return a.code()


def _thread_slot(a: _Asm, miss_fd: int) -> None:
    """r8 = this thread's slot of the miss map (its id in r7); clobbers r1."""
    a.emit(_ld_imm64(1, miss_fd, src=_MAP_VALUE), _mov(8, 7),
           _alu("and", 8, imm=MISS_SLOTS - 1), _alu("lsh", 8, imm=5), _add_k(8, 8 * M_PEND),
           _alu("add", 8, src=1))


def _time_miss(a: _Asm, offsets: dict[str, int], miss_fd: int) -> None:
    """A read by the thread in r7 whose first page the thread added since its last read
    (its slot: ``added_program``) waited from the add to now: summed and counted. Any
    read of the thread closes its slot. r8, r9: the slot and the add's time."""
    _thread_slot(a, miss_fd)
    a.emit(_ldx("dw", 3, 8, 0))
    a.jump("jne", 3, "timed", src=7)                  # the slot is another thread's
    a.emit(_ldx("dw", 9, 8, 8))
    a.jump("jeq", 9, "timed", imm=0)                  # nothing added since its last read
    a.emit(_mov_k(3, 0), _stx_dw(8, 3, 8),
           _ldx("dw", 3, 8, 16), _ldx("dw", 4, 8, 24), _ldx("dw", 5, 6, offsets["index"]))
    a.jump("jgt", 3, "timed", src=5)                  # the read starts before the add's
    a.jump("jgt", 5, "timed", src=4)                  # or after its last page
    a.emit(_CALL_KTIME, _alu("sub", 0, src=9), _ld_imm64(1, miss_fd, src=_MAP_VALUE),
           _atomic_add_dw(1, 0, 8 * M_SUM), _mov_k(3, 1), _atomic_add_dw(1, 3, 8 * M_COUNT))
    a.label("timed")


def added_program(offsets: dict[str, int], *, miss_fd: int, ino: int, sdev: int | None,
                  exclude_tid: int | None) -> bytes:
    """The program on the page-cache insertion (``mm_filemap_add_to_page_cache``, record
    layout ``offsets``: ``i_ino``, ``s_dev``, ``index``, ``order``): the first page a
    thread adds since its last read, its time and its folio's pages, in the thread's slot
    of the miss map, for ``_time_miss``."""
    a = _Asm()
    a.emit(_mov(6, 1), _ldx("dw", 2, 6, offsets["i_ino"]), _ld_imm64(3, ino))
    a.jump("jne", 2, "out", src=3)
    if sdev is not None:
        a.emit(_ldx("w", 2, 6, offsets["s_dev"]), _ld_imm64(3, sdev))
        a.jump("jne", 2, "out", src=3)
    a.emit(_CALL_PID_TGID, _insn(0xbc, 7, 0))
    if exclude_tid is not None:
        a.jump("jeq", 7, "out", imm=int(exclude_tid))
    _thread_slot(a, miss_fd)
    a.emit(_ldx("dw", 3, 8, 0))
    a.jump("jne", 3, "mark", src=7)
    a.emit(_ldx("dw", 3, 8, 8))
    a.jump("jne", 3, "out", imm=0)                    # the read's first add is kept
    a.label("mark")
    a.emit(_CALL_KTIME, _stx_dw(8, 7, 0), _stx_dw(8, 0, 8),
           _ldx("dw", 3, 6, offsets["index"]), _stx_dw(8, 3, 16),
           _ldx("b", 4, 6, offsets["order"]), _mov_k(5, 1), _alu("lsh", 5, src=4),
           _alu("add", 5, src=3), _add_k(5, -1), _stx_dw(8, 5, 24))
    a.label("out")
    a.emit(_mov_k(0, 0), _EXIT)
    return a.code()


def _sample(a: _Asm, offsets: dict[str, int], sample_fd: int) -> None:
    """The pages of this thread's previous read range into the sample ring, up to this
    range's first page when it continues the same request (module docstring). r1: the
    sample map's value; r2: the thread's pending slot; r7, r8: the page and the last page
    of the range taken; r9: the threshold."""
    pend = 8 * S_PEND
    a.label("sample")
    a.emit(_CALL_PID_TGID, _insn(0xbc, 0, 0),                 # w0: the thread id
           _ld_imm64(1, sample_fd, src=_MAP_VALUE),
           _mov(2, 0), _alu("and", 2, imm=PEND_SLOTS - 1), _alu("lsh", 2, imm=5),
           _add_k(2, pend), _alu("add", 2, src=1),
           _ldx("dw", 3, 2, 0), _ldx("dw", 7, 2, 8), _ldx("dw", 8, 2, 16),
           _ldx("dw", 4, 6, offsets["index"]), _ldx("dw", 5, 6, offsets["last_index"]),
           _stx_dw(2, 0, 0), _stx_dw(2, 4, 8), _stx_dw(2, 5, 16))
    a.jump("jeq", 3, "out", imm=0)                            # nothing was pending
    a.jump("jne", 3, "take", src=0)                           # continued: same thread,
    a.jump("jne", 8, "take", src=5)                           # same last page, a first
    a.jump("jge", 7, "take", src=4)                           # page past the previous
    a.jump("jgt", 4, "take", src=8)                           # one's and within its range
    a.emit(_mov(8, 4), _add_k(8, -1))
    a.label("take")
    a.emit(_mov(2, 8), _alu("sub", 2, src=7), _add_k(2, 1), _atomic_add_dw(1, 2, 8 * S_PAGES),
           _ldx("dw", 9, 1, 8 * S_THRESHOLD))
    a.jump("jgt", 2, "whole", imm=SAMPLE_SPAN)
    for i in range(SAMPLE_SPAN):
        a.jump("jgt", 7, "out", src=8)
        a.emit(_mov(2, 7), _ld_imm64(3, HASH_MUL), _alu("mul", 2, src=3),
               _alu("rsh", 2, imm=64 - HASH_BITS))
        a.jump("jge", 2, f"next{i}", src=9)
        a.emit(_mov_k(3, 1), _atomic_add_dw(1, 3, 8 * S_HEAD, fetch=True),
               _alu("and", 3, imm=RING - 1), _alu("lsh", 3, imm=3), _mov(4, 1),
               _alu("add", 4, src=3), _mov(5, 7), _add_k(5, 1), _stx_dw(4, 5, 8 * S_RING))
        a.label(f"next{i}")
        a.emit(_add_k(7, 1))
    a.jump("ja", 0, "out")
    # A range longer than the span: two entries, its first page and its last (each + 1,
    # marked), for the daemon to sample.
    a.label("whole")
    a.emit(_mov_k(3, 2), _atomic_add_dw(1, 3, 8 * S_HEAD, fetch=True), _mov(0, 3),
           _alu("and", 3, imm=RING - 1), _alu("lsh", 3, imm=3), _mov(4, 1),
           _alu("add", 4, src=3), _mov(5, 7), _add_k(5, 1), _ld_imm64(3, RANGE_FIRST),
           _alu("or", 5, src=3), _stx_dw(4, 5, 8 * S_RING),
           _add_k(0, 1), _alu("and", 0, imm=RING - 1), _alu("lsh", 0, imm=3), _mov(4, 1),
           _alu("add", 4, src=0), _mov(5, 8), _add_k(5, 1), _ld_imm64(3, RANGE_LAST),
           _alu("or", 5, src=3), _stx_dw(4, 5, 8 * S_RING))
    a.jump("ja", 0, "out")


def decode_ring(vals: np.ndarray) -> np.ndarray:
    """The ring's entries (page + 1; a long range's first and last marked) -> ranges
    ``(n, 2)`` of first and last page, in order. A range's half whose other half the ring
    lost (it overran between them) is dropped."""
    vals = np.asarray(vals, dtype=np.uint64)
    is_first = (vals & np.uint64(RANGE_FIRST)) != 0
    is_last = (vals & np.uint64(RANGE_LAST)) != 0
    page = (vals & ~np.uint64(RANGE_FIRST | RANGE_LAST)).astype(np.int64) - 1
    pair = np.zeros(vals.size, dtype=bool)
    pair[:-1] = is_first[:-1] & is_last[1:]
    single = ~(is_first | is_last)
    keep = single | pair
    out = np.stack((page, page), axis=1)[keep]
    out[pair[keep], 1] = page[1:][pair[:-1]]
    return out


# -- system calls (``libc``) ---------------------------------------------------------------

def _perf_attr(tracepoint_id: int) -> bytes:
    """``struct perf_event_attr`` (PERF_ATTR_SIZE_VER5, 112 bytes): type, size, config,
    sample_period, sample_type, read_format, flags, wakeup_events; enabled by ioctl."""
    return struct.pack("<IIQQQQQI", _PERF_TYPE_TRACEPOINT, 112, tracepoint_id, 1,
                       _PERF_SAMPLE_RAW, 0, 0, 1).ljust(112, b"\0")


class ReadCounter:
    """Per-block read counts of one image, counted in the kernel (module docstring)."""

    def __init__(self, fds: list[int], counters: mmap.mmap, samples: mmap.mmap, nblocks: int,
                 pages_per_block: int = 1, misses: mmap.mmap | None = None):
        self._fds = fds
        self._mems = [counters, samples] + ([misses] if misses is not None else [])
        self._misses = (np.frombuffer(misses, dtype=np.uint64, count=M_PEND)
                        if misses is not None else None)
        self._misses_base = (0, 0)
        self.nblocks = nblocks
        self.pages_per_block = int(pages_per_block)
        words = np.frombuffer(counters, dtype=np.uint64,
                              count=nblocks + FIRST_BLOCK + chunks_of(nblocks))
        self._slots, self._chunks = words[:nblocks + FIRST_BLOCK], words[nblocks + FIRST_BLOCK:]
        # Each slot's count at the last take, modulo 2**32: a block read fewer than 2**32
        # times between two takes of its chunk gives its exact count, at half the memory
        # of the map's own 64-bit counts (4 bytes a block, a quarter MiB of a 64 GiB image).
        self._base = self._slots.astype(np.uint32)
        self._chunks_base = self._chunks.copy()
        self._sample = np.frombuffer(samples, dtype=np.uint64, count=S_PEND + 4 * PEND_SLOTS)
        self._ring = self._sample[S_RING:S_PEND]
        self._pend = self._sample[S_PEND:].reshape(PEND_SLOTS, 4)
        self._seen = np.zeros((PEND_SLOTS, 3), dtype=np.uint64)   # pending at the last take
        self._tail = 0                      # the ring's next slot to take
        self._pages_base = 0

    @classmethod
    def create(cls, tracepoint_id: int, offsets: dict[str, int], *, ino: int,
               sdev: int | None, exclude_tid: int | None, pages_per_block: int,
               nblocks: int, added: tuple[int, dict[str, int]] | None = None) -> ReadCounter:
        """Load and attach the program; ``BpfUnavailable`` with the reason otherwise.
        ``added``: the insertion tracepoint's id and record layout, to time the misses
        (``added_program``)."""
        nslots = int(nblocks) + FIRST_BLOCK + chunks_of(nblocks)
        if nslots > MAX_SLOTS:
            raise BpfUnavailable(f"{nblocks} blocks need more than {MAX_SLOTS} counters")
        fds: list[int] = []

        def array(value_size: int, entries: int) -> tuple[int, mmap.mmap]:
            attr = struct.pack("<IIIII", _MAP_ARRAY, 4, value_size, entries, _F_MMAPABLE)
            fd = libc.bpf(_BPF_MAP_CREATE, attr, "BPF_MAP_CREATE")
            fds.append(fd)
            size = -(-value_size * entries // mmap.PAGESIZE) * mmap.PAGESIZE
            return fd, mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        def attach(tp_id: int, code: bytes, name: bytes) -> None:
            prog_fd = libc.bpf_prog_load(_PROG_TRACEPOINT, code, name)
            fds.append(prog_fd)
            event_fd = libc.perf_event_open(_perf_attr(tp_id), -1, 0, -1,
                                            _PERF_FLAG_FD_CLOEXEC)
            fds.append(event_fd)
            try:
                libc.ioctl(event_fd, _IOC_SET_BPF, prog_fd, "PERF_EVENT_IOC_SET_BPF")
            except SyscallError as exc:
                if exc.errno == errno.E2BIG:
                    raise BpfUnavailable(TRACEPOINT_FULL) from None
                raise
            libc.ioctl(event_fd, _IOC_ENABLE, 0, "PERF_EVENT_IOC_ENABLE")
        mems: list[mmap.mmap] = []
        try:
            map_fd, counters = array(8, nslots)
            mems.append(counters)
            sample_fd, samples = array(8 * (S_PEND + 4 * PEND_SLOTS), 1)
            mems.append(samples)
            miss_fd = misses = None
            if added is not None:
                miss_fd, misses = array(8 * (M_PEND + 4 * MISS_SLOTS), 1)
                mems.append(misses)
                attach(added[0], added_program(added[1], miss_fd=miss_fd, ino=ino, sdev=sdev,
                                               exclude_tid=exclude_tid), b"vmdt_added")
            attach(tracepoint_id,
                   program(offsets, map_fd=map_fd, ino=ino, sdev=sdev,
                           exclude_tid=exclude_tid, pages_per_block=pages_per_block,
                           nblocks=nblocks, sample_fd=sample_fd, miss_fd=miss_fd),
                   b"vmdt_reads")
        except (SyscallError, OSError, BpfUnavailable) as exc:
            for mem in mems:
                mem.close()
            for fd in fds:
                os.close(fd)
            raise BpfUnavailable(str(exc)) from None
        return cls(fds[::-1], counters, samples, int(nblocks), int(pages_per_block), misses)

    def set_probe(self, tid: int | None) -> None:
        """Reads by thread ``tid`` count as the probe's from now (None: nobody's)."""
        self._slots[PROBE_TID] = np.uint64(0 if tid is None else tid)

    def pending(self) -> bool:
        """Whether a read was counted since the last ``take``: the chunks' counts and the
        probe's and beyond's slots, not the blocks'."""
        return (not np.array_equal(self._chunks, self._chunks_base)
                or not np.array_equal(self._slots[PROBE_HITS:FIRST_BLOCK].astype(np.uint32),
                                      self._base[PROBE_HITS:FIRST_BLOCK]))

    def take(self) -> tuple[np.ndarray, np.ndarray, int, int]:
        """Since the last take: the blocks read, how many read events each, the probe's
        reads and the reads beyond the blocks counted. Only the blocks of the chunks whose
        count moved are read: a drain costs what was read, not the image's size (a 64 GiB
        image's 65,539 counters were copied and scanned at every drain, read or not). A
        block counted after its chunk's count was read waits for the chunk's next read
        (the program counts the chunk after the blocks), never lost."""
        chunks = self._chunks.copy()
        moved = np.flatnonzero(chunks != self._chunks_base)
        self._chunks_base = chunks
        head = self._slots[:FIRST_BLOCK].astype(np.uint32)
        heads = (head - self._base[:FIRST_BLOCK]).astype(np.int64)     # modulo 2**32
        self._base[:FIRST_BLOCK] = head
        if not moved.size:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), \
                int(heads[PROBE_HITS]), int(heads[BEYOND])
        slots = (moved[:, None] * CHUNK + np.arange(CHUNK)).ravel()
        slots = slots[slots < self.nblocks] + FIRST_BLOCK
        now = self._slots[slots].astype(np.uint32)
        delta = (now - self._base[slots]).astype(np.int64)             # modulo 2**32
        self._base[slots] = now
        hit = np.flatnonzero(delta)
        return slots[hit] - FIRST_BLOCK, delta[hit], int(heads[PROBE_HITS]), int(heads[BEYOND])

    @property
    def times_misses(self) -> bool:
        """Whether the reads that waited for a page added are timed (``added_program``)."""
        return self._misses is not None

    def take_misses(self) -> tuple[int, int]:
        """Since the last take: ns the reads that waited for a page the thread added
        waited, summed, and how many (0, 0 without ``times_misses``)."""
        if self._misses is None or not self._misses.size:
            return 0, 0
        now = (int(self._misses[M_SUM]), int(self._misses[M_COUNT]))
        (w0, n0), self._misses_base = self._misses_base, now
        return now[0] - w0, now[1] - n0

    def sample_below(self, threshold: int) -> None:
        """Sample from now the pages whose hash is under ``threshold`` (0: none)."""
        self._sample[S_THRESHOLD] = np.uint64(max(0, int(threshold)))

    def take_samples(self) -> tuple[np.ndarray, int, int]:
        """Since the last take: the ranges read that the kernel sampled, in the order they
        were read (``(n, 2)``: first and last page; a page it sampled is a range of one, a
        range too long for it is whole: ``MissRatioCurve.feed_ranges`` samples both alike),
        every page read, and the ring's entries lost (it overran). A slot taken but not
        yet written (a read on another CPU at this moment) ends the take: it is the next's.
        The threads' ranges pending since the take before are taken too, after the ring's
        (a read racing with it may count one range twice, or drop one)."""
        head = int(self._sample[S_HEAD])
        lost = max(0, head - self._tail - RING)
        start = self._tail + lost
        idx = np.arange(start, head) & (RING - 1)
        vals = self._ring[idx]
        unwritten = np.flatnonzero(vals == 0)
        if unwritten.size:
            vals, idx = vals[:unwritten[0]], idx[:unwritten[0]]
        if vals.size and vals[-1] & np.uint64(RANGE_FIRST):   # its last page: not yet
            vals, idx = vals[:-1], idx[:-1]
        self._ring[idx] = 0
        self._tail = start + vals.size
        pages = int(self._sample[S_PAGES])
        total, self._pages_base = pages - self._pages_base, pages
        ranges = decode_ring(vals)
        pend = self._pend[:, :3].copy()
        taken = np.flatnonzero((pend[:, 0] != 0) & (pend == self._seen).all(axis=1))
        self._seen = pend.copy()
        if taken.size:
            self._pend[taken, 0] = 0
            self._seen[taken] = 0
            flushed = pend[taken, 1:3].astype(np.int64)
            total += int((flushed[:, 1] - flushed[:, 0] + 1).sum())
            ranges = np.concatenate((ranges, flushed))
        return ranges, total, lost

    def past_span(self, blocks: np.ndarray, counts: np.ndarray,
                  ranges: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``take``'s blocks and counts with the blocks of the sampled ranges past the first
        ``span_blocks`` (which the program counted) added, once per range: a batch of a
        64 MiB read counts for every block it read, not its first 8 (a host service held 22
        MiB of such a zone of 64). A range that long always reaches the ring whole."""
        ranges = np.asarray(ranges, dtype=np.int64).reshape(-1, 2)
        ppb = self.pages_per_block
        b0 = ranges[:, 0] // ppb + span_blocks(ppb)
        b1 = np.minimum(ranges[:, 1] // ppb, self.nblocks - 1)
        keep = b1 >= b0
        if not keep.any():
            return blocks, counts
        n = b1[keep] - b0[keep] + 1
        extra = np.repeat(b0[keep] - (np.cumsum(n) - n), n) + np.arange(int(n.sum()))
        every, inverse = np.unique(np.concatenate((blocks, extra)), return_inverse=True)
        weights = np.concatenate((counts, np.ones(extra.size, dtype=np.int64)))
        return every, np.bincount(inverse, weights=weights).astype(np.int64)

    def close(self) -> None:
        """Detach and free the program and the maps; idempotent."""
        fds, self._fds = self._fds, []
        if fds:
            self._slots = self._chunks = np.zeros(0, dtype=np.uint64)
            self._base, self._chunks_base = np.zeros(0, dtype=np.uint32), self._slots
            self._sample = self._ring = np.zeros(0, dtype=np.uint64)
            self._misses = None if self._misses is None else np.zeros(0, dtype=np.uint64)
            for mem in self._mems:
                try:
                    mem.close()
                except BufferError:      # a view still exported: freed with it
                    pass
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass

