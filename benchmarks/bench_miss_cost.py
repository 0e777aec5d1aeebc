"""The daemon's miss cost beside the guest's own miss latency (issue 55, part 2).

Scenario (``tests.support.miss_latency``): a 512 MiB non-sparse raw image,
evicted, served by ``vmdisktouch run IMG --uri '' --max-hold 8M --interval
0.5``; the guest is fio, 4 KiB random reads, ``psync``, ``O_DIRECT``, queue
depth 1 (every read a miss), with its own per-read completion latency log
(``--write_lat_log``, ``--log_avg_msec=0``). After 8 s of the window (16
cycles: the probe's 64 reads), the status file's ``miss_cost.seconds`` is
set beside fio's clat of the same 8 s: its median and its mean (the mean is
what a hit saves: the sum of the waits), and the mean less fio's wait for a
CPU (its tasks' run delay over the window, a read; the daemon's probe counts
none) outside the burst: the guest's figure the daemon's is held to.

Devices: ``fast``, the image on this machine's disk; ``loaded``, a loop
device (direct I/O) over it with another tenant's random reads always
queued (fio, libaio, iodepth 4); ``throttled``, the loop device behind the
blkio read throttle (400 reads a second), which fio at queue depth 1 fills.
Each without and with a burst (``--burst``: ``dd iflag=direct bs=1M`` of the
same device for 1.5 s in the middle of the window). ``--compare-rev REV``:
each case also with the daemon of commit REV, next to it.

Guests (``--guests``): ``direct``, fio with ``O_DIRECT`` as above, whose reads
the daemon cannot see (it probes); ``buffered``, fio reading through the page
cache as QEMU's ``cache=writethrough`` does, in a memory group of 64 MiB so
that most of its reads miss: the daemon times the guest's own misses
(``bpf_reads.added_program``), and fio's reads under 10 µs (hits) are left
out of its figures. ``--paths bpf,ring``: a buffered guest also with the daemon
without the eBPF capabilities (``setpriv``), its misses paired from the ring
buffer's events (``trace_reader.paired_misses``).

    .venv/bin/python benchmarks/bench_miss_cost.py [--devices fast,loaded,throttled]
        [--guests direct,buffered] [--paths bpf] [--rounds 1] [--compare-rev REV]
        [--dir /var/tmp]
"""

from __future__ import annotations

import argparse
import contextlib
import pathlib
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from tests.support.common import ROOT, without_bpf  # noqa: E402
from tests.support.miss_latency import device, measure  # noqa: E402
from tests.support.worktree import enter_rev_worktree  # noqa: E402


def ref(r) -> float:
    """The guest's figure, outside the burst: fio's mean clat less its wait for a CPU (the
    probe counts none of its own), or for a buffered guest its misses' mean clat (the
    daemon times them as the guest waited, its wait for a CPU after the read included)."""
    return r.fio_quiet_mean_us if r.buffered else r.fio_quiet_device_us


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--devices", default="fast,loaded,throttled")
    ap.add_argument("--guests", default="direct,buffered")
    ap.add_argument("--paths", default="bpf", help="bpf,ring: a buffered guest's misses "
                    "timed in the kernel, and from the ring buffer's events")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--compare-rev", metavar="REV")
    ap.add_argument("--dir", default="/var/tmp")
    args = ap.parse_args()
    rows = []
    with contextlib.ExitStack() as stack:
        daemons = [("this", ROOT)]
        if args.compare_rev:
            tree = enter_rev_worktree(stack, args.compare_rev, say=print)
            daemons.append((args.compare_rev, tree.path))
        tmp = pathlib.Path(stack.enter_context(tempfile.TemporaryDirectory(dir=args.dir)))
        print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
              f"{' '.join(sys.argv)}", flush=True)
        print("| device | guest | burst | daemon | daemon's miss cost µs | from | "
              "fio clat p50 µs | fio clat mean µs | fio's CPU wait µs | "
              "÷ the guest's figure | ÷ fio mean |"
              "\n|---|---|---|---|---|---|---|---|---|---|---|", flush=True)
        guests = [g for g in args.guests.split(",") if g != "buffered"]
        if "buffered" in args.guests.split(","):
            guests += ["buffered" if p == "bpf" else f"buffered-{p}"
                       for p in args.paths.split(",")]
        for _ in range(args.rounds):
            for kind in args.devices.split(","):
                with device(kind, tmp) as dev:
                    for guest in guests:
                        for burst in (False, True):
                            order = daemons if len(rows) % 2 == 0 else daemons[::-1]
                            for name, cwd in order:
                                r = measure(tmp, dev, kind, burst=burst, cwd=cwd,
                                            buffered=guest.startswith("buffered"),
                                            prefix=without_bpf() if guest.endswith("ring")
                                            else ())
                                rows.append((name, guest, r))
                                came = (f"{r.misses:,} misses" if r.misses
                                        else f"{r.probes} probes")
                                print(f"| {kind} | {guest} | {'yes' if burst else 'no'} | "
                                      f"{name} | {r.daemon_us:,.0f} | {came} | "
                                      f"{r.fio_median_us:,.0f} | {r.fio_mean_us:,.0f} | "
                                      f"{r.fio_cpu_wait_us:,.0f} | {r.daemon_us / ref(r):.2f} | "
                                      f"{r.daemon_us / r.fio_mean_us:.2f} |", flush=True)
    for kind in args.devices.split(","):
        for guest in guests:
            got = [r.daemon_us / ref(r) for n, g, r in rows
                   if n == "this" and g == guest and r.kind == kind]
            print(f"# {kind}, {guest}: this ÷ the guest's figure (``ref``) "
                  f"{min(got):.2f}-{max(got):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
