"""The kernel ring buffer's binary pages (``per_cpu/cpuN/trace_pipe_raw``), parsed.

Theory of operation. A read of ``trace_pipe_raw`` returns one sub-buffer
("page") of a CPU's ring buffer, consumed. Its layout is described by tracefs
itself, and nothing here is hard-coded that those files state:

* ``events/header_page``: ``u64 timestamp`` (the time of the page's first
  record), ``local_t commit`` (bytes of records after the header; bit 31,
  RB_MISSED_EVENTS, says events were lost before this page and bit 30,
  RB_MISSED_STORED, that their count, an unsigned long, follows the
  records), then ``data``;
* ``events/header_event``: each record starts with a 32-bit word,
  ``type_len:5`` (low bits) and ``time_delta:27``, and the numbers of the
  padding, time-extend and time-stamp types and the largest data type_len;
* ``events/GROUP/EVENT/format``: the payload's fields (offset, size, signed),
  ``common_type`` (the event's ID) first.

A record of type_len 1..28 carries ``4*type_len`` bytes of payload after its
header; type_len 0 gives the length in the next word (``array[0]``, counting
itself) and the payload after that; padding (29) is ``4 + array[0]`` bytes
(a padding with time_delta 0 is the empty rest of a page); a time extend
(30) adds ``array[0] << 27 | time_delta`` to the clock; a time stamp (31) sets
it (59 bits: the top 5 are taken from the current time). A data record's
time is the running time plus its time_delta; padding adds nothing
(``rb_update_read_stamp`` and ``ring_buffer_read_page`` in
kernel/trace/ring_buffer.c; libtraceevent's kbuffer-parse.c reads the same).

Speed: ``parse_pages`` walks the record headers in one tight Python loop over
a ``memoryview.cast("I")`` (only the header word and a table lookup per
record), then computes the times (a cumulative sum per page) and gathers the
payload fields with numpy. ``benchmarks/bench_ringbuf.py`` measures it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

RB_MISSED_EVENTS = 1 << 31
RB_MISSED_STORED = 1 << 30
COMMIT_MASK = RB_MISSED_STORED - 1
TS_MSB = 0xF8 << 56

_FIELD = re.compile(r"field:\s*([^;]*?);\s*offset:(\d+);\s*size:(\d+);\s*signed:(\d+);")


@dataclass(frozen=True)
class Field:
    offset: int
    size: int
    signed: bool


def parse_fields(text: str) -> dict[str, Field]:
    """The ``field:DECL; offset:N; size:N; signed:N;`` lines of a format file, by name."""
    out: dict[str, Field] = {}
    for m in _FIELD.finditer(text):
        name = re.sub(r"\[.*\]$", "", m.group(1).split()[-1]).lstrip("*")
        if name not in out:        # header_page names ``commit`` and ``overwrite`` at 8
            out[name] = Field(int(m.group(2)), int(m.group(3)), m.group(4) == "1")
    return out


@dataclass(frozen=True)
class EventFormat:
    id: int
    name: str
    fields: dict[str, Field]


def buffer_kb_for(events: int, formats) -> int:
    """KiB of one CPU's buffer that ``events`` records of the largest of ``formats`` fill:
    the payload rounded to 4 bytes and a record header (4 bytes, 8 with a length word), a
    quarter more for the sub-buffers' headers and the ends of sub-buffers left unfilled."""
    payload = max(f.offset + f.size for fmt in formats for f in fmt.fields.values())
    return -(-int(events) * (-(-payload // 4) * 4 + 8) * 5 // 4 // 1024)


def grown_kb(now_kb: int, want_kb: int, most_kb: int) -> int:
    """The buffer's next size: double ``now_kb``, doubled again until ``want_kb``, at most
    ``most_kb``."""
    new = now_kb * 2
    while new < want_kb:
        new *= 2
    return min(new, most_kb)


def parse_format(text: str) -> EventFormat:
    """An ``events/GROUP/EVENT/format`` file."""
    name = re.search(r"^name:\s*(\S+)", text, re.M)
    ident = re.search(r"^ID:\s*(\d+)", text, re.M)
    if not name or not ident:
        raise ValueError("not an event format file (no name: or ID: line)")
    return EventFormat(int(ident.group(1)), name.group(1), parse_fields(text))


@dataclass(frozen=True)
class Layout:
    """Where things are in a page and a record header (from header_page and header_event)."""

    timestamp: Field
    commit: Field
    data: int              # offset of the first record
    page_bytes: int        # bytes of one page as read
    type_bits: int = 5
    padding: int = 29
    time_extend: int = 30
    time_stamp: int = 31
    data_max: int = 28


def parse_layout(header_page: str, header_event: str, page_bytes: int | None = None) -> Layout:
    """The ``Layout`` of pages of ``page_bytes`` (default: the header_page's data end)."""
    f = parse_fields(header_page)
    if not {"timestamp", "commit", "data"} <= f.keys():
        raise ValueError("header_page lacks timestamp, commit or data")
    bits = dict(re.findall(r"^\s*(\w+)\s*:\s*(\d+)\s*bits", header_event, re.M))
    types = dict(re.findall(r"^\s*(\w+)\s*:\s*type\s*==\s*(\d+)", header_event, re.M))
    dmax = re.search(r"data max type_len\s*==\s*(\d+)", header_event)
    if bits.get("type_len") != "5" or bits.get("time_delta") != "27" or not dmax \
            or not {"padding", "time_extend", "time_stamp"} <= types.keys():
        raise ValueError("header_event is not the 5/27-bit record header this parser reads")
    return Layout(f["timestamp"], f["commit"], f["data"].offset,
                  page_bytes or f["data"].offset + f["data"].size, int(bits["type_len"]),
                  int(types["padding"]), int(types["time_extend"]), int(types["time_stamp"]),
                  int(dmax.group(1)))


@dataclass(frozen=True)
class Records:
    """The data records of some pages: time (ns of the trace clock) and payload offset."""

    buf: np.ndarray        # uint8: the pages
    ts: np.ndarray         # int64
    start: np.ndarray      # int64: byte offset of each payload in ``buf``
    missed: int            # lost events whose count the pages stored
    missed_unknown: int    # pages flagged "events lost before" without a count
    bad_pages: int = 0     # pages whose commit or records did not parse (rest skipped)

    def __len__(self) -> int:
        return int(self.ts.size)

    def field(self, f: Field, which: np.ndarray | None = None) -> np.ndarray:
        """One payload field of every record (or of ``which``: a mask or indices)."""
        start = self.start if which is None else self.start[which]
        kind = "i" if f.signed else "u"
        if f.size not in (1, 2, 4, 8):
            raise ValueError(f"field of {f.size} bytes is not an integer")
        if start.size == 0:
            return np.zeros(0, dtype=f"<{kind}{f.size}")
        # Payloads start on 4-byte boundaries: a field is read in the widest units (4, 2 or
        # 1 bytes) its offset and size allow, one gather per unit (two for a u64), not one
        # per byte.
        unit = next(u for u in (4, 2, 1) if f.offset % u == 0 and f.size % u == 0)
        words = self.buf.view(f"<u{unit}")
        at = (start + f.offset) // unit
        if unit == f.size:
            return words[at].view(f"<{kind}{f.size}")
        value = np.zeros(start.size, dtype=np.uint64)
        for k in range(f.size // unit):
            value |= words[at + k].astype(np.uint64) << np.uint64(8 * unit * k)
        return value.astype(f"<u{f.size}").view(f"<{kind}{f.size}")


def _step_table(lay: Layout) -> list[int]:
    """Words to skip per type_len; 0 for the types whose length is in ``array[0]``."""
    step = [0] * (1 << lay.type_bits)
    for t in range(1, lay.data_max + 1):
        step[t] = t + 1
    step[lay.time_extend] = step[lay.time_stamp] = 2
    return step


def _read_uint(buf, offset: int, size: int) -> int:
    return int.from_bytes(buf[offset:offset + size], "little")


def _walk(words, buf, lay: Layout, npages: int):
    """Header word positions of the non-padding records, per page; stored missed counts."""
    pos: list[int] = []
    append = pos.append
    step = _step_table(lay)
    mask, padding = (1 << lay.type_bits) - 1, lay.padding
    first, ts0 = [], []
    missed = unknown = bad = 0
    data_bytes = lay.page_bytes - lay.data
    for p in range(npages):
        base = p * lay.page_bytes
        first.append(len(pos))
        ts0.append(_read_uint(buf, base + lay.timestamp.offset, lay.timestamp.size))
        commit = _read_uint(buf, base + lay.commit.offset, lay.commit.size)
        size = commit & COMMIT_MASK
        if size > data_bytes or size % 4:
            bad += 1
            continue
        if commit & RB_MISSED_EVENTS:
            at = base + lay.data + size
            if commit & RB_MISSED_STORED and size + lay.commit.size <= data_bytes:
                missed += _read_uint(buf, at, lay.commit.size)
            else:
                unknown += 1
        i = (base + lay.data) >> 2
        end = i + (size >> 2)
        while i < end:
            h = words[i]
            s = step[h & mask]
            if s:
                append(i)
                i += s
                continue
            if i + 1 >= end:                       # a length word past the commit: corrupt
                bad += 1
                break
            if h & mask == padding:
                if not h >> lay.type_bits:         # null padding: the rest is empty
                    break
            else:
                append(i)                          # type_len 0: a long record
            i += 1 + ((words[i + 1] + 3) >> 2)
        if i > end:                                # the last record ran past the commit
            bad += 1
            if len(pos) > first[-1] and pos[-1] + _words(words, pos[-1], step, mask) > end:
                pos.pop()
    return pos, first, ts0, missed, unknown, bad


def _words(words, i: int, step: list[int], mask: int) -> int:
    """Length in words of the record at word ``i``."""
    return step[words[i] & mask] or 1 + ((words[i + 1] + 3) >> 2)


def fix_abs_ts(abs_ts: int, current: int) -> int:
    """An absolute time stamp's 59 bits with the 5 top bits of ``current`` (rb_fix_abs_ts)."""
    if current & TS_MSB:
        abs_ts |= current & TS_MSB
        if abs_ts < current:
            abs_ts += 1 << 59
    return abs_ts


def parse_pages(data, lay: Layout) -> Records:
    """Parse whole pages (``len(data)`` a multiple of ``lay.page_bytes``) into ``Records``."""
    buf = np.frombuffer(data, dtype=np.uint8)
    npages = buf.size // lay.page_bytes
    if npages * lay.page_bytes != buf.size:
        raise ValueError(f"{buf.size} bytes is not a whole number of {lay.page_bytes}-byte pages")
    if npages == 0:
        e = np.zeros(0, dtype=np.int64)
        return Records(buf, e, e.copy(), 0, 0)
    pos, first, ts0, missed, unknown, bad = _walk(memoryview(data).cast("B").cast("I"),
                                                  memoryview(data).cast("B"), lay, npages)
    w = np.frombuffer(data, dtype=np.uint32)
    p = np.array(pos, dtype=np.int64)
    hdr = w[p].astype(np.int64)
    tl = hdr & ((1 << lay.type_bits) - 1)
    delta = hdr >> lay.type_bits
    arr = w[np.minimum(p + 1, w.size - 1)].astype(np.int64)
    extended = (tl == lay.time_extend) | (tl == lay.time_stamp)
    contrib = np.where(extended, (arr << 27) | delta, delta)
    stamps = np.flatnonzero(tl == lay.time_stamp)
    contrib[stamps] = 0
    counts = np.diff(np.append(np.array(first, dtype=np.int64), p.size))
    page_of = np.repeat(np.arange(npages), counts)
    cs = np.cumsum(contrib)
    before = np.concatenate(([0], cs))[np.array(first, dtype=np.int64)]
    ts = (np.array(ts0, dtype=np.uint64).astype(np.int64) - before)[page_of] + cs
    if stamps.size:
        ends = np.cumsum(counts)
        for k in stamps:                           # rare: a forced absolute time stamp
            pg = page_of[k]
            now = int(ts[k - 1]) if k > first[pg] else int(ts0[pg])
            stamp = (int(arr[k]) << 27) | (int(hdr[k]) >> lay.type_bits)
            ts[k:ends[pg]] += fix_abs_ts(stamp, now) - now
    data_rec = tl <= lay.data_max
    start = 4 * (p + 1 + (tl == 0))
    return Records(buf, ts[data_rec], start[data_rec], missed, unknown, bad)


@dataclass(frozen=True)
class Events:
    """Decoded events (``trace_reader``), sorted by time."""
    kind: np.ndarray    # uint8, one of READ/WRITE/ADD/DELETE
    ts: np.ndarray      # int64, CLOCK_MONOTONIC ns (trace_clock mono)
    first: np.ndarray   # int64, first page index (in pages of ``libc.PAGE_SIZE`` bytes)
    last: np.ndarray    # int64, last page index, inclusive
    lost: int           # events the kernel reported lost since the previous drain (>= 0)
    # Reads counted per block in the kernel since the previous drain (``bpf_reads``), none
    # of them among the events above; None where reads are events.
    counted: CountedReads | None = None
    # Where reads are events: the reads that waited for a page their thread added, ns
    # waited and how many (``trace_reader.paired_misses``)
    miss_wait_ns: int = 0
    misses_timed: int = 0

    def __len__(self) -> int:
        return int(self.kind.size)


@dataclass(frozen=True)
class CountedReads:
    """Read events counted per block in the kernel (``bpf_reads``), up to ``ts``; and the
    ranges sampled for the miss-ratio curve (``core.mrc``)."""
    blocks: np.ndarray  # int64, the blocks read, sorted, unique
    counts: np.ndarray  # int64, the read events that touched each
    ts: int             # CLOCK_MONOTONIC ns when they were taken
    # the ranges the kernel sampled, (n, 2) first and last page, in order (``bpf_reads``)
    sampled: np.ndarray = field(default_factory=lambda: np.zeros((0, 2), dtype=np.int64))
    pages: int = 0      # every page read (the sample's denominator)
    samples_lost: int = 0   # entries the kernel's sample ring overran
    miss_wait_ns: int = 0   # the reads that waited for a page their thread added: ns waited
    misses_timed: int = 0   # and how many (``bpf_reads.added_program``)

    @property
    def total(self) -> int:
        return int(self.counts.sum())


def no_events(lost: int = 0) -> Events:
    z = np.zeros(0, dtype=np.int64)
    return Events(np.zeros(0, dtype=np.uint8), z, z.copy(), z.copy(), lost)


def time_order(parts: list[Events]) -> tuple[np.ndarray, np.ndarray]:
    """``parts``' times, concatenated, and the order that sorts them (stable: a CPU's own
    order kept among equal stamps)."""
    ts = np.concatenate([p.ts for p in parts]) if parts else np.zeros(0, np.int64)
    return ts, np.argsort(ts, kind="stable")


def concat_events(parts: list[Events], lost: int,
                  ts_order: tuple[np.ndarray, np.ndarray] | None = None) -> Events:
    """``parts`` as one Events in time order (``ts_order``: their ``time_order``, if known)."""
    if not parts:
        return no_events(lost)
    ts, order = time_order(parts) if ts_order is None else ts_order
    return Events(np.concatenate([p.kind for p in parts])[order], ts[order],
                  np.concatenate([p.first for p in parts])[order],
                  np.concatenate([p.last for p in parts])[order], lost)
