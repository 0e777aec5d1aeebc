"""Checksum cost per cycle: ``BlockChecksums.update`` with share=1 against rotating shares.

The polling mode's write detection (``system/observe/checksums``) hashes the held
blocks every cycle. This benchmark holds ``--size`` bytes (default 1 GiB) of
a file of random data, pinned in the page cache (mmap + mlock in this
process, ``benchmarks.cached_state``), and runs ``--cycles`` cycles. Between
two cycles a guest-like writer rewrites ``--writes`` random 4 KiB pages
(``pwrite`` of random bytes, the path QEMU's writes take). In each cycle one
``BlockChecksums`` per share (``--shares``, default ``1,1/16``) runs
``update(held, size, skip_unwritten=True, share=s)``, as the daemon does,
in an order that rotates every cycle so that none always runs first; all
were given ``baseline`` of the held blocks first (the load).

Per share it prints the CPU time of ``update`` per cycle (``thread_time``:
user + system of this thread, so the copy out of the page cache counts),
the wall time, the bytes read (counted by wrapping ``files.pread_into``),
and the write reports: a written block is reported once per hash after the
write (share 1: every cycle it is written; a rotating share: once on its
turn, for all the writes since its last hash, hence fewer reports); the
worst delay between a block's oldest unreported write and its report is
printed (at most ``ceil(1/share) - 1`` cycles), and "pending" counts the
blocks written whose turn had not come when the run ended. A report of a
block not written, a delay past that bound or a pending block older than
it is printed as a failure.
The first ``ceil(1/min share)`` cycles are a warm-up (every rotation
reaches steady state) and are not timed.

Usage: .venv/bin/python benchmarks/bench_checksums.py [--size 1G] [--block 1M]
       [--cycles 64] [--writes 256] [--shares 1,1/16] [--dir /var/tmp]
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import sys
import tempfile
import time
from fractions import Fraction

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

from benchmarks.cached_state import cached  # noqa: E402
from vmdisktouch.sizes import format_size, parse_size  # noqa: E402
from vmdisktouch.system import files  # noqa: E402
from vmdisktouch.system.observe.checksums import BlockChecksums  # noqa: E402
from vmdisktouch.system.image import open_image  # noqa: E402

MiB = 1 << 20
PAGE = 4096


class ReadCounter:
    """Counts the bytes ``files.pread_into`` returns (the checksums' only read)."""

    def __init__(self):
        self.bytes = 0
        self._real = files.pread_into

    def __enter__(self):
        def pread_into(fd, buf, offset):
            got = self._real(fd, buf, offset)
            self.bytes += got
            return got
        files.pread_into = pread_into
        return self

    def __exit__(self, *exc):
        files.pread_into = self._real


def make_file(path: str, size: int) -> None:
    rng = np.random.default_rng(1)
    with open(path, "wb") as f:
        for off in range(0, size, 8 * MiB):
            f.write(rng.integers(0, 256, min(8 * MiB, size - off), dtype=np.uint8).tobytes())
        f.flush()
        os.fsync(f.fileno())


def run(args) -> None:
    size, bs = parse_size(args.size), parse_size(args.block)
    shares = [Fraction(s) for s in args.shares.split(",")]
    nblocks = -(-size // bs)
    held = np.arange(nblocks)
    warmup = math.ceil(1 / min(shares))
    rnd = random.Random(2)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        path = os.path.join(tmp, "disk.raw")
        make_file(path, size)
        wfd = os.open(path, os.O_WRONLY)
        with cached(path, [(0, size)]), open_image(path) as image, ReadCounter() as reads:
            sums = {s: BlockChecksums(image, bs) for s in shares}
            for s in shares:
                sums[s].baseline(held, size)
            cpu = {s: [] for s in shares}
            wall = {s: [] for s in shares}
            nread = {s: [] for s in shares}
            due = {s: {} for s in shares}          # block -> cycle of its oldest unreported write
            delay = {s: [] for s in shares}
            wrong = []                             # (share, cycle, block) reported, not written
            for cycle in range(warmup + args.cycles):
                for _ in range(args.writes):          # the guest, between two cycles
                    page = rnd.randrange(size // PAGE)
                    os.pwrite(wfd, os.urandom(PAGE), page * PAGE)
                    for s in shares:
                        due[s].setdefault(page * PAGE // bs, cycle)
                k = cycle % len(shares)
                for s in shares[k:] + shares[:k]:
                    before = reads.bytes
                    c0, w0 = time.thread_time(), time.perf_counter()
                    out = sums[s].update(held, size, skip_unwritten=True, share=float(s))
                    c1, w1 = time.thread_time(), time.perf_counter()
                    for block in held[out > 0].tolist():
                        if block in due[s]:
                            delay[s].append(cycle - due[s].pop(block))
                        else:
                            wrong.append((str(s), cycle, block))
                    if cycle >= warmup:
                        cpu[s].append(c1 - c0)
                        wall[s].append(w1 - w0)
                        nread[s].append(reads.bytes - before)
            last = cycle
            for s in sums.values():
                s.close()
        os.close(wfd)

    base = statistics.median(cpu[shares[0]])
    print(f"{format_size(size)} held in {nblocks} blocks of {format_size(bs)}, "
          f"{args.writes} random 4 KiB writes between cycles, {args.cycles} timed cycles "
          f"(after {warmup} warm-up), medians per cycle:")
    print(f"{'share':>6} {'CPU ms':>9} {'wall ms':>9} {'MiB read':>9} {'CPU ratio':>10} "
          f"{'reports':>8} {'max delay':>10} {'pending':>8}")
    for s in shares:
        c, w = statistics.median(cpu[s]) * 1e3, statistics.median(wall[s]) * 1e3
        limit = math.ceil(1 / s)
        late = [d for d in delay[s] if d >= limit] + \
            [d for d in due[s].values() if last - d >= limit]
        print(f"{str(s):>6} {c:9.2f} {w:9.2f} {statistics.median(nread[s]) / MiB:9.1f} "
              f"{base * 1e3 / c:9.1f}x {len(delay[s]):8d} {max(delay[s], default=0):10d} "
              f"{len(due[s]):8d}" + (f"  FAIL: {len(late)} late past {limit - 1}" if late else ""))
    if wrong:
        print(f"FAIL: blocks reported that were not written: {wrong}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="1G", help="held bytes (default 1G)")
    p.add_argument("--block", default="1M", help="block size (default 1M)")
    p.add_argument("--cycles", type=int, default=64, help="timed cycles (default 64)")
    p.add_argument("--writes", type=int, default=256, help="4 KiB writes per cycle (default 256)")
    p.add_argument("--shares", default="1,1/16", help="comma-separated, first is the baseline")
    p.add_argument("--dir", default="/var/tmp", help="where the file is made (default /var/tmp)")
    run(p.parse_args())


if __name__ == "__main__":
    main()
