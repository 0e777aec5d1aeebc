"""Record a steady host: two disks read alike, without a pause, for a quarter of an hour
(the record tests/data/steady-two.jsonl.gz, read by tests/unit/test_verdict_steady.py).

Two 64 MiB data images, each read by fio at a steady rate, 4 KiB random reads,
90 % of them in the first tenth of the image (``zoned:90/10:10/90``), the
daemon serving both under one budget the size of what their curves want
together (``MAX_HOLD``), with the trace source and ``VMDISKTOUCH_RECORD``.
Nothing the guests do changes: what the budget's advice says should not
either. On the code before issue 55 the verdicts of both disks and of the
host changed again and again, with the noise of the curves.

With ``--reports FILE`` the daemon's status file is also kept every 10 s, one
JSON document a line (the recorded reports of tests/unit/test_figures_agree.py);
``--code DIR`` runs the daemon of another checkout (the code before a change).

    .venv/bin/python -m tests.support.steady_host OUT [SECONDS] [--reports FILE] [--code DIR]
"""

from __future__ import annotations

import argparse
import gzip
import json
import pathlib
import subprocess
import sys
import tempfile
import time

from tests.support.daemon_proc import ROOT, DaemonProc, env_without_systemd
from tests.support.pagecache import data_image

MiB = 1 << 20
MAX_HOLD = "104M"
IOPS = 2000            # each disk's reads a second


def fio(image: str, seconds: int) -> subprocess.Popen:
    return subprocess.Popen(
        ["fio", "--name=steady", f"--filename={image}", "--rw=randread", "--bs=4k",
         "--ioengine=psync", "--direct=0", "--random_distribution=zoned:90/10:10/90",
         f"--rate_iops={IOPS}", "--time_based", f"--runtime={seconds}",
         "--output=/dev/null"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True)


def record_steady(workdir, record, seconds: int = 960, reports=None, code=ROOT) -> None:
    workdir = pathlib.Path(workdir)
    images = [data_image(workdir / f"{name}.raw", 64 * MiB) for name in "ab"]
    d = DaemonProc(workdir, images, "--uri", "", "--min-free", "0",
                   "--access-source", "trace", max_hold=MAX_HOLD, interval=2, cwd=code,
                   env={**env_without_systemd(), "VMDISKTOUCH_RECORD": str(record)})
    readers, kept = [], []
    try:
        d.wait_status(lambda s: s["host"]["cycle"] >= 1, "the first cycle")
        readers = [fio(x, seconds) for x in images]
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            time.sleep(10 if reports else 5)
            assert d.alive(), d.log_tail()
            if reports:
                kept.append(d.read_status())
        assert d.stop() == 0, d.log_tail()
    finally:
        for p in readers:
            if p.poll() is None:
                p.kill()
            p.wait()
        d.cleanup()
    if reports:
        with gzip.open(reports, "wt") as f:
            f.writelines(json.dumps(doc, separators=(",", ":")) + "\n" for doc in kept if doc)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="steady_host")
    p.add_argument("out")
    p.add_argument("seconds", nargs="?", type=int, default=960)
    p.add_argument("--reports")
    p.add_argument("--code", default=str(ROOT))
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        record_steady(tmp, a.out, a.seconds, a.reports, a.code)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
