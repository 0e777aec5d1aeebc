"""The two PNGs of the README, from a real daemon: ``python -m tools.readme_pictures``.

A 1 GiB sparse image with data in 100 MiB-400 MiB and 700 MiB-900 MiB (the
rest is a hole); ``vmdisktouch run IMG --max-hold 128M --interval 1`` with
both PNGs; for ``--seconds`` (20), a reader doing random 4 KiB reads in
120-220 MiB (hot) and 720-780 MiB (warm), and a writer rewriting a few
O_DSYNC pages in 150-160 MiB every second. Then the daemon is stopped and its
last map and heat map are copied to docs/img/readme-map.png and
docs/img/readme-heat.png. Runs as root (the trace source) in about 30 s.
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
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MiB = 1 << 20


def make_image(path: str) -> None:
    with open(path, "wb") as f:
        f.truncate(1 << 30)
        for start, length in ((100, 300), (700, 200)):
            f.seek(start * MiB)
            for _ in range(length):
                f.write(os.urandom(MiB))
        os.fsync(f.fileno())
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)


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
    tmp = tempfile.mkdtemp(prefix="vmdt-readme-", dir=args.dir)
    img = os.path.join(tmp, "vm1.raw")
    make_image(img)
    out = {k: os.path.join(tmp, f"{k}.png") for k in ("map", "heat")}
    proc = subprocess.Popen([sys.executable, "-m", "vmdisktouch", "run", img, "--max-hold",
                             "128M", "--min-free", "0", "--interval", "1", "--uri", "",
                             "--map-png", out["map"], "--heat-png", out["heat"]],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    try:
        guest(img, args.seconds)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    if proc.returncode != 0:
        print(err, file=sys.stderr)
        return 1
    for k, path in out.items():
        shutil.copy(path, os.path.join(ROOT, "docs", "img", f"readme-{k}.png"))
    shutil.rmtree(tmp, ignore_errors=True)
    print("wrote docs/img/readme-map.png and docs/img/readme-heat.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
