"""Parse rate of ``vmdisktouch.system.trace.ringbuf``: events/s and µs per event.

Captures real ``trace_pipe_raw`` pages: a private tracefs instance records
``filemap:mm_filemap_get_pages`` of a scratch file while this process makes
``--events`` cached 4 KiB preads of it; the pages are then parsed
``--repeat`` times (the header walk and times, ``parse_pages``) and decoded
as ``TraceReader.drain`` does (``common_type``, ``index``, ``last_index``
gathered with numpy). Then the same number of reads through a real
``TraceReader`` and one timed ``drain()``, end to end (the reads from
``trace_pipe_raw``, parsing, decoding, sorting). Needs root and tracefs;
fails with one line otherwise.

    .venv/bin/python benchmarks/bench_ringbuf.py [--events 200000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)          # this checkout's code, not an installed one

from vmdisktouch.system.trace import ringbuf, tracefs  # noqa: E402
from vmdisktouch.system.trace.trace_reader import TraceReader  # noqa: E402

EVENT = "filemap/mm_filemap_get_pages"


def capture(n: int) -> tuple[bytes, ringbuf.Layout, ringbuf.EventFormat]:
    """``n`` real events of reads of a scratch file, as raw pages of all CPUs."""
    with tempfile.NamedTemporaryFile(dir="/var/tmp") as f:
        f.write(os.urandom(4 << 20))
        f.flush()
        st = os.fstat(f.fileno())
        dev = os.major(st.st_dev) << 20 | os.minor(st.st_dev)
        need_kb = n * 64 // 1024 + 4096      # every event could land on one CPU
        inst = tracefs.Instance.create(f"vdt_bench_{os.getpid()}",
                                       {EVENT: f"i_ino == {st.st_ino} && s_dev == {dev}"},
                                       buffer_kb=need_kb)
        try:
            lay = ringbuf.parse_layout(inst.header_page(), inst.header_event(),
                                       inst.subbuf_bytes())
            fmt = ringbuf.parse_format(inst.format_text(EVENT))
            fd = f.fileno()
            for k in range(n):
                os.pread(fd, 4096, (k % 1024) * 4096)
            pages = []
            for cpu in inst.cpus():
                pipe = inst.open_pipe(cpu)
                try:
                    while True:
                        try:
                            page = os.read(pipe, lay.page_bytes)
                        except BlockingIOError:
                            break
                        if not page:
                            break
                        pages.append(page)
                finally:
                    os.close(pipe)
        finally:
            inst.remove()
    return b"".join(pages), lay, fmt


def drain_rate(n: int) -> tuple[int, int, float]:
    """Events and seconds of one ``TraceReader.drain()`` after ``n`` cached reads."""
    with tempfile.NamedTemporaryFile(dir="/var/tmp") as f:
        f.write(os.urandom(4 << 20))
        f.flush()
        fd = f.fileno()
        with TraceReader(fd, name=f"vdt_bench_{os.getpid()}", buffer_kb=n * 64 // 1024 + 4096,
                         max_buffer_kb=n * 64 // 1024 + 4096) as reader:
            reader.drain()
            for k in range(n):
                os.pread(fd, 4096, (k % 1024) * 4096)
            t0 = time.perf_counter()
            events = reader.drain()
            return len(events.kind), events.lost, time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    try:
        data, lay, fmt = capture(args.events)
    except tracefs.TraceUnavailable as exc:
        print(f"bench_ringbuf: {exc}", file=sys.stderr)
        return 1
    pages = len(data) // lay.page_bytes
    best_parse = best_all = float("inf")
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        recs = ringbuf.parse_pages(data, lay)
        t1 = time.perf_counter()
        types = recs.field(fmt.fields["common_type"])
        which = (types == fmt.id).nonzero()[0]
        recs.field(fmt.fields["index"], which)
        recs.field(fmt.fields["last_index"], which)
        t2 = time.perf_counter()
        best_parse, best_all = min(best_parse, t1 - t0), min(best_all, t2 - t0)
    n = len(recs)
    print(f"{n} events in {pages} pages ({lay.page_bytes} B), best of {args.repeat}:")
    print(f"  parse_pages:           {n / best_parse:12,.0f} events/s  "
          f"{best_parse / n * 1e6:.3f} µs/event")
    print(f"  parse + 3 fields:      {n / best_all:12,.0f} events/s  "
          f"{best_all / n * 1e6:.3f} µs/event")
    got, lost, took = drain_rate(args.events)
    print(f"  TraceReader.drain():   {got / took:12,.0f} events/s  "
          f"{took / got * 1e6:.3f} µs/event  ({got} events, {lost} lost)")
    return 0 if n else 1


if __name__ == "__main__":
    sys.exit(main())
