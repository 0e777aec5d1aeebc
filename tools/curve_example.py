"""The real example of docs/algorithm.md, "Reading a curve": two disks, two readers, one PNG.

Two 512 MiB images of random data (evicted), one daemon serving both
(``vmdisktouch run A B --uri '' --max-hold 192M --interval 2 --min-free 0
--host-png``), a reader of A going round a 96 MiB zone page by page at 3,000
reads a second, a reader of B reading 1,500 random pages a second over all of
it, for ``--seconds`` (75). Then ``vmdisktouch status`` of the last cycle, each
disk's curve, and the host PNG copied to ``--png`` (docs/img/curves-example.png).

    .venv/bin/python tools/curve_example.py [--seconds 75] [--png FILE] [--dir /var/tmp]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MiB = 1 << 20
PAGE = 4096
IMAGE = 512 * MiB


def reader(path: str, loop: tuple[int, int] | None, rate: float, seconds: float) -> None:
    """``rate`` reads of one page a second: round ``loop`` (offsets) in order, else at random."""
    fd = os.open(path, os.O_RDONLY)
    rnd = random.Random(1)
    off = loop[0] if loop else 0
    start = time.monotonic()
    n = 0
    while time.monotonic() - start < seconds:
        if loop:
            os.pread(fd, PAGE, off)
            off = loop[0] if off + PAGE >= loop[1] else off + PAGE
        else:
            os.pread(fd, PAGE, rnd.randrange(IMAGE // PAGE) * PAGE)
        n += 1
        ahead = n / rate - (time.monotonic() - start)
        if ahead > 0:
            time.sleep(ahead)
    os.close(fd)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=75.0)
    ap.add_argument("--png", default=os.path.join(ROOT, "docs", "img", "curves-example.png"))
    ap.add_argument("--dir", default="/var/tmp")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="vmdt-curve-example-", dir=args.dir)
    daemon = None
    try:
        paths = [os.path.join(work, f"{n}.raw") for n in "ab"]
        for p in paths:
            with open(p, "wb") as f:
                for _ in range(IMAGE // (8 * MiB)):
                    f.write(os.urandom(8 * MiB))
                f.flush()
                os.fsync(f.fileno())
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        png, status = os.path.join(work, "host.png"), os.path.join(work, "status.json")
        daemon = subprocess.Popen(
            [sys.executable, "-m", "vmdisktouch", "run", *paths, "--uri", "", "--max-hold",
             "192M", "--interval", "2", "--min-free", "0", "--host-png", png,
             "--status", status], cwd=ROOT, stdout=subprocess.DEVNULL,
            stderr=open(os.path.join(work, "daemon.log"), "w"))
        time.sleep(2)
        readers = [multiprocessing.Process(target=reader, args=(paths[0], (64 * MiB, 160 * MiB),
                                                                3000.0, args.seconds)),
                   multiprocessing.Process(target=reader, args=(paths[1], None, 1500.0,
                                                                args.seconds))]
        for r in readers:
            r.start()
        for r in readers:
            r.join()
        subprocess.run([sys.executable, "-m", "vmdisktouch", "status", "--dir", work],
                       cwd=ROOT, check=False)
        with open(status) as f:
            st = json.load(f)
        for d in st["disks"]:
            print(f"{os.path.basename(d['path'])}: curve " + ", ".join(
                f"{b / MiB:g}M {h:.2f}" for b, h in d["curve"] if b >= MiB))
        shutil.copyfile(png, args.png)
        print(f"the host PNG: {args.png}")
    finally:
        if daemon is not None:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(30)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
