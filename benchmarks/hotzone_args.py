"""bench_hotzone's command line: the options, their defaults and what follows from them.

``parse_args(argv, description)`` returns the options and the scenario list;
``section_name(a)`` is the section of ``docs/benchmarks/hotzone.md`` a run writes
(``hotzone``, ``hotzone-VARIANT``, with ``-nbd`` for ``--via nbd``), and the
default chart is ``docs/img/<section>.png``.
"""

from __future__ import annotations

import argparse
import os
import tempfile

from benchmarks.hotzone_report import DAEMONS, LABELS, SCENARIOS, VARIANT_TITLES
from benchmarks.hotzone_rounds import ORDERS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_CHART = os.path.join(ROOT, "docs", "img", "hotzone.png")


def section_name(a) -> str:
    return ("hotzone" if a.variant == "base" else f"hotzone-{a.variant}") + \
        ("-nbd" if a.via == "nbd" else "") + ("-holder-limit" if a.holder_limit else "")


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--duration", type=float, default=120.0, help="seconds per scenario (default 120)")
    p.add_argument("--image-size", default="4G", help="image size (default 4G)")
    p.add_argument("--hot-fraction", type=float, default=0.10, help="hot zone / image (default 0.10)")
    p.add_argument("--limit", default=None, help="cgroup limit (default: budget + 256M)")
    p.add_argument("--holder-limit", default=None, metavar="SIZE",
                   help="run the holders (the daemon, vmtouch) in a second cgroup v1 memory "
                        "group limited to SIZE, as on a host short of memory: the page cache "
                        "they load and no longer lock is then reclaimed at that limit instead "
                        "of staying cached in the host's free memory (default: no group)")
    p.add_argument("--neighbour-size", default="1G")
    p.add_argument("--neighbour-rate", default="200M", help="bytes/s (0 = no neighbour)")
    p.add_argument("--neighbour-pattern", default="randread", choices=("randread", "read"))
    p.add_argument("--interval", type=float, default=5.0, help="daemon --interval (default 5, its default)")
    p.add_argument("--daemon-args", default="", help="extra arguments for vmdisktouch run")
    p.add_argument("--tuned-args", default="", help="arguments of a fifth scenario 'tuned': "
                   "vmdisktouch with these extra options (e.g. '--decay 0.1 --threshold 0.05')")
    p.add_argument("--scenarios", default=None, help="comma-separated subset of "
                   + ",".join(SCENARIOS) + " (default: all; 'tuned' only with --tuned-args, "
                   "'rev' only with --compare-rev)")
    p.add_argument("--compare-rev", metavar="REV",
                   help="also run the daemon of commit REV (a temporary git worktree, removed "
                        "afterwards) as scenario 'rev', next to the current code, with the "
                        "same arguments; reports the ratio current / REV")
    p.add_argument("--via", default="file", choices=("file", "nbd"),
                   help="file: fio's psync engine on the image file (default); nbd: through "
                        "QEMU's block layer, qemu-nbd --cache=writethrough --aio=threads in "
                        "the group and fio's nbd engine on its unix socket")
    p.add_argument("--nbd-fsync", type=int, default=0, metavar="N",
                   help="--via nbd: fio's fsync=N, an NBD flush once N writes were issued "
                        "since the last one (with randrw: after every I/O); 0: none, the "
                        "writes are then synchronous through qemu-nbd's writethrough alone, "
                        "as a virtio-blk guest's writes are with cache=writethrough: the "
                        "default, 0)")
    p.add_argument("--rounds", type=int, default=1, metavar="K",
                   help="run the scenario list K times and report each scenario's median "
                        "and min-max of its steady IOPS across rounds (default 1)")
    p.add_argument("--order", default="ABBA", choices=ORDERS,
                   help="with --rounds: ABBA reverses the list on every other round "
                        "(default), ABAB keeps it")
    p.add_argument("--quick", action="store_true", help="2G image, 45 s per scenario; not written to the docs")
    p.add_argument("--no-doc", action="store_true", help="do not write docs/benchmarks/hotzone.md")
    p.add_argument("--keep-log", metavar="FILE",
                   help="copy the daemon's log (one line per cycle) of the last vmdisktouch "
                        "scenario here, and its status JSON of each cycle to FILE.status.jsonl")
    p.add_argument("--chart", default=DEFAULT_CHART,
                   help="default docs/img/SECTION.png (SECTION: hotzone[-VARIANT][-nbd])")
    p.add_argument("--tmpdir", default="/var/tmp", help="where the image goes (a real disk)")
    p.add_argument("--variant", default="base", choices=tuple(VARIANT_TITLES),
                   help="base; move (two hot zones that move halfway); write50 (50 %% writes); "
                        "bigset (a hot set twice the budget). Each writes its own section "
                        "and chart; variants run none, oracle and vmdisktouch by default")
    return p


def parse_args(argv, description: str):
    """(options, scenario names); also sets the labels of 'tuned' and 'rev'."""
    p = parser(description)
    a = p.parse_args(argv)
    if a.rounds < 1:
        p.error("--rounds must be at least 1")
    if a.nbd_fsync < 0:
        p.error("--nbd-fsync must be 0 or more")
    if a.quick:
        a.duration, a.image_size = min(a.duration, 45.0), "2G"
        a.no_doc = True
        if a.chart == DEFAULT_CHART:
            a.chart = os.path.join(tempfile.gettempdir(), "hotzone-quick.png")
    if a.chart == DEFAULT_CHART:
        a.chart = os.path.join(ROOT, "docs", "img", f"{section_name(a)}.png")
    if a.no_doc and a.chart.startswith(os.path.join(ROOT, "docs") + os.sep):
        a.chart = os.path.join(tempfile.gettempdir(), os.path.basename(a.chart))
    if a.scenarios is None:
        a.scenarios = ",".join(n for n in SCENARIOS if (n != "tuned" or a.tuned_args)
                               and (n != "whole" or a.variant == "base")
                               and (n != "rev" or a.compare_rev))
    names = [n for n in a.scenarios.split(",") if n]
    if a.compare_rev and "rev" not in names:
        names.append("rev")
    LABELS["tuned"] = f"vmdisktouch {a.tuned_args}"
    LABELS["rev"] = f"vmdisktouch @{a.compare_rev}"
    for n in names:
        if n not in SCENARIOS:
            p.error(f"unknown scenario {n!r}")
    if "rev" in names and not a.compare_rev:
        p.error("scenario 'rev' needs --compare-rev REV")
    if len(set(names)) != len(names):
        p.error("a scenario is named twice in --scenarios")
    if a.holder_limit and set(names) - set(DAEMONS) - {"none"}:
        p.error("--holder-limit puts the daemon in the holder group; the vmtouch scenarios "
                "(oracle, whole) do not run there: leave them out of --scenarios")
    return a, names
