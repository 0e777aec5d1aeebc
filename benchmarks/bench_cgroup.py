"""A memory-limited VM group, its hot zone held by the daemon, then its own memory grows.

The scenario of the cgroup-aware holding issue, run side by side in one go:

* a cgroup v1 memory group limited to 256 MiB (``--limit``) plays the VM's
  (libvirt ``<memtune><hard_limit>``); a reader in it (the guest's QEMU)
  reads a 200 MiB hot zone of a 1 GiB data image over and over, so that
  zone is page cache charged to the group;
* after 10 s the daemon starts outside the group
  (``--max-hold 512M --interval 2 --min-free 0``) and holds the zone;
* 20 s later a process in the group allocates 205 MiB (80 % of the limit,
  as a guest's RAM use grows), touches it, and keeps it 10 s.

Three scenarios, each from a cold image in a fresh group: ``none`` (no
daemon), ``nocap`` (the daemon with ``--foreign-share 1``: no cap, the
behaviour before cgroup-aware holding) and ``vmdisktouch`` (the defaults).
Every 0.5 s it samples the group's ``unevictable`` bytes (what reclaim
cannot take, here the daemon's locks on the group's pages) and the daemon's
``VmLck``; it reports the maximum unevictable after the daemon took the zone
(against the cap), whether the allocation was OOM-killed, the group's
``oom_kill`` count and what the daemon recharged. Results go to the
``cgroup`` reading of ``docs/benchmarks/cgroup.md``.

    python benchmarks/bench_cgroup.py            # about 3 minutes
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.report import provenance, update_section  # noqa: E402
from tests.support.cgroup import MemoryCgroup  # noqa: E402
from tests.support.common import MiB  # noqa: E402
from tests.support.daemon_proc import DaemonProc  # noqa: E402
from tests.support.holders import zone_reader_argv  # noqa: E402
from tests.support.images import evict, make_image  # noqa: E402

ALLOCATOR = ("import mmap, sys, time\n"
             "n = int(sys.argv[1])\n"
             "m = mmap.mmap(-1, n)\n"
             "for o in range(0, n, 4096): m[o] = 1\n"
             "print('allocated', flush=True)\n"
             "time.sleep(float(sys.argv[2]))\n")


def run_scenario(name: str, image: str, args, tmp: str) -> dict:
    evict(image)
    zone = (64 * MiB, args.zone)
    out = {"scenario": name, "samples": []}
    with MemoryCgroup(f"bench-{name}", args.limit) as cg:
        cg.popen(zone_reader_argv(image, *zone))
        time.sleep(args.warm)
        daemon = None
        if name != "none":
            extra = ["--uri", "", "--min-free", "0"]
            if name == "nocap":
                extra += ["--foreign-share", "1"]
            daemon = DaemonProc(tmp, image, *extra, max_hold=512 * MiB, interval=2.0,
                                status=f"{name}.json", log=f"{name}.log")
        t0 = time.monotonic()
        alloc = None
        alloc_rc = None
        while time.monotonic() - t0 < args.hold + args.keep + 5:
            t = time.monotonic() - t0
            if alloc is None and t >= args.hold:
                alloc = cg.popen([sys.executable, "-c", ALLOCATOR, str(args.alloc),
                                  str(args.keep)], stdout=subprocess.PIPE, text=True)
            if alloc is not None and alloc_rc is None:
                alloc_rc = alloc.poll()
            out["samples"].append((round(t, 1), cg.unevictable_bytes(),
                                   daemon.vmlck() if daemon else 0))
            time.sleep(0.5)
        if alloc is not None and alloc_rc is None:
            alloc_rc = alloc.wait(timeout=30)
        out["alloc_rc"] = alloc_rc
        out["oom_kills"] = cg.oom_kills()
        status = daemon.read_status() if daemon else None
        out["recharged"] = (status or {}).get("charges", {}).get("recharged_bytes", 0)
        if daemon:
            daemon.stop()
    took = [u for t, u, h in out["samples"] if 5 <= t < args.hold]
    out["max_unevictable_held"] = max(took, default=0)
    out["max_unevictable"] = max((u for _t, u, _h in out["samples"]), default=0)
    out["max_vmlck"] = max((h for _t, _u, h in out["samples"]), default=0)
    return out


def table(results: list[dict], args) -> str:
    cap = int(0.1 * args.limit)
    rows = ["| scenario | max unevictable in the group, after the daemon took the zone | "
            "max VmLck of the daemon | recharged | allocation of "
            f"{args.alloc // MiB} MiB | group OOM kills |",
            "|---|---|---|---|---|---|"]
    for r in results:
        fate = "survived" if r["alloc_rc"] == 0 else f"killed (exit {r['alloc_rc']})"
        rows.append(f"| {r['scenario']} | {r['max_unevictable_held'] / MiB:.1f} MiB "
                    f"(all samples: {r['max_unevictable'] / MiB:.1f}) | "
                    f"{r['max_vmlck'] / MiB:.0f} MiB | {r['recharged'] / MiB:.0f} MiB | "
                    f"{fate} | {r['oom_kills']} |")
    return (f"Group limit {args.limit // MiB} MiB, hot zone {args.zone // MiB} MiB of a 1 GiB "
            f"image, the cap at the default `foreign_share` 0.1: {cap / MiB:.1f} MiB.\n\n"
            + "\n".join(rows) + "\n")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--limit", type=int, default=256 * MiB)
    p.add_argument("--zone", type=int, default=200 * MiB)
    p.add_argument("--alloc", type=int, default=205 * MiB)
    p.add_argument("--warm", type=float, default=10.0)
    p.add_argument("--hold", type=float, default=20.0)
    p.add_argument("--keep", type=float, default=10.0)
    p.add_argument("--no-doc", action="store_true")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-cgroup-", dir="/var/tmp") as tmp:
        image = make_image(os.path.join(tmp, "disk.img"), 1 << 30, sparse=False)
        results = [run_scenario(name, image, args, tmp)
                   for name in ("none", "nocap", "vmdisktouch")]
    text = table(results, args)
    print(text)
    print(json.dumps([{k: v for k, v in r.items() if k != "samples"} for r in results]))
    if not args.no_doc:
        update_section("cgroup", "## A memory-limited VM group: cgroup-aware holding\n\n"
                       + provenance() + "\n" + __doc__.split("\n\n", 1)[1].split("    python")[0]
                       + "\n" + text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
