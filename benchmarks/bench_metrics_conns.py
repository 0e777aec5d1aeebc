"""The metrics listener under a flood of loopback connections (issue 31, case 3).

Scenario: a real daemon, ``vmdisktouch run IMG --max-hold 16M --min-free 256M
--interval 0.2 --decay 1 --uri '' --metrics-listen 127.0.0.1:PORT``, started
under ``prlimit --nofile=1024:1024`` (the default ``ulimit -n`` of a unit) and
a ``Type=notify`` supervisor played here: ``NOTIFY_SOCKET`` bound by this
process, ``WATCHDOG_USEC`` 2 s (so a ping is due at least every second). It
holds the 6 MiB hot zone of a 32 MiB data image (this process reads it until
VmLck > 0, then every 0.2 s, as a guest using it would). Then, one window of
``--window`` (10) seconds per scenario, in this order:

* ``none``: no other client;
* ``idle``: ``--conns`` (2,000) loopback connections opened in the first
  two seconds (non-blocking connects, 1,000 a second) that never send a byte;
* ``slowloris``: as many, each sending one more byte of an endless request
  header every second;
* ``after``: the clients of the floods closed: is everything back to normal?

Measured in each window: the connections this process got established and
those the daemon holds (its socket descriptors, the most seen), the daemon's
descriptors (most), its CPU (utime + stime, % of one core), the longest gap
between two status files (the status is rewritten every cycle: 0.2 s), the
longest gap between two ``WATCHDOG=1`` (the window's edges count as pings:
a daemon silent through the whole window shows the window), VmLck at the
start and its least (holds kept), and a scrape by a fresh client every 0.5 s
(served, failed, median and worst latency). Loopback only, bounded: at most
``--conns`` sockets, every window its length, the daemon stopped at the end.

``--compare-rev REV`` runs the same against REV's daemon (a ``git worktree``,
``tests.support.worktree``), side by side. ``--doc`` writes section ``metrics-conns``
of docs/benchmarks/metrics-conns.md (date, machine, command).

    .venv/bin/python benchmarks/bench_metrics_conns.py [--conns 2000] [--window 10]
        [--compare-rev REV] [--doc]

The harness (``serve``, ``window``) is ``tests/support/metrics_flood.py``; the fault
rows of ``tests/e2e/test_faults_metrics.py`` run it too and assert on its figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks.report import provenance, update_section  # noqa: E402
from tests.support.common import MiB, free_port  # noqa: E402
from tests.support.metrics_flood import ARGS, NOFILE, WATCHDOG_USEC, serve, window  # noqa: E402
from tests.support.pagecache import data_image  # noqa: E402

SCENARIOS = ("none", "idle", "slowloris", "after")


def run(label: str, cwd, args) -> list[dict]:
    out, port = [], free_port()
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="vmdt-bench-metrics-"))
        image = data_image(os.path.join(tmp, "disk.img"), 32 * MiB)
        d, notify = stack.enter_context(serve(tmp, image, port, cwd=cwd))
        for scenario in args.scenarios.split(","):
            r = window(d, notify, port, scenario, args.conns, args.window)
            r["daemon"] = label
            r["meminfo_failed"] = "cannot read /proc/meminfo" in d.output()
            print(line(r), flush=True)
            out.append(r)
            time.sleep(1.0)
    return out


# -- the report ------------------------------------------------------------------------------

def ms(v) -> str:
    return "–" if v is None else f"{v:.1f}"


def line(r: dict) -> str:
    return (f"{r['daemon']:>16} {r['scenario']:>9}: established {r['established']}, "
            f"daemon sockets ≤ {r['daemon_sockets_max']}, fds ≤ {r['daemon_fds_max']}, "
            f"CPU {r['cpu_pct']:.1f} %, status gap {r['status_gap_max_s']:.2f} s, "
            f"watchdog gap {r['watchdog_gap_max_s']:.2f} s, held {r['held_start'] >> 10} → "
            f"min {r['held_min'] >> 10} KiB, scrapes {r['scrapes_ok']} ok "
            f"{r['scrapes_failed']} failed (median {ms(r['scrape_median_ms'])} ms, "
            f"max {ms(r['scrape_max_ms'])} ms)")


def markdown(results: list[dict], args) -> str:
    rows = ["| daemon | clients | connections established | daemon's sockets (max) | "
            "daemon's fds (max) | daemon CPU | status gap (max) | watchdog gap (max) | "
            "held at start → least | scrapes served / failed | scrape latency median / max |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        clients = {"none": "none", "after": "none (after the floods)",
                   "idle": f"{r['conns']:,} idle", "slowloris": f"{r['conns']:,} slow-loris"}
        rows.append(
            f"| {r['daemon']} | {clients[r['scenario']]} | {r['established']:,} | "
            f"{r['daemon_sockets_max']} | {r['daemon_fds_max']} | {r['cpu_pct']:.1f} % | "
            f"{r['status_gap_max_s']:.2f} s | {r['watchdog_gap_max_s']:.2f} s | "
            f"{r['held_start'] / MiB:.1f} → {r['held_min'] / MiB:.1f} MiB | "
            f"{r['scrapes_ok']} / {r['scrapes_failed']} | {ms(r['scrape_median_ms'])} / "
            f"{ms(r['scrape_max_ms'])} ms |")
    return (
        "## Metrics listener under a connection flood\n\n"
        + provenance() + "\n"
        f"Issue 31, case 3. One daemon `vmdisktouch run IMG {' '.join(ARGS[:-1])} '' "
        "--metrics-listen 127.0.0.1:PORT` under `prlimit --nofile=1024:1024`, holding the "
        "6 MiB hot zone of a 32 MiB data image, its `NOTIFY_SOCKET` played by the benchmark "
        f"with `WATCHDOG_USEC={WATCHDOG_USEC}` (a ping due every second). A window of "
        f"{args.window:g} s per row, in order: no client; {args.conns:,} loopback "
        "connections that never send a byte; as many sending one byte of an endless header "
        "a second (slow-loris); no client again. Status gap: the longest time between two "
        "status files (written every 0.2 s cycle); watchdog gap: the longest time between "
        "two `WATCHDOG=1` (the window's edges count, so a silent daemon shows the window); "
        "a fresh client scrapes every 0.5 s (3 s timeout). Sockets and fds: the most the "
        "daemon had open at once (`/proc/PID/fd`); connections established: those whose "
        f"handshake completed, opened 1,000 a second.\n\n" + "\n".join(rows) + "\n\n"
        + summary(results) + "\n")


def summary(results: list[dict]) -> str:
    """One sentence per daemon: what the worst flood did to it."""
    out = []
    for label in dict.fromkeys(r["daemon"] for r in results):
        floods = [r for r in results if r["daemon"] == label and r["conns"]]
        if not floods:
            continue
        what = "current: this checkout's code (the selectors endpoint, at most 32 " \
            "connections, 5 s deadlines)" if label == "current" else \
            f"{label}: that commit's daemon (prometheus_client's start_http_server)"
        kept = all(r["held_min"] >= r["held_start"] for r in floods)
        out.append(
            f"* {what}: under the floods, holds {'kept' if kept else 'shed'} (least "
            f"{min(r['held_min'] for r in floods) / MiB:.1f} MiB), the status at most "
            f"{max(r['status_gap_max_s'] for r in floods):.2f} s apart, the watchdog at most "
            f"{max(r['watchdog_gap_max_s'] for r in floods):.2f} s, the daemon at most "
            f"{max(r['cpu_pct'] for r in floods):.1f} % of a core and "
            f"{max(r['daemon_fds_max'] for r in floods)} descriptors of {NOFILE}, "
            f"{sum(r['scrapes_failed'] for r in floods)} scrapes failed.")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--conns", type=int, default=2000)
    ap.add_argument("--window", type=float, default=10.0)
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--compare-rev", metavar="REV", help="also run REV's daemon (worktree)")
    ap.add_argument("--doc", action="store_true", help="write section metrics-conns")
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args(argv)
    if not 1 <= args.conns <= 10000 or not 1 <= args.window <= 120:
        ap.error("--conns 1..10000, --window 1..120 s")
    results = run("current", ROOT, args)
    if args.compare_rev:
        from tests.support.worktree import enter_rev_worktree
        with contextlib.ExitStack() as stack:
            tree = enter_rev_worktree(stack, args.compare_rev)
            label = f"@{args.compare_rev}" if tree.sha.startswith(args.compare_rev) \
                else f"@{args.compare_rev} ({tree.sha[:7]})"
            results += run(label, tree.path, args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    if args.doc:
        update_section("metrics-conns", markdown(results, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
