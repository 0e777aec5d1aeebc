"""The memory one served disk costs the daemon besides its held pages, and where it goes.

``--disks`` (1 and 21 by default) sparse images of ``--image-size`` (64 GiB, 1 MiB
blocks: 65,536) on ``--dir`` (/var/tmp), each with 8 extents of 4 MiB of data, are served
in-process by one ``daemon.host.Host`` as ``vmdisktouch run`` builds them
(``daemon.build.build``, the default access source: the trace source, with eBPF read
counts where the kernel allows), ``--cycles`` (6) cycles of 1 s; the first image is
read a little each cycle, the others are idle. Each host size runs in a process of
its own; after its cycles, ``malloc_trim(0)``, then VmRSS - VmLck of
``/proc/self/status``. The figure a disk costs is the difference between the two host
sizes divided by the disks added (the interpreter's and the libraries' own memory
cancels out). Printed too: the per-block arrays of one idle disk, found by walking its
objects, with the bytes resident of each (mincore over the array's pages), in bytes a
block.

The issue's target: at most 4 MiB a disk besides the held pages. A busy disk adds its
curve's sampler (``core.mrc``, bounded) on top of this; ``bench_host_cost`` measures
the whole daemon with busy disks.

    .venv/bin/python benchmarks/disk_memory.py [--disks 1,21] [--image-size 64G] [--cycles 6]
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import json
import mmap
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

from benchmarks.source_common import machine  # noqa: E402
from vmdisktouch.sizes import parse_size  # noqa: E402

EXTENTS, EXTENT = 8, 4 << 20


def make_images(directory: str, n: int, size: int) -> list[str]:
    paths = []
    for i in range(n):
        p = os.path.join(directory, f"disk{i}.raw")
        with open(p, "wb") as f:
            f.truncate(size)
            for k in range(EXTENTS):
                f.seek(k * (size // EXTENTS))
                f.write(os.urandom(EXTENT))
        paths.append(p)
    return paths


def _resident(a: np.ndarray, libc) -> int:
    """Bytes of ``a``'s pages resident in this process (mincore)."""
    page = mmap.PAGESIZE
    start = a.ctypes.data - a.ctypes.data % page
    length = a.ctypes.data + a.nbytes - start
    vec = ctypes.create_string_buffer(-(-length // page))
    if libc.mincore(ctypes.c_void_p(start), ctypes.c_size_t(length), vec) != 0:
        return a.nbytes
    return sum(b & 1 for b in vec.raw) * page


def arrays_of(root, libc) -> dict[str, int]:
    """Resident bytes of every array reachable from ``root`` by attribute, by path (each
    array once, under the first path found)."""
    seen: set[int] = set()
    out: collections.Counter = collections.Counter()

    def walk(o, path: str, depth: int) -> None:
        if id(o) in seen or depth > 9:
            return
        seen.add(id(o))
        if isinstance(o, np.ndarray):
            if o.nbytes and (o.base is None or not isinstance(o.base, np.ndarray)):
                out[path] += _resident(o, libc)
            return
        if isinstance(o, (int, float, str, bytes, bool, type(None))):
            return
        if isinstance(o, dict):
            for k, v in list(o.items())[:5000]:
                walk(v, f"{path}[{k if isinstance(k, str) else '…'}]", depth + 1)
            return
        if isinstance(o, (list, tuple, set, frozenset, collections.deque)):
            for v in list(o)[:5000]:
                walk(v, path + "[]", depth + 1)
            return
        fields = getattr(o, "__dict__", None)
        if fields is None and hasattr(o, "__slots__"):
            fields = {s: getattr(o, s, None) for s in o.__slots__}
        for k, v in (fields or {}).items():
            if k not in ("host", "ledger", "config", "clock"):
                walk(v, f"{path}.{k}", depth + 1)

    walk(root, "disk", 0)
    return dict(out)


def one_host(paths: list[str], cycles: int) -> dict:
    """Serve ``paths`` in this process for ``cycles`` cycles; the memory it then has."""
    from vmdisktouch.config import settings
    from vmdisktouch.daemon.build import build
    from vmdisktouch.daemon.host import Host
    from vmdisktouch.system.image import open_image

    libc = ctypes.CDLL(None, use_errno=True)
    cfg = settings.resolve({"max_hold": "1G", "interval": 1.0, "min_free": 0})
    watchers = [build(open_image(p), cfg, memcg="auto") for p in paths]
    host = Host(watchers, cfg.max_hold, cfg.block_size)
    try:
        fd = os.open(paths[0], os.O_RDONLY)
        size = os.fstat(fd).st_size
        for c in range(cycles):
            for k in range(200):                     # the first disk is read a little
                os.pread(fd, 4096, (k % EXTENTS) * (size // EXTENTS) + (k * 4096) % EXTENT)
            host.tick()
            time.sleep(1.0)
        os.close(fd)
        libc.malloc_trim(0)
        with open("/proc/self/status") as f:
            status = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f
                      if line.startswith(("VmRSS", "VmLck"))}
        idle = watchers[-1]
        return {"disks": len(paths), "rss_less_locked": status["VmRSS"] - status["VmLck"],
                "blocks": int(idle.policy.nblocks),
                "source": type(idle.source).__name__,
                "arrays": arrays_of(idle, libc) if len(paths) > 1 else {}}
    finally:
        host.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--disks", default="1,21", help="two host sizes (default 1,21)")
    ap.add_argument("--image-size", default="64G")
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--cycles", type=int, default=6)
    ap.add_argument("--child", nargs="*", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        print(json.dumps(one_host(args.child, args.cycles)))
        return 0
    small, large = (int(x) for x in args.disks.split(","))
    size = parse_size(args.image_size)
    with tempfile.TemporaryDirectory(prefix="vdt-diskmem-", dir=args.dir) as tmp:
        paths = make_images(tmp, large, size)
        runs = []
        for n in (small, large):
            out = subprocess.run([sys.executable, os.path.abspath(__file__), "--cycles",
                                  str(args.cycles), "--child", *paths[:n]],
                                 check=True, capture_output=True, text=True).stdout
            runs.append(json.loads(out.strip().splitlines()[-1]))
    a, b = runs
    per_disk = (b["rss_less_locked"] - a["rss_less_locked"]) / (large - small)
    blocks = b["blocks"]
    print(f"# {machine()}")
    print(f"# {large - small} idle disks of {args.image_size} ({blocks:,} blocks) added to "
          f"{small}; source {b['source']}; {args.cycles} cycles")
    print(f"rss less locked: {small} disks {a['rss_less_locked'] / 2**20:.1f} MiB, {large} "
          f"disks {b['rss_less_locked'] / 2**20:.1f} MiB")
    print(f"a disk costs {per_disk / 2**20:.2f} MiB ({per_disk / blocks:.1f} bytes a block); "
          f"target 4 MiB: {'met' if per_disk <= 4 * 2**20 else 'missed'}")
    arrays = sorted(b["arrays"].items(), key=lambda kv: -kv[1])
    total = sum(v for _, v in arrays)
    print(f"an idle disk's arrays: {total / 2**20:.2f} MiB ({total / blocks:.1f} bytes a block)")
    for path, v in arrays:
        if v >= 4096:
            print(f"  {v / 2**10:8.0f} KiB  {v / blocks:5.2f} B/block  {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
