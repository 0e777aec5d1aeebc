"""``vmdisktouch advise``: watch disks for a while and say what host memory would buy them.

For disks the daemon does not serve, above all those QEMU opens with O_DIRECT
(``cache=none``: every read goes to the device): their reads and writes a
second, the share the page cache serves now, what a miss waits, the
miss-ratio curve (``core.mrc``, the daemon's own) and a sentence of advice
(``core.what_if``). Read-only: no disk, cache mode or page of the page cache
changes (``system.observe.io_watch``).

The disks are the PATHs given, or with ``--libvirt`` every disk of every
running domain (its cache mode tells which path its I/O takes). Each is
watched for ``--duration`` seconds; Ctrl-C ends the watch early and still
reports what was seen. The report is a table, ``--json``, and with ``--png`` a
picture of the curves. Every report is also kept at ``ADVICE_FILE`` for
``discover``'s ADVICE column.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from vmdisktouch.adapters import atomic
from vmdisktouch.adapters import advice_file
from vmdisktouch.adapters.advice_file import ADVICE_FILE
from vmdisktouch.core import what_if
from vmdisktouch.system.trace.tracefs import PREFIX
import numpy as np

from vmdisktouch.errors import ConfigError, NotPermitted, UsageError, VmdtError
from vmdisktouch.sizes import parse_duration
from vmdisktouch.system.image import open_image
from vmdisktouch.system.observe import io_watch
from vmdisktouch.system.observe.io_watch import (IOWatch, openers, page_cache_read_time,
                                                 paged_tracer)
from vmdisktouch.system.observe.miss_cost import MissCost

TICK = 2.0                                # s between drains (Ctrl-C ends a sleep at once)
EX_INACTIVE = 3                           # no disk was read in the window
DIRECT_MODES = ("none", "directsync")
DIRECT_BUFFER_KB = 8192       # per CPU: a second of 10k I/O a second without growing (which
BUFFERS_KB = 65536            # loses events); at most this over all the disks



def set_argparser(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Watch disk images for a while, changing nothing, and say per disk what host memory "
        "would buy it: its read and write rates, the share of reads the page cache serves "
        "now, what a miss waits, its miss-ratio curve and a sentence of advice. Disks QEMU "
        "opens with O_DIRECT (cache=none) are seen by the kernel's direct I/O tracepoints.")
    parser.add_argument("paths", nargs="*", metavar="PATH", help="disk image or block device")
    parser.add_argument("--libvirt", nargs="?", const="qemu:///system", metavar="URI",
                        help="every disk of every running domain (default URI: "
                             "qemu:///system)")
    parser.add_argument("--duration", default="60", metavar="SECONDS",
                        help="how long to watch (default 60; 30s, 2m...)")
    parser.add_argument("--cache", choices=("auto", "none", "writethrough"), default="auto",
                        help="how QEMU opens the PATHs: none (O_DIRECT), writethrough "
                             "(the page cache), auto: read from the processes that have "
                             "them open (default)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--png", metavar="FILE", help="also draw the curves into FILE")
    parser.add_argument("--save", default=ADVICE_FILE, metavar="FILE",
                        help=f"keep the report in FILE for discover's ADVICE column "
                             f"(default: {ADVICE_FILE}; '' keeps none)")


def _disks(args) -> list[dict]:
    """The disks to watch: ``path``, ``name`` and ``cache`` (None: read it from the openers)."""
    if bool(args.paths) == bool(args.libvirt):
        raise UsageError("give PATHs or --libvirt, not " + ("both" if args.paths else
                                                             "neither"))
    if args.paths:
        cache = None if args.cache == "auto" else args.cache
        return [{"path": p, "name": p, "cache": cache} for p in args.paths]
    from vmdisktouch.adapters.libvirt import libvirt_disks
    conn = libvirt_disks.connect(args.libvirt)
    try:
        disks = libvirt_disks.list_disks(conn, with_units=False)
    finally:
        conn.close()
    return [{"path": d.source, "name": f"{d.domain}/{d.target}", "cache": d.cache,
             "domain": d.domain, "target": d.target}
            for d in disks if d.active and d.source and d.type in ("file", "block")
            and d.device == "disk"]


def _mode(disk: dict) -> str | None:
    """"direct", "paged", or None (nobody has it open: watch both)."""
    cache = disk["cache"]
    if cache is not None:
        return "direct" if cache in DIRECT_MODES else "paged"
    who = openers(disk["path"])
    if not who:
        return None
    return "direct" if any(who.values()) else "paged"


def cache_seen(mode: str | None, buffered: bool, reads: int) -> str:
    """The cache mode a PATH's I/O showed: its openers' (``_mode``), else its reads' way;
    "-" when nobody had it open and nothing was read."""
    if mode is None and not reads:
        return "-"
    return "writethrough" if (mode == "paged" if mode else buffered) else "none"


def _watch(disk: dict, k: int, buffer_kb: int = DIRECT_BUFFER_KB) -> IOWatch:
    """Open the tracers of one disk (``DirectIOUnavailable`` and ``TraceUnavailable`` say
    why they cannot)."""
    from vmdisktouch.system.trace import direct_io
    image = open_image(disk["path"])
    direct = paged = probe = None
    mode = disk["mode"] = _mode(disk)
    name = f"{PREFIX}advise-{os.getpid()}-{k}"
    try:
        if mode in ("direct", None):
            why = direct_io.support(disk["path"])
            if why is not None and mode == "direct":
                raise direct_io.DirectIOUnavailable(why)
            if why is None:
                direct = direct_io.DirectIOTracer(image, name=name + "-d",
                                                  buffer_kb=buffer_kb)
        if mode in ("paged", None):
            paged = paged_tracer(image, name + "-p")
            probe = MissCost(image, 1 << 20)
    except BaseException:
        for x in (direct, paged, probe, image):
            if x is not None:
                x.close()
        raise
    return IOWatch(image, direct=direct, paged=paged, probe=probe)


def main(args) -> int:
    try:
        duration = parse_duration(args.duration)
    except ValueError as exc:
        raise ConfigError(f"bad value {args.duration!r} for --duration: {exc}") from None
    disks = _disks(args)
    if os.geteuid() != 0:
        raise NotPermitted("advise reads the kernel's tracepoints: run it as root")
    if args.png is not None:
        from vmdisktouch.adapters import outputs
        images = [outputs.Protected.of_path(d["path"], f"the disk image {d['path']}")
                  for d in disks]
        problem = outputs.path_problem(args.png, "map_png", [p for p in images if p])
        if problem:
            raise ConfigError(f"refusing --png {args.png}: {problem}")
    watches, failed = [], {}
    try:
        for k, d in enumerate(disks):
            try:
                watches.append((d, _watch(d, k, max(1024, min(DIRECT_BUFFER_KB,
                                                              BUFFERS_KB // len(disks))))))
            except VmdtError as exc:
                if args.paths:            # a PATH given by hand: it is the whole question
                    raise
                failed[d["name"]] = str(exc)
        if not disks:
            print(f"vmdisktouch: advise: no running domain at {args.libvirt} has a disk to "
                  "watch", file=sys.stderr)
            return EX_INACTIVE
        hit = page_cache_read_time()
        interrupted = _wait(watches, duration, failed)
    finally:
        for _, w in watches:
            w.close()
    report = _report(watches, failed, hit, duration, interrupted)
    _output(report, args)
    if args.png is not None:
        from vmdisktouch.adapters.pictures.advise_render import advise_image
        atomic.write_png(args.png, advise_image(report))
    if interrupted:
        return 130
    if watches and not any(d["reads_per_second"] > 0 for d in report["disks"]):
        print("vmdisktouch: advise: no disk was read during the window", file=sys.stderr)
        return EX_INACTIVE
    return 1 if failed or not watches else 0


def _wait(watches: list, duration: float, failed: dict) -> bool:
    """Drain every ``TICK`` until ``duration`` has passed; True when Ctrl-C ended it. A disk
    whose drain fails (its image gone, its instance removed) leaves ``watches`` for
    ``failed``, with why; the others go on."""
    end = time.monotonic() + duration
    try:
        while (left := end - time.monotonic()) > 0:
            time.sleep(min(TICK, left))
            drain_all(watches, failed)
    except KeyboardInterrupt:
        drain_all(watches, failed)
        return True
    drain_all(watches, failed)
    return False


def drain_all(watches: list, failed: dict) -> None:
    """One drain of every watch; one that fails is closed and moved to ``failed``."""
    for d, w in list(watches):
        try:
            w.drain()
        except (OSError, VmdtError) as exc:
            failed[d["name"]] = f"the watch failed: {exc}"
            watches.remove((d, w))
            w.close()


def _report(watches, failed: dict, hit: float, duration: float, interrupted: bool) -> dict:
    out = []
    for d, w in watches:
        m = w.watched(hit)
        curve = w.mrc.status(m.image_bytes, m.page_size)
        window = w.mrc.status(m.image_bytes, m.page_size, steady=False)["curve"]
        wants = w.mrc.wants(m.image_bytes, m.page_size)
        f = what_if.forecast(m, window,
                             lambda b, w=w, m=m: w.mrc.hit_ratio(b / m.page_size), wants,
                             lambda b, w=w: what_if.hottest_share(w.block_reads,
                                                                  -(-b // io_watch.BLOCK)))
        t = w.tally
        waits = w.read_waits_ns()
        out.append({
            "name": d["name"], "path": d["path"],
            **({"domain": d["domain"], "target": d["target"]} if "domain" in d else {}),
            "cache": d["cache"] or cache_seen(d["mode"], m.buffered, t.reads),
            "seen_by": ("page cache" if m.buffered else "direct I/O"),
            "image_bytes": m.image_bytes, "seconds": round(t.seconds, 2),
            "reads_per_second": round(m.reads_per_second, 1),
            "writes_per_second": round(m.writes_per_second, 1),
            "read_bytes_per_second": round(t.read_bytes / max(t.seconds, 1e-9)),
            "hit_ratio_now": round(m.hit_ratio_now, 4),
            "miss_latency_us": None if m.miss is None else round(m.miss * 1e6, 1),
            "hit_latency_us": round(hit * 1e6, 2),
            "read_latency_us_p50_p99": ([round(float(x) / 1e3, 1)
                                         for x in np.percentile(waits, [50, 99])]
                                        if waits.size else None),
            "events_lost": t.lost, "wants_bytes": wants,
            **curve, "window_curve": window, "advice": {**f.to_json(),
                                "advice": advice_file.sentence(f, m.image_bytes)}})
    return {"duration_seconds": duration, "interrupted": interrupted,
            "kernel": os.uname().release, "when": time.time(),
            "disks": out, "failed": failed}


def _output(report: dict, args) -> None:
    if args.save:
        try:
            os.makedirs(os.path.dirname(os.path.abspath(args.save)), mode=0o755,
                        exist_ok=True)
            atomic.write_json(args.save, report)
        except (OSError, VmdtError) as exc:
            print(f"vmdisktouch: advise: the report is not kept at {args.save}: {exc}",
                  file=sys.stderr)
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    rows = [("DISK", "CACHE", "READS/S", "WRITES/S", "FROM MEMORY", "MISS", "ADVICE")]
    for d in report["disks"]:
        miss = d["miss_latency_us"]
        rows.append((d["name"], d["cache"], f"{d['reads_per_second']:,.0f}",
                     f"{d['writes_per_second']:,.0f}", f"{d['hit_ratio_now']:.0%}",
                     "-" if miss is None else f"{miss:,.0f} µs", d["advice"]["advice"]))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1])
    for name, why in sorted(report["failed"].items()):
        print(f"{name}: not watched: {why}")
    if report["interrupted"]:
        print(f"(interrupted: {max([d['seconds'] for d in report['disks']] or [0]):.1f} s "
              f"watched of {report['duration_seconds']:g})")
