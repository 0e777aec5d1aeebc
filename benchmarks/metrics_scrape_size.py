"""The size of a metrics scrape of a host of many disks, each with every figure set.

The disks are ``tests.support.full_reports.full_disk``: a libvirt domain's 64 GiB image
with a curve, the gain, the miss cost, the spill and an adoption, so each adds its
``SERIES_A_DISK`` series (the most a disk can). Printed per host size: the series, the
bytes of the text format (what node_exporter's textfile collector and the HTTP endpoint
serve), the bytes a disk adds, and the bytes gzipped (what the HTTP endpoint sends a
scraper that accepts gzip, as Prometheus does).

    .venv/bin/python benchmarks/metrics_scrape_size.py [--disks 1,10,100]
"""

from __future__ import annotations

import argparse
import gzip
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402

from benchmarks.source_common import machine  # noqa: E402
from tests.support.full_reports import full_host  # noqa: E402
from vmdisktouch.adapters.metrics.metrics import SERIES_A_DISK, Collector  # noqa: E402


def scrape(n: int) -> tuple[int, int, int]:
    """(series, bytes, bytes gzipped) of a scrape of a host of ``n`` full disks."""
    c = Collector()
    c.update(full_host(n))
    reg = CollectorRegistry()
    reg.register(c)
    text = generate_latest(reg)
    series = sum(1 for line in text.decode().splitlines() if line and line[0] != "#")
    return series, len(text), len(gzip.compress(text))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--disks", default="1,10,100", help="host sizes, comma-separated")
    args = ap.parse_args()
    print(f"{machine()}; {SERIES_A_DISK} series a disk at most")
    base = None
    for n in (int(x) for x in args.disks.split(",")):
        series, size, packed = scrape(n)
        base = base or (n, series, size)
        per = (size - base[2]) / (n - base[0]) if n > base[0] else size / n
        print(f"{n:4d} disks: {series:6d} series, {size / 1024:8.1f} KiB "
              f"({per / 1024:.1f} KiB a disk), gzipped {packed / 1024:.1f} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
