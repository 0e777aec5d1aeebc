"""Record a host of three disks: the daemon serving three small data images under one
budget, with ``VMDISKTOUCH_RECORD=OUT``, while hot zones are read (the golden trace
tests/golden/policy/host-three.jsonl.gz; tests/e2e/test_record.py runs the same).

* disk ``a``: a zone of 8M at 8M read twice every cycle, 4K rewritten in it each cycle;
* disk ``b``: a zone of 16M at 32M read every cycle;
* disk ``c``: a zone of 8M at 0 read three times a cycle in the first half only.

The budget (24M) is less than the zones (32M): the shared selection chooses. Each
zone is a loop, whose curve is 0 below its size: the split gives ``c`` and ``a``
their zones (the most reads saved per slice) and ``b`` the rest by read rate, where
equal rates would leave one disk out for good. (The golden host-three was recorded
with each zone read once a cycle.)

    .venv/bin/python -m tests.support.golden_host OUT [CYCLES]
"""

from __future__ import annotations

import os
import pathlib
import sys
import tempfile

from tests.support.pagecache import data_image, read_range
from tests.support.daemon_proc import DaemonProc, env_without_systemd

MiB = 1 << 20


def record_host(workdir, record, cycles: int = 16) -> list[str]:
    """Run the daemon on three images in ``workdir`` for ``cycles`` cycles, recording to
    ``record``; returns the images' paths."""
    workdir = pathlib.Path(workdir)
    images = [data_image(workdir / f"{name}.raw", 64 * MiB) for name in "abc"]
    a, b, c = images
    d = DaemonProc(workdir, images, "--min-free", "0", max_hold="24M", interval=0.3,
                   env={**env_without_systemd(), "VMDISKTOUCH_RECORD": str(record)})
    try:
        fd = os.open(a, os.O_WRONLY)
        try:
            for i in range(cycles):
                for _ in range(2):
                    read_range(a, 8 * MiB, 8 * MiB)
                os.pwrite(fd, os.urandom(4096), (9 + i % 4) * MiB)
                read_range(b, 32 * MiB, 16 * MiB)
                for _ in range(3 if i < cycles // 2 else 0):
                    read_range(c, 0, 8 * MiB)
                d.wait_status(lambda s, i=i: s["host"]["cycle"] > i, f"cycle {i + 1}")
        finally:
            os.close(fd)
        assert d.stop() == 0, d.log_tail()
    finally:
        d.cleanup()
    return images


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        record_host(tmp, argv[0], *map(int, argv[1:2]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
