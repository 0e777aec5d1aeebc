"""Time MemcgReader.page_groups / page_mapcounts over 1 GiB held (mapped and mlocked).

Run as root from the project root:
    .venv/bin/python benchmarks/bench_memcg.py [DIR]

Writes a 1 GiB file of random data in DIR (default /var/tmp), drops it from
the page cache, reads it back with readahead (so its page cache is allocated
as reads allocate it), maps and mlocks it, then times each call 20 times and
prints the median and the minimum. The file is removed at the end.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from tests.support.images import evict, make_image  # noqa: E402
from tests.support.pagecache import read_range  # noqa: E402
from vmdisktouch.system import libc  # noqa: E402
from vmdisktouch.system.cgroup import memcg

SIZE = 1 << 30


def timed(call, repeat: int = 20) -> tuple[float, float]:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        call()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3, min(times) * 1e3


def main() -> None:
    fd_dir = sys.argv[1] if len(sys.argv) > 1 else "/var/tmp"
    path = tempfile.mktemp(prefix="vdt-bench-memcg-", dir=fd_dir)
    try:
        make_image(path, SIZE, sparse=False)
        evict(path)
        read_range(path, 0, SIZE, direct_readahead=True)
        fd = os.open(path, os.O_RDONLY)
        addr = libc.mmap_file(fd, 0, SIZE)
        try:
            libc.mlock(addr, SIZE)
            with memcg.MemcgReader() as r:
                assert r.available, r.reason
                inos = r.page_groups(addr, SIZE)
                pfns = r._pagemap(addr, SIZE // libc.PAGE_SIZE).view(np.int64) & memcg.PFN_MASK
                runs = int(np.count_nonzero(np.diff(pfns) != 1)) + 1
                print(f"{SIZE // libc.PAGE_SIZE} pages, {runs} runs of consecutive PFNs, "
                      f"groups {sorted(set(inos.tolist()))}, SPAN_GAP {memcg.SPAN_GAP}")
                for name in ("page_groups", "page_mapcounts"):
                    for step in (1, 16):
                        med, low = timed(lambda: getattr(r, name)(addr, SIZE, step))
                        print(f"{name} step {step:2d}: median {med:.1f} ms, min {low:.1f} ms")
                med, low = timed(lambda: r._pagemap(addr, SIZE // libc.PAGE_SIZE))
                print(f"  of which the pagemap pread: median {med:.1f} ms, min {low:.1f} ms")
        finally:
            libc.munmap(addr, SIZE)
            os.close(fd)
    finally:
        os.unlink(path)


if __name__ == "__main__":
    main()
