"""``vmdisktouch advise``: watch disks for a while and say what host memory would buy them.

For disks the daemon does not serve, above all those QEMU opens with O_DIRECT
(``cache=none``: every read goes to the device): their reads and writes a
second, the share the page cache serves now, what a miss waits, the
miss-ratio curve (``core.mrc``, the daemon's own) and a sentence of advice
(``core.what_if``). Read-only: no disk, cache mode or page of the page cache
changes (``system.observe.io_watch``).

The disks are the PATHs given, or with ``--libvirt`` every disk of every
running domain (its cache mode tells which path its I/O takes). Each is
watched for ``--duration`` seconds (more than 0: ``watch_duration``);
Ctrl-C, SIGTERM or SIGHUP ends the watch early, removes its trace instances
and still reports what was seen (exit 128 + the signal's number: 130, 143,
129). The report is a table, ``--json``, and with ``--png`` a picture of the
curves. Every report is also kept at ``ADVICE_FILE`` for ``discover``'s
ADVICE column.

Its two files are outputs like ``run``'s (``adapters.outputs.path_problem``),
checked before the watch starts and again when written: never a disk image
(those watched, and with ``--libvirt`` every disk of every domain libvirt
knows), a symlink, a FIFO or any other file that is not what advise writes
(an advise report: a JSON object with its fields; a PNG), never in a
directory that does not exist. The one directory advise makes is the
default report's, ``/run/vmdisktouch`` (the project's runtime directory,
which the daemon's lock makes too), 0755, root's.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

from vmdisktouch.adapters import atomic
from vmdisktouch.adapters import advice_file
from vmdisktouch.adapters import outputs
from vmdisktouch.adapters.advice_file import ADVICE_FILE, advice_path
from vmdisktouch.core import advice, what_if
from vmdisktouch.system.trace.tracefs import PREFIX
import numpy as np

from vmdisktouch.errors import ConfigError, NotPermitted, UsageError, VmdtError
from vmdisktouch.sizes import parse_duration
from vmdisktouch.system import files
from vmdisktouch.system.image import open_image
from vmdisktouch.system.observe import io_watch
from vmdisktouch.system.observe.io_watch import (IOWatch, page_cache_read_time, paged_tracer,
                                                 switch_cost, scan_openers)
from vmdisktouch.system.observe.miss_cost import MissCost
from vmdisktouch.system.signals import LoopSignals

TICK = 2.0                                # s between drains (Ctrl-C ends a sleep at once)
EX_INACTIVE = 3                           # no disk was read in the window
DIRECT_MODES = ("none", "directsync")
DIRECT_BUFFER_KB = 8192       # per CPU: a second of 10k I/O a second without growing (which
BUFFERS_KB = 65536            # loses events); at most this over all the disks
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)   # each ends the watch early


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
                        help="how long to watch, more than 0 (default 60; 30s, 2m...; "
                             f"under {advice.ADVISE.seconds:g} s it says how much longer to "
                             "watch, not a size); "
                             "Ctrl-C, SIGTERM or SIGHUP ends it early with what was seen")
    parser.add_argument("--cache", choices=("auto", "none", "writethrough"), default="auto",
                        help="how QEMU opens the PATHs: none (O_DIRECT), writethrough "
                             "(the page cache), auto: read from the processes that have "
                             "them open (default)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--png", metavar="FILE", help="also draw the curves into FILE")
    parser.add_argument("--save", metavar="FILE",
                        help=f"keep the report in FILE for discover's ADVICE column "
                             f"(default: {ADVICE_FILE}, in the runtime directory; '' keeps "
                             f"none); FILE must be new or an earlier report, in a directory "
                             f"that exists")


def watch_duration(text: str) -> float:
    """``--duration`` in seconds: a duration (``sizes.parse_duration``) of more than 0, else
    ``ConfigError`` (78): a window of no time is no evidence."""
    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        raise ConfigError(f"bad value {text!r} for --duration: {exc}") from None
    if seconds <= 0:
        raise ConfigError(f"bad value {text!r} for --duration: the watch needs more than 0 s")
    return seconds


def _disks(args) -> tuple[list[dict], list[outputs.Protected]]:
    """The disks to watch: ``path``, ``name`` and ``cache`` (None: read it from the
    openers); and the files no output may replace: the PATHs, or every disk of every
    domain libvirt knows (running or not)."""
    if bool(args.paths) == bool(args.libvirt):
        raise UsageError("give PATHs or --libvirt, not " + ("both" if args.paths else
                                                             "neither"))
    if args.paths:
        cache = None if args.cache == "auto" else args.cache
        return ([{"path": p, "name": p, "cache": cache} for p in args.paths],
                [outputs.Protected.of_path(p, f"the disk image {p}") for p in args.paths])
    from vmdisktouch.adapters.libvirt import libvirt_disks
    conn = libvirt_disks.connect(args.libvirt)
    try:
        disks = libvirt_disks.list_disks(conn, with_units=False)
    finally:
        conn.close()
    return ([{"path": d.source, "name": f"{d.domain}/{d.target}", "cache": d.cache,
              "domain": d.domain, "target": d.target, "io": d.io}
             for d in disks if d.active and d.source and d.type in ("file", "block")
             and d.device == "disk"],
            [outputs.Protected.of_path(d.source, f"the disk {d.target} of domain {d.domain}")
             for d in disks if d.source])


def check_outputs(args, protected: list) -> None:
    """Refuse (``ConfigError``, 78) a ``--png`` or ``--save`` path that must not be written
    (``outputs.path_problem``: a disk, a link, a FIFO, a file advise does not write, a
    missing directory), or both naming one file; the default report's directory
    (the runtime directory) is made when missing."""
    if args.save is None:
        args.save = advice_path()
        try:
            os.close(files.open_dir(os.path.dirname(args.save), create=0o755))
        except OSError:
            pass                                    # path_problem says why, in one line
    outputs.check_named([(flag, key, path) for flag, key, path in
                         (("--png", "map_png", args.png), ("--save", "advise", args.save))
                         if path], [p for p in protected if p])


def _mode(disk: dict) -> str | None:
    """"direct", "paged", or None (nobody has it open: watch both). A disk the daemon
    serves (``daemon_pid``) and nobody else has open is watched through the page cache
    only: the daemon's own miss probe's ``O_DIRECT`` reads are the only direct ones."""
    cache = disk["cache"]
    if cache is not None:
        return "direct" if cache in DIRECT_MODES else "paged"
    seen = scan_openers(disk["path"])
    if seen.daemon is not None:
        disk["daemon_pid"] = seen.daemon
    if not seen.pids:
        return None if seen.daemon is None else "paged"
    return "direct" if any(seen.pids.values()) else "paged"


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
            why = direct_io.support(image)
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
    duration = watch_duration(args.duration)
    if duration < advice.ADVISE.seconds:
        print(f"vmdisktouch: advise: warning: --duration {args.duration} is under the "
              f"{advice.ADVISE.seconds:g} s an advice needs: it will say how much longer to "
              "watch, not a size", file=sys.stderr)
    disks, protected = _disks(args)
    if os.geteuid() != 0:
        raise NotPermitted("advise reads the kernel's tracepoints: run it as root")
    check_outputs(args, protected)
    # from here a stop signal only sets a flag: the watch ends, its instances are removed
    stop = LoopSignals(stop_signals=STOP_SIGNALS, reload_signal=None,
                       keep_ignored=True).install()
    try:
        return _advise(args, disks, duration, stop, protected)
    finally:
        stop.restore()


def _advise(args, disks: list[dict], duration: float, stop: LoopSignals,
            protected: list) -> int:
    watches, failed = [], {}
    # before any tracer: what a switch to cache=writethrough costs on this host
    costs = switch_cost([d["path"] for d in disks], stop=lambda: stop.stopping)
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
        interrupted = _wait(watches, duration, failed, stop)
    finally:
        for _, w in watches:
            w.close()
    report = _report(watches, failed, hit, costs, duration, interrupted)
    kept = _output(report, args, protected)
    if interrupted:
        return 128 + stop.stop_signal
    if not kept:
        return 1
    if watches and not any(d["reads_per_second"] > 0 for d in report["disks"]):
        print("vmdisktouch: advise: no disk was read during the window", file=sys.stderr)
        return EX_INACTIVE
    return 1 if failed or not watches else 0


def _wait(watches: list, duration: float, failed: dict, stop: LoopSignals) -> bool:
    """Drain every ``TICK`` until ``duration`` has passed; True when a stop signal
    (``STOP_SIGNALS``) ended it. A disk whose drain fails (its image gone, its instance
    removed) leaves ``watches`` for ``failed``, with why; the others go on."""
    end = time.monotonic() + duration
    while (left := end - time.monotonic()) > 0 and not stop.wait(min(TICK, left)):
        drain_all(watches, failed)
    drain_all(watches, failed)
    return stop.stopping


def drain_all(watches: list, failed: dict) -> None:
    """One drain of every watch; one that fails is closed and moved to ``failed``."""
    for d, w in list(watches):
        try:
            w.drain()
        except (OSError, VmdtError) as exc:
            failed[d["name"]] = f"the watch failed: {exc}"
            watches.remove((d, w))
            w.close()


def _report(watches, failed: dict, hit: float, costs: dict, duration: float,
            interrupted: bool) -> dict:
    out = []
    for d, w in watches:
        m = w.watched(hit, costs.get(d["path"]))
        curve = w.mrc.status(m.image_bytes, m.page_size)
        window = w.mrc.status(m.image_bytes, m.page_size, steady=False)["curve"]
        wants = w.mrc.wants(m.image_bytes, m.page_size)
        def forecast(adopt: bool, w=w, m=m, window=window, wants=wants):
            return what_if.forecast(
                m, window, lambda b: w.mrc.hit_ratio(b / m.page_size), wants,
                lambda b: what_if.hottest_share(w.block_reads, -(-b // io_watch.BLOCK)),
                lambda b: advice.of_curve(w.mrc, advice.ADVISE, b / m.page_size),
                adopt=adopt)
        f = forecast(False)
        # vmdisktouch adopt's (docs/adopt.md): a disk past the page cache, not libvirt's
        # io='native' (which adopt refuses)
        adopted = forecast(True) if not m.buffered and d.get("io") != "native" else None
        t = w.tally
        waits = w.read_waits_ns()
        out.append({
            "name": d["name"], "path": d["path"],
            **({"domain": d["domain"], "target": d["target"]} if "domain" in d else {}),
            **({"daemon_pid": d["daemon_pid"]} if d.get("daemon_pid") else {}),
            "cache": d["cache"] or cache_seen(d["mode"], m.buffered, t.reads),
            "seen_by": ("page cache" if m.buffered else "direct I/O"),
            "image_bytes": m.image_bytes, "seconds": round(t.seconds, 2),
            "reads_per_second": round(m.reads_per_second, 1),
            "writes_per_second": round(m.writes_per_second, 1),
            "read_bytes_per_second": round(t.read_bytes / max(t.seconds, 1e-9)),
            "hit_ratio_now": round(m.hit_ratio_now, 4),
            "miss_latency_us": None if m.miss is None else round(m.miss * 1e6, 1),
            "hit_latency_us": round(hit * 1e6, 2),
            "path_extra_us": None if m.path_extra is None else round(m.path_extra * 1e6, 1),
            "write_extra_us": None if m.write_extra is None else round(m.write_extra * 1e6,
                                                                       1),
            "miss_extra_us": None if m.miss_extra is None else round(m.miss_extra * 1e6, 1),
            "read_latency_us_p50_p99": ([round(float(x) / 1e3, 1)
                                         for x in np.percentile(waits, [50, 99])]
                                        if waits.size else None),
            "events_lost": t.lost, "wants_bytes": wants,
            **curve, "window_curve": window, "advice": {
                **f.to_json(), "advice": advice_file.sentence(f, m.image_bytes),
                "adopted": None if adopted is None else {
                    **adopted.to_json(), "advice": advice_file.sentence(adopted,
                                                                        m.image_bytes)}}})
    return {"duration_seconds": duration, "interrupted": interrupted,
            "watched_seconds": max([d["seconds"] for d in out] or [0.0]),
            "kernel": os.uname().release, "when": time.time(),
            "disks": out, "failed": failed}


def _keep(path: str, key: str, data: bytes, protected: list, what: str) -> bool:
    """Write an output (``--save``, ``--png``) checked again as it is replaced (someone may
    have put a file there during the watch); False, said in one line, when it failed."""
    try:
        atomic.write_bytes(path, data, check=lambda st: outputs.path_problem(
            path, key, [p for p in protected if p], probe_dir=False))
        return True
    except OSError as exc:
        print(f"vmdisktouch: advise: {what} not written to {path}: {exc.strerror or exc}",
              file=sys.stderr)
        return False


def _output(report: dict, args, protected: list) -> bool:
    """Save, print and draw the report; False when the PNG asked for was not written."""
    if args.save:
        _keep(args.save, "advise", (json.dumps(report, indent=2) + "\n").encode(), protected,
              "the report is")
    drawn = True
    if args.png is not None:
        import io
        from vmdisktouch.adapters.pictures.advise_render import advise_image
        buf = io.BytesIO()
        advise_image(report).save(buf, format="PNG")
        drawn = _keep(args.png, "map_png", buf.getvalue(), protected, "the picture is")
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return drawn
    rows = [("DISK", "CACHE", "READS/S", "WRITES/S", "FROM MEMORY", "MISS", "ADVICE")]
    for d in report["disks"]:
        miss = d["miss_latency_us"]
        rows.append((d["name"], d["cache"], f"{d['reads_per_second']:,.0f}",
                     f"{d['writes_per_second']:,.0f}", f"{d['hit_ratio_now']:.0%}",
                     "-" if miss is None else f"{miss:,.0f} µs", d["advice"]["advice"]))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1])
    for d in report["disks"]:
        a = d["advice"].get("adopted")
        if a and a["verdict"] in ("hold", "no_gain", "uniform") and d.get("domain"):
            print(f"{d['name']}: vmdisktouch adopt {d['domain']}/{d['target']}: {a['advice']}")
    for d in report["disks"]:
        e = d["advice"].get("evidence")
        if e and d["reads_per_second"] > 0:
            print(f"{d['name']}: evidence: {e['reads']:,} reads, {e['re_reads']:,} of them "
                  f"read again, in {e['window_seconds']:g} s")
    for name, why in sorted(report["failed"].items()):
        print(f"{name}: not watched: {why}")
    for d in report["disks"]:
        if d.get("daemon_pid"):
            print(f"{d['name']}: served by vmdisktouch (pid {d['daemon_pid']}): its own "
                  "descriptors are not taken for a guest's")
    if report["interrupted"]:
        print(f"(interrupted: {report['watched_seconds']:.1f} s watched of "
              f"{report['duration_seconds']:g})")
    return drawn
