"""The three PNGs of docs/reference.md, from real daemons: ``python -m tools.readme_pictures``.

The map and the heat map: a 1 GiB sparse image with data in 100 MiB-400 MiB
and 700 MiB-900 MiB (the rest is a hole); ``vmdisktouch run IMG --max-hold
128M --interval 1`` with both PNGs; for ``--seconds`` (20), a reader doing
random 4 KiB reads in 120-220 MiB (hot) and 720-780 MiB (warm), and a writer
rewriting a few O_DSYNC pages in 150-160 MiB every second. Then the daemon
is stopped and its last map and heat map are copied to
docs/img/readme-map.png and docs/img/readme-heat.png.

The host overview: then one daemon over three images under one 192M budget,
``vmdisktouch run vm1.raw db.raw seed.img --host-png``: the same image and
workload (the busy one), a 256 MiB data image read more lightly in 32-80
MiB, and a 196 KiB image nobody reads; for ``--seconds`` again, then its
last overview is copied to docs/img/readme-host.png. Runs as root (the trace
source) in about a minute.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from tests.support.common import MiB
from tests.support.images import evict, make_image

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def light_reader(path: str, seconds: float) -> None:
    """Random 4 KiB reads in 32-80 MiB, a few hundred a second."""
    rng = random.Random(11)
    fd = os.open(path, os.O_RDONLY)
    try:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for _ in range(100):
                os.pread(fd, 4096, 32 * MiB + rng.randrange(48 * MiB // 4096) * 4096)
            time.sleep(0.2)
    finally:
        os.close(fd)


def daemon(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "vmdisktouch", "run", *args, "--min-free",
                             "0", "--interval", "1", "--uri", ""],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)


def stop(proc: subprocess.Popen) -> bool:
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    if proc.returncode != 0:
        print(err, file=sys.stderr)
    return proc.returncode == 0


def guest(path: str, seconds: float) -> None:
    rng = random.Random(7)
    rd = os.open(path, os.O_RDONLY)
    wr = os.open(path, os.O_WRONLY | os.O_DSYNC)
    try:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for _ in range(2000):
                os.pread(rd, 4096, 120 * MiB + rng.randrange(100 * MiB // 4096) * 4096)
            for _ in range(300):
                os.pread(rd, 4096, 720 * MiB + rng.randrange(60 * MiB // 4096) * 4096)
            for _ in range(8):
                os.pwrite(wr, os.urandom(4096),
                          150 * MiB + rng.randrange(10 * MiB // 4096) * 4096)
            time.sleep(0.2)
    finally:
        os.close(rd)
        os.close(wr)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--dir", default="/var/tmp")
    args = ap.parse_args(argv)
    tmp = tempfile.mkdtemp(prefix="vmdt-", dir=args.dir)
    img = os.path.join(tmp, "vm1.raw")
    make_image(img, 1 << 30, data=[(100 * MiB, 300 * MiB), (700 * MiB, 200 * MiB)])
    out = {k: os.path.join(tmp, f"{k}.png") for k in ("map", "heat", "host")}
    proc = daemon([img, "--max-hold", "128M", "--map-png", out["map"],
                   "--heat-png", out["heat"]])
    try:
        guest(img, args.seconds)
        for k in ("map", "heat"):      # copied before the stop, which removes them
            shutil.copy(out[k], os.path.join(ROOT, "docs", "img", f"readme-{k}.png"))
    finally:
        ok = stop(proc)
    if not ok:
        return 1
    evict(img)
    db, seed = os.path.join(tmp, "db.raw"), os.path.join(tmp, "seed.img")
    make_image(db, 256 * MiB, sparse=False)
    make_image(seed, 196 << 10, sparse=False)
    proc = daemon([img, db, seed, "--max-hold", "192M", "--host-png", out["host"]])
    light = threading.Thread(target=light_reader, args=(db, args.seconds))
    light.start()
    try:
        guest(img, args.seconds)
    finally:
        light.join()
        ok = stop(proc)
    if not ok:
        return 1
    shutil.copy(out["host"], os.path.join(ROOT, "docs", "img", "readme-host.png"))
    shutil.rmtree(tmp, ignore_errors=True)
    print("wrote docs/img/readme-map.png, docs/img/readme-heat.png and docs/img/readme-host.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
