"""Profile the daemon's cycle in-process: where one cycle of a host of one disk spends its time.

The companion of bench_daemon_cost.py, for its missed targets: the same
cached state (a sparse image with ``--extents`` scattered 1 MiB extents of data,
read with buffered reads without readahead and mlocked by this process so
that the kernel's own reclaim cannot change them), and a `DiskWatcher` with
the daemon's defaults and ``--max-hold``. The clock is advanced by
``--interval`` per cycle, so decay and leases behave as in the daemon,
without waiting. It prints, per cycle, the wall and CPU time, what was
loaded and released, and then cProfile's top functions (by own time) over
``--profile-cycles`` further cycles.

    .venv/bin/python benchmarks/profile_cycle.py [--size 1T] [--extents 1000]
        [--max-hold 256M] [--cycles 12] [--profile-cycles 12]

The image is removed at the end.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

from benchmarks.cached_state import cached  # noqa: E402
from vmdisktouch.daemon.host import host_of
from vmdisktouch.config import settings  # noqa: E402
from vmdisktouch.daemon.build import build  # noqa: E402
from vmdisktouch.system.image import open_image  # noqa: E402
from vmdisktouch.sizes import format_size, parse_size  # noqa: E402

MiB = 1 << 20


def extents(size: int, count: int, seed: int) -> list[tuple[int, int]]:
    """``count`` scattered 1 MiB extents of an image of ``size`` bytes."""
    rng = np.random.default_rng(seed)
    return [(int(o) * MiB, MiB) for o in np.sort(rng.choice(size // MiB, count, replace=False))]


def profile(path: str, a: argparse.Namespace) -> None:
    """Run the cycles on ``path`` (its extents cached and pinned) and print the profile."""
    watcher = None
    try:
        cfg = settings.resolve({"path": path, "max_hold": a.max_hold, "interval": a.interval})
        now = [0.0]
        watcher = build(open_image(path), cfg, clock=lambda: now[0])
        host = host_of(watcher)

        def tick():
            now[0] += a.interval
            return host.tick()[0]

        print(f"{format_size(a.size)} sparse image, {a.extents} x 1 MiB extents pinned, "
              f"--max-hold {a.max_hold}, --interval {a.interval:g}")
        cpu_total = 0.0
        for _ in range(a.cycles):
            w0, c0 = time.perf_counter(), time.process_time()
            r = tick()
            wall, cpu = time.perf_counter() - w0, time.process_time() - c0
            if r.cycle > 1:
                cpu_total += cpu
            print(f"cycle {r.cycle:3d}: wall {wall * 1000:6.0f} ms  cpu {cpu * 1000:6.0f} ms  "
                  f"held {format_size(r.held_bytes):>6} in {len(r.regions):3d} regions  "
                  f"loaded {format_size(r.loaded_bytes):>6}  "
                  f"resident {format_size(r.resident_bytes)}  "
                  f"ranges re-read {watcher.tracker.last_reread}")
        if a.cycles > 1:
            per = cpu_total / (a.cycles - 1)
            print(f"mean CPU per cycle after the first: {per * 1000:.0f} ms = "
                  f"{per / a.interval * 100:.2f} % of one core at --interval {a.interval:g}")
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(a.profile_cycles):
            tick()
        prof.disable()
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(a.top)
        print(f"\ncProfile over {a.profile_cycles} cycles, by own time:")
        print("\n".join(line for line in out.getvalue().splitlines() if line.strip()))
    finally:
        if watcher is not None:
            watcher.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=parse_size, default=parse_size("1T"))
    ap.add_argument("--extents", type=int, default=1000)
    ap.add_argument("--max-hold", default="256M")
    ap.add_argument("--interval", type=float, default=5.0)
    ap.add_argument("--cycles", type=int, default=12, help="cycles shown one by one")
    ap.add_argument("--profile-cycles", type=int, default=12, help="cycles under cProfile")
    ap.add_argument("--top", type=int, default=18)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--dir", default="/var/tmp")
    a = ap.parse_args()

    fd_dir = tempfile.mkdtemp(prefix="vmdt-profile-", dir=a.dir)
    path = os.path.join(fd_dir, "disk.raw")
    with open(path, "wb") as f:
        f.truncate(a.size)
    try:
        with cached(path, extents(a.size, a.extents, a.seed), write=True):
            profile(path, a)
    finally:
        os.unlink(path)
        os.rmdir(fd_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
