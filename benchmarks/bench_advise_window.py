"""How long advise must watch before its size stands: the advice of short windows
against the advice of a full minute, on the same reads.

Each scenario is a guest's 4 KiB random reads, a share of them in a hot zone at
the image's start and the rest anywhere (seeded, so every run is the same). They are
fed in one-second batches to advise's own curve (``IOWatch``'s configuration:
``MissRatioCurve.for_image(half_life=0, steady=True, max_per_second=100)``), and
after each window in ``--windows`` the advice's inputs are read: what the curve
wants (``wants``), its height there, the re-reads it has seen (``re_reads``, the
evidence ``core.advice.evidence`` weighs against ``ADVISE_MIN_SECONDS`` and
``ADVISE_MIN_REREADS``) and whether that evidence is enough. Printed side by side
with the same scenario's 180 s window: wants ÷ wants at 180 s, and the share from
memory less the share at 180 s. ``--doc`` writes docs/benchmarks/advise.md's section
"advise-window".

    .venv/bin/python benchmarks/bench_advise_window.py [--doc]
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.source_common import publish  # noqa: E402
from vmdisktouch.core import advice  # noqa: E402
from vmdisktouch.core.mrc import MissRatioCurve  # noqa: E402
from vmdisktouch.sizes import format_size  # noqa: E402
from vmdisktouch.system.observe.io_watch import SAMPLED_PER_SECOND  # noqa: E402

MiB, PAGE = 1 << 20, 4096
FULL = 180                      # s: the window every shorter one is set beside
# name: (image bytes, zone bytes, share of reads in the zone, reads a second)
SCENARIOS = {
    "zone-24M-of-256M": (256 * MiB, 24 * MiB, 0.9, 10_000),
    "zone-128M-of-2G": (2048 * MiB, 128 * MiB, 0.9, 3_000),
    "zone-432M-of-3G": (3072 * MiB, 432 * MiB, 0.9, 6_000),
}


def reads(image: int, zone: int, share: float, rate: int, seconds: int, seed: int):
    """A second of the guest's reads at a time: page numbers, ``share`` in the zone."""
    rng = np.random.default_rng(seed)
    for _ in range(seconds):
        hot = rng.random(rate) < share
        pages = np.where(hot, rng.integers(0, zone // PAGE, rate),
                         rng.integers(0, image // PAGE, rate))
        yield pages


def watch(image: int, zone: int, share: float, rate: int, windows: list[int], seed: int):
    """Per window: (seconds, re-reads, enough, wants, share from memory at wants)."""
    mrc = MissRatioCurve.for_image(image // PAGE, half_life=0.0, steady=True,
                                   max_per_second=SAMPLED_PER_SECOND)
    out = []
    for t, pages in enumerate(reads(image, zone, share, rate, max(windows), seed), 1):
        mrc.feed_ranges(pages, pages, seconds=1.0)
        mrc.decay(1.0)                  # as IOWatch: no half-life, it only ages
        if t in windows:
            wants = mrc.wants(image, PAGE)
            ev = advice.of_curve(mrc, advice.ADVISE, wants / PAGE)
            out.append((t, ev["re_reads"], ev["enough"], wants,
                        mrc.hit_ratio(wants / PAGE)))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--windows", default="5,10,20,30,45,60,90,120")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--doc", action="store_true")
    args = ap.parse_args()
    windows = sorted({int(x) for x in args.windows.split(",")} | {FULL})
    rows = ["| scenario | window s | re-reads seen | evidence | wants | from memory | "
            f"wants ÷ wants at {FULL} s | from memory less at {FULL} s |", "|---|---|---|---|---|---|---|---|"]
    for name, (image, zone, share, rate) in SCENARIOS.items():
        seen = watch(image, zone, share, rate, windows, args.seed)
        full = seen[-1]
        for t, rr, enough, wants, h in seen:
            rows.append(f"| {name} | {t} | {rr:,.0f} | {'enough' if enough else 'short'} | "
                        f"{format_size(wants)} | {h:.0%} | {wants / max(full[3], 1):.2f} | "
                        f"{(h - full[4]) * 100:+.0f} points |")
    body = (f"Advise's curve fed a guest's 4 KiB random reads a second at a time (90 % in "
            f"the zone, the rest anywhere on the image); each window's advice beside the "
            f"{FULL} s one. advise's minimum: {advice.ADVISE.seconds:g} s, "
            f"{advice.ADVISE.re_reads:,} re-reads, and {advice.ADVISE.cover:g} re-reads a page "
            f"of the size it wants; a window short of it says how much longer to watch.\n\n" + "\n".join(rows) + "\n")
    args.json = None
    publish(body, None, args, "advise-window", "How long advise watches before a size stands")
    return 0


if __name__ == "__main__":
    sys.exit(main())
