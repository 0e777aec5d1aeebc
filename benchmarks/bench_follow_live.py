"""Following libvirt live: from a domain's start, destroy or a disk's hot-plug to the daemon's status.

Scenario (issue 16): a real libvirtd (started here unless one answers, as the
e2e tests do), ``--domains`` (4) domains of two raw ``cache=writethrough``
disks of ``--disk-size`` (128M) each, KVM, no guest OS, paused; one daemon
``vmdisktouch run --libvirt --uri qemu:///system --max-hold BUDGET --interval
5 --min-free 0`` (trace source where usable), with a budget (``--budget``,
256M) smaller than what the guests read. The guests' reads go through QEMU's
block layer, as a virtio-blk guest's do: ``qemu-io`` on each running
domain's first disk reads its first 64M once per cycle. The daemon's VmLck
is sampled every 0.2 s throughout.

Each of ``--rounds`` (3) rounds:

* **start**: a stopped domain is started (paused); measured until both its
  disks are in the status, then until one of them holds something;
* **hot-plug**: a USB disk is attached live to a running domain; measured
  until it is in the status; **unplug**: detached, until it is gone;
* **destroy**: a running domain is destroyed; measured until its disks are
  gone from the status (their holds are released with them).

Reported: the median and worst time of each event in seconds and in cycles,
and the worst VmLck against the budget. Targets: a domain started served
within one cycle, a destroyed one released within one cycle, a hot-plugged
disk served; VmLck never above the budget.

    .venv/bin/python benchmarks/bench_follow_live.py [--quick] [--doc]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.source_common import exit_on_sigterm, fmt, machine, publish  # noqa: E402
from tests.support.libvirt_env import (URI, DomainFactory, disk_xml, ensure_daemons,  # noqa: E402
                               qemu_io, stop_daemons, virsh)
from tests.support.pagecache import data_image  # noqa: E402
from tests.support.common import MiB  # noqa: E402
from tests.support.daemon_proc import DaemonProc, env_without_systemd  # noqa: E402
from vmdisktouch.sizes import parse_size  # noqa: E402

READ = "read 0 64M"


def served(st) -> dict[str, int]:
    """The status's disks: path -> held bytes."""
    return {x["path"]: x["held_bytes"] for x in st["host"]["disks"]}


class Sampler:
    """The daemon's VmLck every 0.2 s, and the guests' reads once per ``period``."""

    def __init__(self, d: DaemonProc, period: float):
        self.d, self.period = d, period
        self.worst, self.running = 0, set()
        self.lock, self.stop = threading.Lock(), threading.Event()
        self.errors: list[str] = []
        self.threads = [threading.Thread(target=f, daemon=True)
                        for f in (self._vmlck, self._reads)]
        for t in self.threads:
            t.start()

    def _vmlck(self):
        while not self.stop.wait(0.2):
            self.worst = max(self.worst, self.d.vmlck())

    def _reads(self):
        while not self.stop.wait(self.period):
            with self.lock:
                names = sorted(self.running)
            for name in names:
                try:
                    qemu_io(name, READ)
                except Exception as e:      # the domain was destroyed meanwhile
                    self.errors.append(str(e).splitlines()[0][:200])

    def close(self):
        self.stop.set()
        for t in self.threads:
            t.join(30)


def timed(d: DaemonProc, pred, what: str, timeout: float) -> float:
    t0 = time.monotonic()
    d.wait_status(pred, what, timeout=timeout)
    return time.monotonic() - t0


def run(args, tmp: Path) -> dict:
    ensure_daemons(tmp)
    factory = DomainFactory(tmp)
    images = [[data_image(tmp / f"d{i}-{t}.raw", args.disk_size) for t in ("vda", "vdb")]
              for i in range(args.domains)]
    plug = data_image(tmp / "plug.raw", args.disk_size)
    names = [factory.define([disk_xml("vda", a), disk_xml("vdb", b)], tag=f"follow{i}",
                            start=i % 2 == 0) for i, (a, b) in enumerate(images)]
    disks = dict(zip(names, images))
    running = {n for i, n in enumerate(names) if i % 2 == 0}
    d = DaemonProc(tmp, [], "--libvirt", "--uri", URI, "--min-free", "0", max_hold=args.budget,
                   interval=args.interval, status="host.json", env=env_without_systemd())
    s = Sampler(d, args.interval)
    times: dict[str, list[float]] = {k: [] for k in ("start", "held", "hot-plug", "unplug",
                                                     "destroy")}
    try:
        d.wait_status(lambda st: all(p in served(st) for n in running for p in disks[n]),
                      "the running domains' disks", timeout=120)
        with s.lock:
            s.running |= running
        time.sleep(2 * args.interval)
        wait = 6 * args.interval + 30
        for r in range(args.rounds):
            stopped = sorted(set(names) - running)[0]
            a, b = disks[stopped]
            virsh("start", stopped, "--paused")
            t0 = time.monotonic()
            d.wait_status(lambda st: a in served(st) and b in served(st), "started", wait)
            times["start"].append(time.monotonic() - t0)
            running.add(stopped)
            with s.lock:
                s.running.add(stopped)
            d.wait_status(lambda st: served(st).get(a, 0) > 0, "a hold", wait)
            times["held"].append(time.monotonic() - t0)

            host = sorted(running)[0]
            virsh("attach-disk", host, plug, "sdb", "--targetbus", "usb", "--driver", "qemu",
                  "--subdriver", "raw", "--cache", "writethrough", "--live")
            times["hot-plug"].append(timed(d, lambda st: plug in served(st), "plugged", wait))
            virsh("detach-disk", host, "sdb", "--live")
            times["unplug"].append(timed(d, lambda st: plug not in served(st), "unplugged",
                                         wait))

            victim = sorted(running - {stopped})[r % max(1, len(running) - 1)]
            with s.lock:
                s.running.discard(victim)
            virsh("destroy", victim)
            va, vb = disks[victim]
            times["destroy"].append(timed(d, lambda st: va not in served(st)
                                          and vb not in served(st), "destroyed", wait))
            running.discard(victim)
            print(f"  round {r + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s"
                                                  for k, v in times.items()), flush=True)
    finally:
        s.close()
        rc = d.stop()
        factory.cleanup()
    assert rc == 0, d.output()[-3000:]
    return {"times": times, "worst_vmlck": s.worst, "budget": args.budget,
            "interval": args.interval, "read_errors": s.errors[:5]}


def report(res: dict, args) -> str:
    iv = res["interval"]
    lines = ["| event | until | median | worst | worst, in cycles |", "|---|---|---|---|---|"]
    until = {"start": "both disks in the status", "held": "one of them holds (from the start)",
             "hot-plug": "the disk in the status", "unplug": "the disk gone",
             "destroy": "both disks gone, their holds released"}
    for k, v in res["times"].items():
        lines.append(f"| {k} | {until[k]} | {statistics.median(v):.2f} s | {max(v):.2f} s | "
                     f"{max(v) / iv:.2f} |")
    t = res["times"]
    ok = {"start": max(t["start"]) <= iv, "destroy": max(t["destroy"]) <= iv,
          "plug": max(t["hot-plug"]) <= iv, "lck": res["worst_vmlck"] <= res["budget"]}
    word = lambda x: "met" if x else "MISSED"  # noqa: E731
    lines += ["", f"Targets: a started domain served within one cycle ({iv:g} s): "
                  f"**{max(t['start']):.2f} s**, {word(ok['start'])}; a destroyed one released "
                  f"within one cycle: **{max(t['destroy']):.2f} s**, {word(ok['destroy'])}; a "
                  f"hot-plugged disk served: **{max(t['hot-plug']):.2f} s**, "
                  f"{word(ok['plug'])}; VmLck (every 0.2 s) never above the budget: worst "
                  f"**{fmt(res['worst_vmlck'])}** of {fmt(res['budget'])}, {word(ok['lck'])}."]
    return (f"Real libvirtd; {args.domains} domains of two {fmt(args.disk_size)} raw "
            f"writethrough disks (KVM, no guest OS, paused); `vmdisktouch run --libvirt --uri "
            f"{URI} --max-hold {fmt(args.budget)} --interval {iv:g} --min-free 0`; each running "
            f"domain's first disk read through QEMU (`qemu-io` `{READ}`) once per cycle; "
            f"{args.rounds} rounds of start, hot-plug, unplug, destroy.\n\n" + "\n".join(lines))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--domains", type=int, default=4)
    ap.add_argument("--disk-size", type=parse_size, default=128 * MiB)
    ap.add_argument("--budget", type=parse_size, default=256 * MiB)
    ap.add_argument("--interval", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=None, help="(3)")
    ap.add_argument("--quick", action="store_true", help="one round, 2 s cycles")
    ap.add_argument("--doc", action="store_true")
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.interval = args.rounds or 1, 2.0
    args.rounds = args.rounds or 3
    if args.domains < 3:
        ap.error("--domains: at least 3 (one to start, one to destroy, one to plug into)")
    exit_on_sigterm("bench_follow_live")
    print(f"{machine()}; {args.domains} domains, budget {fmt(args.budget)}, "
          f"interval {args.interval:g} s, {args.rounds} rounds", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="bench-follow-", dir="/var/tmp"))
    try:
        res = run(args, tmp)
    finally:
        stop_daemons()
        shutil.rmtree(tmp, ignore_errors=True)
    publish(report(res, args), res, args, "follow-live", "Following libvirt live")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
