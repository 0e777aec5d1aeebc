"""ringbuf: synthetic ring-buffer pages (built here, byte by byte, the way
kernel/trace/ring_buffer.c writes them) parsed back, plus a fuzz cross-check
against a plain record-by-record reference parser written from libtraceevent's
kbuffer-parse.c. The format texts are this kernel's (6.18, x86_64)."""

from __future__ import annotations

import random
import struct

import numpy as np
import pytest

from vmdisktouch.system.trace import ringbuf

HEADER_PAGE = """\
\tfield: u64 timestamp;\toffset:0;\tsize:8;\tsigned:0;
\tfield: local_t commit;\toffset:8;\tsize:8;\tsigned:1;
\tfield: int overwrite;\toffset:8;\tsize:1;\tsigned:1;
\tfield: char data;\toffset:16;\tsize:4080;\tsigned:0;
"""
HEADER_EVENT = """\
# compressed entry header
\ttype_len    :    5 bits
\ttime_delta  :   27 bits
\tarray       :   32 bits

\tpadding     : type == 29
\ttime_extend : type == 30
\ttime_stamp : type == 31
\tdata max type_len  == 28
"""
GET_PAGES = """\
name: mm_filemap_get_pages
ID: 599
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;
\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:unsigned long i_ino;\toffset:8;\tsize:8;\tsigned:0;
\tfield:dev_t s_dev;\toffset:16;\tsize:4;\tsigned:0;
\tfield:unsigned long index;\toffset:24;\tsize:8;\tsigned:0;
\tfield:unsigned long last_index;\toffset:32;\tsize:8;\tsigned:0;

print fmt: "dev=%d:%d ino=%lx ofs=%lld-%lld", REC->s_dev
"""
LAY = ringbuf.parse_layout(HEADER_PAGE, HEADER_EVENT)
FMT = ringbuf.parse_format(GET_PAGES)
F = FMT.fields
MASK27 = (1 << 27) - 1


# -- the page builder: records as the kernel writes them ---------------------------------

def payload(index: int, pid: int = 77, last: int | None = None, pad_to: int = 40) -> bytes:
    body = struct.pack("<HBBiQIxxxxQQ", FMT.id, 0, 0, pid, 1234, 3, index,
                       index if last is None else last)
    return body + bytes(pad_to - len(body))


def data(body: bytes, delta: int) -> bytes:
    """type_len 1..28: the length in words in the header; else type_len 0 + array[0]."""
    body += bytes(-len(body) % 4)
    if len(body) <= 4 * LAY.data_max:
        return struct.pack("<I", len(body) // 4 | delta << 5) + body
    return struct.pack("<II", delta << 5, len(body) + 4) + body


def extend(delta: int) -> bytes:
    return struct.pack("<II", 30 | (delta & MASK27) << 5, delta >> 27)


def stamp(ts: int) -> bytes:
    return struct.pack("<II", 31 | (ts & MASK27) << 5, (ts >> 27) & 0xFFFFFFFF)


def padding(total: int, delta: int = 1) -> bytes:
    """A discarded event (delta != 0) of ``total`` bytes, or with delta 0 the null padding."""
    return struct.pack("<II", 29 | delta << 5, total - 4) + bytes(total - 8)


def page(ts0: int, body: bytes, *, missed: int | None = None, stored: bool = True,
         commit: int | None = None) -> bytes:
    size = len(body) if commit is None else commit
    flags, tail = 0, b""
    if missed is not None:
        flags |= ringbuf.RB_MISSED_EVENTS
        if stored:
            flags |= ringbuf.RB_MISSED_STORED
            tail = struct.pack("<Q", missed)
    out = struct.pack("<Qq", ts0, size | flags) + body + tail
    assert len(out) <= LAY.page_bytes
    return out + bytes(LAY.page_bytes - len(out))


def parse(*pages: bytes) -> ringbuf.Records:
    return ringbuf.parse_pages(b"".join(pages), LAY)


# -- the reference: one record at a time, as kbuffer-parse.c -----------------------------

def reference(blob: bytes) -> tuple[list[int], list[int], int, int]:
    times, starts, missed, unknown = [], [], 0, 0
    for base in range(0, len(blob), LAY.page_bytes):
        ts, commit = struct.unpack_from("<QQ", blob, base)
        size = commit & ringbuf.COMMIT_MASK
        if commit & ringbuf.RB_MISSED_EVENTS:
            if commit & ringbuf.RB_MISSED_STORED:
                missed += struct.unpack_from("<Q", blob, base + 16 + size)[0]
            else:
                unknown += 1
        off, end = base + 16, base + 16 + size
        while off < end:
            (h,) = struct.unpack_from("<I", blob, off)
            t, delta = h & 31, h >> 5
            arr = struct.unpack_from("<I", blob, off + 4)[0] if off + 4 < len(blob) else 0
            if t == 29:
                if delta == 0:
                    break
                off += 4 + arr
            elif t == 30:
                ts += arr << 27 | delta
                off += 8
            elif t == 31:
                ts = ringbuf.fix_abs_ts(arr << 27 | delta, ts)
                off += 8
            elif t == 0:
                ts += delta
                times.append(ts)
                starts.append(off + 8)
                off += 4 + (arr + 3) // 4 * 4
            else:
                ts += delta
                times.append(ts)
                starts.append(off + 4)
                off += 4 + 4 * t
    return times, starts, missed, unknown


# -- tests -------------------------------------------------------------------------------

def test_the_layout_and_formats_are_read_from_the_tracefs_texts():
    assert (LAY.timestamp, LAY.commit.offset, LAY.commit.size) == (ringbuf.Field(0, 8, False), 8, 8)
    assert (LAY.data, LAY.page_bytes, LAY.padding, LAY.time_extend, LAY.time_stamp,
            LAY.data_max) == (16, 4096, 29, 30, 31, 28)
    assert ringbuf.parse_layout(HEADER_PAGE, HEADER_EVENT, 8192).page_bytes == 8192
    assert (FMT.id, FMT.name) == (599, "mm_filemap_get_pages")
    assert F["last_index"] == ringbuf.Field(32, 8, False) and F["common_pid"].signed
    with pytest.raises(ValueError):
        ringbuf.parse_layout(HEADER_PAGE, HEADER_EVENT.replace("27 bits", "26 bits"))


def test_data_records_take_the_page_time_plus_the_running_deltas_and_their_fields():
    r = parse(page(1_000, data(payload(5, last=9), 0) + data(payload(6), 7) + data(payload(8), 3)))
    assert r.ts.tolist() == [1_000, 1_007, 1_010]
    assert r.field(F["index"]).tolist() == [5, 6, 8]
    assert r.field(F["last_index"]).tolist() == [9, 6, 8]
    assert r.field(F["common_type"]).tolist() == [599] * 3
    assert r.field(F["common_pid"], np.array([1])).tolist() == [77]
    assert (r.missed, r.missed_unknown, r.bad_pages) == (0, 0, 0)


def test_padding_is_skipped_and_adds_no_time_and_a_null_padding_ends_the_page():
    body = data(payload(1), 5) + padding(48, delta=999) + data(payload(2), 4)
    r = parse(page(0, body + padding(16, delta=0) + data(payload(3), 1)))
    assert r.field(F["index"]).tolist() == [1, 2]
    assert r.ts.tolist() == [5, 9]


def test_time_extends_add_array_shifted_by_27_bits():
    big = (5 << 27) + 12345
    r = parse(page(10, data(payload(1), 2) + extend(big) + data(payload(2), 0)
                   + data(payload(3), 6)))
    assert r.ts.tolist() == [12, 12 + big, 18 + big]


def test_an_absolute_time_stamp_sets_the_clock_and_keeps_the_top_bits():
    now = 1_700_000_123_456_789   # 59 bits hold it
    r = parse(page(5, data(payload(1), 1) + stamp(now) + data(payload(2), 0)
                   + data(payload(3), 10)))
    assert r.ts.tolist() == [6, now, now + 10]
    high = 0xF8 << 56
    assert ringbuf.fix_abs_ts(123, high | 100) == high | 123
    assert ringbuf.fix_abs_ts(50, high | 100) == (high | 50) + (1 << 59)   # wrapped


def test_type_len_0_records_carry_their_length_in_the_next_word():
    long_body = payload(42, pad_to=120)               # > 112 bytes: type_len 0
    rec = data(long_body, 3)
    assert struct.unpack_from("<I", rec)[0] & 31 == 0
    r = parse(page(100, rec + data(payload(43), 2)))
    assert r.field(F["index"]).tolist() == [42, 43]
    assert r.ts.tolist() == [103, 105]
    assert r.start.tolist() == [16 + 8, 16 + len(rec) + 4]


def test_missed_events_flags_and_stored_counts():
    r = parse(page(0, data(payload(1), 0), missed=37),
              page(0, data(payload(2), 0), missed=0, stored=False),
              page(0, data(payload(3), 0)))
    assert (r.missed, r.missed_unknown) == (37, 1)
    assert r.field(F["index"]).tolist() == [1, 2, 3]


def test_each_page_restarts_from_its_own_time_stamp_and_empty_pages_are_fine():
    r = parse(page(1_000, data(payload(1), 1) + data(payload(2), 1)), page(50, b""),
              page(2_000, data(payload(3), 9)))
    assert r.ts.tolist() == [1_001, 1_002, 2_009]


def test_a_bad_commit_skips_the_page_only():
    r = parse(page(0, data(payload(1), 0), commit=5000), page(7, data(payload(2), 1)))
    assert r.bad_pages == 1 and r.field(F["index"]).tolist() == [2]
    overrun = data(payload(3), 0)
    r = parse(page(0, overrun, commit=len(overrun) - 8))     # its last record runs past
    assert r.bad_pages == 1 and len(r) == 0
    with pytest.raises(ValueError):
        ringbuf.parse_pages(b"\0" * 100, LAY)
    assert len(ringbuf.parse_pages(b"", LAY)) == 0


def random_page(rng: random.Random, ts0: int) -> bytes:
    body = b""
    while True:
        pick = rng.random()
        if pick < 0.70:
            rec = data(payload(rng.randrange(1 << 40), pad_to=rng.choice((40, 44, 120, 200))),
                       rng.randrange(1 << 27))
        elif pick < 0.80:
            rec = extend(rng.randrange(1 << 40))
        elif pick < 0.85:
            rec = stamp(ts0 + rng.randrange(1 << 45))
        else:
            rec = padding(rng.choice((8, 12, 48, 200)), delta=rng.randrange(1, 1 << 27))
        if len(body) + len(rec) > LAY.page_bytes - 16 - 8:
            break
        body += rec
    missed = rng.choice((None, None, rng.randrange(1, 1000)))
    return page(ts0, body, missed=missed, stored=rng.random() < 0.7)


@pytest.mark.parametrize("seed", range(8))
def test_random_pages_parse_exactly_as_the_reference_parser(seed):
    rng = random.Random(seed)
    blob = b"".join(random_page(rng, rng.randrange(1 << 50)) for _ in range(20))
    times, starts, missed, unknown = reference(blob)
    r = ringbuf.parse_pages(blob, LAY)
    assert r.ts.tolist() == times
    assert r.start.tolist() == starts
    assert (r.missed, r.missed_unknown, r.bad_pages) == (missed, unknown, 0)
    assert len(times) > 500


@pytest.mark.parametrize("offset, size, signed", [
    (0, 2, False), (2, 2, True), (4, 4, False), (8, 8, False), (12, 8, True), (13, 1, True),
    (6, 4, False), (2, 8, False), (5, 2, False)])
def test_a_field_reads_as_its_bytes_little_endian_at_any_offset(offset, size, signed):
    rng = np.random.default_rng(offset * 16 + size)
    buf = rng.integers(0, 256, 4 * 4096, dtype=np.uint8)
    start = 4 * rng.integers(0, (buf.size - 64) // 4, 500)       # payloads start on 4 bytes
    recs = ringbuf.Records(buf, np.zeros(start.size, np.int64), start, 0, 0)
    got = recs.field(ringbuf.Field(offset, size, signed))
    want = [int.from_bytes(buf[s + offset:s + offset + size].tobytes(), "little",
                           signed=signed) for s in start]
    assert got.dtype == np.dtype(f"<{'i' if signed else 'u'}{size}")
    assert got.tolist() == want
