"""One budget for the host against a budget per disk: four VMs, one busy and three light.

Scenario (issue 16): four non-sparse images, each with the hot-zone guest of
bench_hotzone (``tools.fio.FioJob``: 4 KiB random I/O, 80 % reads, O_DSYNC
writes, iodepth 1, 90 % of the accesses in its hot zone): one *busy* VM (an
8 GiB image, a hot zone of ``--busy-hot`` (800 MiB), as fast as it can) and
three *light* ones (1 GiB images, hot zones of ``--light-hot`` (100 MiB),
``--light-iops`` (500) passed to fio's ``--rate_iops``, which caps reads and
writes each: 1,000 I/O per second in all, as measured), all at once, with a noisy
neighbour (fio random 64 KiB reads of its own 1 GiB file at 200 MiB/s), all
in one cgroup v1 memory group limited to ``--limit`` (768 MiB), so their
page cache competes. Scenarios, one after the other, each from a cold cache
for ``--duration`` s (120):

* ``none``: no holder;
* ``oracle``: ``vmtouch -l`` of exactly each hot zone (they fit in the
  budget), locked before t = 0;
* ``global``: one daemon, ``vmdisktouch run BUSY L1 L2 L3 --max-hold
  1200M`` (one budget, every disk's regions ranked together);
* ``split``: four daemons, one per image, ``--max-hold 300M`` each (the same
  total split evenly, as four per-disk units would be configured).

The daemons run outside the group, ``--interval 5 --uri ''``, their
defaults otherwise. Reported: the steady (second half) median of each VM's
IOPS and of their sum. Targets: global ≥ oracle, and ≥ 1.3 × split.

``--rounds K`` (1): the scenario list K times, reversed on every other round
(A B C D, D C B A: the shared disk here is noisy); the targets are then
taken on each scenario's median total across rounds, with its min–max.

``--compare-rev REV``: each daemon scenario (global, split) also runs with
the daemon of commit REV (``global-rev``, ``split-rev``: ``python -m
vmdisktouch run`` with its cwd a temporary git worktree of REV, removed
afterwards; same images, arguments and fio seed), right after its current
twin in each round (so A B, then B A on the reversed rounds); reported: each
headline figure now, at REV and current ÷ REV.

``--quick``: 45 s per scenario. ``--doc`` writes section "host-budget" of
docs/benchmarks.md.

    .venv/bin/python benchmarks/bench_host_budget.py [--quick] [--doc] [--rounds K]
        [--compare-rev REV]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.source_common import (  # noqa: E402
    add_compare_rev, exit_on_sigterm, fmt, machine, median, publish, ratio_text, round_orders,
    side_by_side, spread_text)
from tools.cgroup import MemoryCgroup  # noqa: E402
from tools.common import ROOT as CHECKOUT, GiB, MiB, stop_process  # noqa: E402
from tools.daemon_proc import DaemonProc, env_without_systemd  # noqa: E402
from tools.fio import FioJob, FioRun, start_neighbour  # noqa: E402
from tools.holders import VmtouchLock  # noqa: E402
from tools.images import evict, make_image  # noqa: E402
from tools.worktree import enter_rev_worktree  # noqa: E402
from vmdisktouch.sizes import parse_size  # noqa: E402

SCENARIOS = ("none", "oracle", "global", "split")
DAEMONS = ("global", "split")
REV = "-rev"            # global-rev, split-rev: the same with the daemon of --compare-rev
NAMES = ("busy", "light1", "light2", "light3")


def with_rev_twins(names: list[str]) -> list[str]:
    """``names`` with each daemon scenario followed by its ``-rev`` twin."""
    return [x for n in names for x in ((n, n + REV) if n in DAEMONS else (n,))]


def steady(fio: FioRun, start: float) -> float:
    v = [iv.iops for iv in fio.intervals if iv.t >= start]
    return statistics.median(v) if v else float("nan")


def one_scenario(name: str, vms: list[dict], nb_path: str, args, tmp: str, rnd: int,
                 rev_tree=None) -> dict:
    """One scenario from a cold cache; ``NAME-rev`` runs NAME with ``rev_tree``'s daemon."""
    kind = name[:-len(REV)] if name.endswith(REV) else name
    cwd = rev_tree.path if kind != name else CHECKOUT
    for vm in vms:
        evict(vm["path"])
    evict(nb_path)
    cg = MemoryCgroup(f"host-budget-{name}-{rnd}", args.limit).create()
    holders: list = []
    runs: list[FioRun] = []
    nb = None
    try:
        if kind == "oracle":
            for vm in vms:
                h = VmtouchLock(vm["path"], *vm["zone"])
                h.start()
                holders.append(h)
        elif kind == "global":
            holders.append(DaemonProc(tmp, [vm["path"] for vm in vms], "--uri", "",
                                      max_hold=args.budget, interval=5.0,
                                      status=f"status-{name}.json", log=f"daemon-{name}.log",
                                      env=env_without_systemd(), cwd=cwd))
        elif kind == "split":
            for vm in vms:
                holders.append(DaemonProc(tmp, vm["path"], "--uri", "",
                                          max_hold=args.budget // len(vms), interval=5.0,
                                          status=f"status-{name}-{vm['name']}.json",
                                          log=f"daemon-{name}-{vm['name']}.log",
                                          env=env_without_systemd(), cwd=cwd))
        if kind != name:
            print(f"  {name}: {len(holders)} daemon(s) of {rev_tree.rev}, cwd "
                  f"{holders[0].proc_cwd()}", flush=True)
        nb = start_neighbour(cg, nb_path, 200 * MiB, runtime=args.duration + 30)
        for vm in vms:
            extra = [] if vm["iops"] is None else [f"--rate_iops={vm['iops']}"]
            job = FioJob(vm["path"], vm["size"], [vm["zone"]], runtime=args.duration,
                         seed=20241122, name=f"{vm['name']}-{name}", extra=extra)
            runs.append(FioRun(job, cg, stderr_path=os.path.join(tmp, f"fio-{vm['name']}.err"))
                        .start())
        for r in runs:
            r.wait(args.duration + 60)
        held = sum(h.vmlck() for h in holders)
    finally:
        for r in runs:
            r.stop()
        if nb is not None:
            stop_process(nb)
        for h in holders:
            h.stop()
        cg.cleanup()
    per = {vm["name"]: steady(r, args.duration / 2) for vm, r in zip(vms, runs)}
    out = {"scenario": name, "round": rnd, "per_vm": per, "total": sum(per.values()),
           "held_end": held}
    print(f"  {name:<7}: total {out['total']:,.0f} IOPS (" + ", ".join(
        f"{k} {v:,.0f}" for k, v in per.items()) + f"); held at the end {fmt(held)}", flush=True)
    return out


def report_lines(results: list[dict], names: list[str], rounds: int) -> list[str]:
    """Per scenario the median total across rounds (min–max), per VM; then the targets."""
    total = {n: median([r["total"] for r in results if r["scenario"] == n]) for n in names}
    lines = ["| scenario | total IOPS (steady median" + (", median of the rounds"
             if rounds > 1 else "") + ") | " + ("min–max | " if rounds > 1 else "")
             + " | ".join(NAMES) + " | held at the end |",
             "|---|---|" + ("---|" if rounds > 1 else "") + "---|" * len(NAMES) + "---|"]
    for n in names:
        runs = [r for r in results if r["scenario"] == n]
        lines.append(f"| {n} | {total[n]:,.0f} | "
                     + (f"{spread_text([r['total'] for r in runs], ',.0f')} | "
                        if rounds > 1 else "")
                     + " | ".join(f"{median([r['per_vm'][v] for r in runs]):,.0f}"
                                  for v in NAMES)
                     + f" | {fmt(median([r['held_end'] for r in runs]))} |")
    if rounds > 1:
        lines += ["", "Per round (total IOPS): " + "; ".join(
            f"round {k}: " + ", ".join(f"{r['scenario']} {r['total']:,.0f}"
                                        for r in results if r["round"] == k)
            for k in range(1, rounds + 1)) + "."]
    if "global" in total:
        g, tl = total["global"], []
        if "oracle" in total:
            o = total["oracle"]
            tl.append(f"global ≥ oracle: **{g / o:.2f} ×**, {'met' if g >= o else 'MISSED'}")
        if "split" in total:
            s = total["split"]
            tl.append(f"global ≥ 1.3 × split: **{g / s:.2f} ×**, "
                      f"{'met' if g >= 1.3 * s else 'MISSED'}")
        lines += ["", "Targets: " + "; ".join(tl) + "."]
    return lines


def compare_lines(results: list[dict], names: list[str], rounds: int, rev: str,
                  sha: str) -> list[str]:
    """--compare-rev: each daemon scenario's figures now and at REV, and current ÷ REV."""
    def med(n, f):
        return median([f(r) for r in results if r["scenario"] == n])

    rows = []
    pairs = [n for n in DAEMONS if n in names and n + REV in names]
    for n in pairs:
        for what, f, spec in (("total IOPS", lambda r: r["total"], ",.0f"),
                              ("busy VM IOPS", lambda r: r["per_vm"]["busy"], ",.0f"),
                              ("light VMs IOPS (sum)",
                               lambda r: sum(v for k, v in r["per_vm"].items() if k != "busy"),
                               ",.0f"),
                              ("held at the end", lambda r: r["held_end"], fmt)):
            rows.append((f"{n}: {what}", med(n, f), med(n + REV, f), spec))
    total = {n: med(n, lambda r: r["total"]) for n in names}

    def div(x, y):
        return x / y if y else float("nan")

    if "global" in pairs:
        for other, target in (("oracle", 1), ("split", 1.3)):
            if other in total:      # REV's global against REV's split, the same oracle
                twin = other + REV if other in DAEMONS else other
                rows.append((f"global ÷ {other} (target ≥ {target:g})",
                             div(total["global"], total[other]),
                             div(total["global" + REV], total[twin]), ".2f"))
    how = ("the same images, arguments and fio seed, each daemon scenario run with the current "
           f"daemon and with that of {rev} (`python -m vmdisktouch run` in a git worktree of it) "
           "one right after the other" + (", the order reversed every other round; medians of "
                                          "the rounds" if rounds > 1 else ""))
    lines = side_by_side(rev, sha, rows, how)
    if rounds > 1:
        per = [f"{n} " + ", ".join(
            ratio_text(*(next((r["total"] for r in results if r["scenario"] == x
                               and r["round"] == k), float("nan")) for x in (n, n + REV)))
            for k in range(1, rounds + 1)) for n in pairs]
        lines += ["", f"Total IOPS current ÷ {rev} in each round: " + "; ".join(per) + "."]
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--busy-hot", type=parse_size, default=800 * MiB)
    ap.add_argument("--light-hot", type=parse_size, default=100 * MiB)
    ap.add_argument("--light-iops", type=int, default=500)
    ap.add_argument("--budget", type=parse_size, default=1200 * MiB)
    ap.add_argument("--limit", type=parse_size, default=768 * MiB)
    ap.add_argument("--duration", type=float, default=None, help="(120)")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--rounds", type=int, default=1, help="interleaved rounds (1)")
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--doc", action="store_true")
    ap.add_argument("--json", metavar="FILE")
    add_compare_rev(ap)
    args = ap.parse_args()
    args.duration = args.duration or (45.0 if args.quick else 120.0)
    names = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    for n in names:
        if n not in SCENARIOS:
            ap.error(f"unknown scenario {n!r} (of {', '.join(SCENARIOS)})")
    if args.compare_rev:
        if not set(names) & set(DAEMONS):
            ap.error("--compare-rev needs a daemon scenario (global, split) in --scenarios")
        names = with_rev_twins(names)
    exit_on_sigterm("bench_host_budget")
    print(f"{machine()}; busy hot zone {fmt(args.busy_hot)}, 3 light ones of "
          f"{fmt(args.light_hot)} at {args.light_iops} IOPS; budget {fmt(args.budget)}; group "
          f"limit {fmt(args.limit)}; {args.duration:g} s per scenario: {', '.join(names)}",
          flush=True)
    stack = contextlib.ExitStack()
    tree = enter_rev_worktree(stack, args.compare_rev) if args.compare_rev else None
    work = tempfile.mkdtemp(prefix="bench-host-budget-", dir=args.dir)
    tmp = tempfile.mkdtemp(prefix="bench-host-budget-", dir="/tmp")
    results = []
    try:
        vms = []
        for k, vm in enumerate(NAMES):
            size = 8 * GiB if k == 0 else GiB
            hot = args.busy_hot if k == 0 else args.light_hot
            path = os.path.join(work, f"{vm}.raw")
            make_image(path, size)
            vms.append({"name": vm, "path": path, "size": size, "zone": (size // 8, hot),
                        "iops": None if k == 0 else args.light_iops})
        nb_path = os.path.join(work, "neighbour.raw")
        make_image(nb_path, GiB)
        for rnd, order in enumerate(round_orders(names, args.rounds), 1):
            if args.rounds > 1:
                print(f"round {rnd}: {', '.join(order)}", flush=True)
            for name in order:
                results.append(one_scenario(name, vms, nb_path, args, tmp, rnd, tree))
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)
        stack.close()
    lines = report_lines(results, names, args.rounds)
    if tree:
        lines += [""] + compare_lines(results, names, args.rounds, tree.rev, tree.sha)
    body = (f"Four non-sparse images: busy (8 GiB, hot zone {fmt(args.busy_hot)}, as fast as "
            f"it can) and three light ones (1 GiB, hot zones of {fmt(args.light_hot)}, "
            f"fio `--rate_iops={args.light_iops}` each, a cap per direction), each with the "
            f"hot-zone guest (fio 4 KiB random, 80 % "
            f"reads, O_DSYNC writes, 90 % of the accesses in its zone), and a noisy neighbour "
            f"(64 KiB random reads of its own 1 GiB file at 200 MiB/s), all in one memory group "
            f"limited to {fmt(args.limit)}; {args.duration:g} s per scenario from a cold cache. "
            f"global: `vmdisktouch run BUSY L1 L2 L3 --max-hold {fmt(args.budget)}`; split: "
            f"four daemons with `--max-hold {fmt(args.budget // 4)}`; oracle: `vmtouch -l` of "
            f"each hot zone."
            + (f" NAME-rev: the same with the daemon of `{tree.rev}` ({tree.sha[:10]})."
               if tree else "") + " Steady = the second half"
            + (f"; {args.rounds} rounds, reversed every other round (A B B A)"
               if args.rounds > 1 else "") + ".\n\n" + "\n".join(lines))
    publish(body, results, args, "host-budget", "One host budget against split budgets")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
