"""The host PNG of a host of a hundred VMs, drawn from a made-up report (no daemon).

``host_disks(n)`` makes ``n`` disks the way the host service hands them to
``host_render.host_overview_image``: ``domain/target`` names, images of 4 to
256 GiB, wants of a few busy disks and many quiet ones (a long tail, as on a
real host) that sum to 1.3 times a 48 GiB budget, each holding 45 to 85 % of
it, the reasons the daemon gives, a few adopted disks, a few with no share
yet, curves on most, and five disks not served.
The numbers come from one seeded generator, so the picture is the same on
every run. It writes docs/img/host-100-example.png (``--png``), the example of
the top bands and the summary band in docs/reference.md.

    .venv/bin/python -m tools.host_example [--disks 100] [--png FILE]
"""

from __future__ import annotations

import argparse
import os
import random

import numpy as np

from vmdisktouch.adapters.pictures.host_render import (DiskBand, Unserved,
                                                       host_overview_image)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MiB, GiB = 1 << 20, 1 << 30
BUDGET = 48 * GiB
WHEN = 1_760_000_000.0
ROLES = ("web", "db", "ci", "cache", "build", "mail", "git", "log")
REASONS = ("budget", "curve", "weight", "cap", "below_threshold", "floor", "no_evidence")


def host_disks(n: int, seed: int = 100) -> tuple[list[DiskBand], list[Unserved]]:
    """``n`` disks of a made-up host (the module's story) and five not served."""
    rnd = random.Random(seed)
    busy = [rnd.paretovariate(1.2) for _ in range(n)]      # a few busy, a long quiet tail
    scale = 1.3 * BUDGET / sum(busy)                       # they want 1.3 budgets in all
    disks = []
    for k in range(n):
        domain = f"{ROLES[k % len(ROLES)]}-{k // len(ROLES) + 1:02d}"
        size = rnd.choice((4, 8, 16, 20, 32, 40, 64, 100, 128, 256)) * GiB
        wanted = min(size, int(busy[k] * scale))
        held = int(wanted * rnd.uniform(0.45, 0.85))
        share = None if k % 17 == 5 else int(held * rnd.uniform(1.0, 1.3))
        blocks = 512
        held_map = np.zeros(blocks, bool)
        at = rnd.randrange(blocks)
        held_map[at:at + max(1, blocks * held // size)] = True
        resident = np.clip(np.random.default_rng(seed + k).normal(0.25, 0.2, blocks), 0, 1)
        resident[held_map] = 1.0
        knee = max(MiB, int(wanted * rnd.uniform(0.5, 1.5)))
        top = rnd.uniform(0.5, 0.97)
        curve = None if k % 4 == 3 else [
            [MiB << j, top * min(1.0, (MiB << j) / knee) ** 0.5] for j in range(19)
            if MiB << j <= size]
        limited = None if k % 3 == 0 else REASONS[rnd.randrange(4) if k % 11 else 4 + k % 3]
        disks.append(DiskBand(
            f"/var/lib/libvirt/images/{domain}.qcow2", held, resident.astype(np.float32),
            held_map, domain=domain, target="vda", size_bytes=size, share_bytes=share,
            wanted_bytes=wanted, limited_by=limited, curve=curve, adopted=k % 23 == 7,
            adopted_gain=1.4 if k % 23 == 7 else None))
    unserved = [Unserved(f"{ROLES[k]}-{90 + k}/vdb", "cache=none (O_DIRECT)",
                         "2.0G: 81% from memory" if k == 1 else None) for k in range(4)]
    unserved.append(Unserved("iso-01/hdc", "read-only cdrom"))
    return disks, unserved


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--disks", type=int, default=100)
    ap.add_argument("--png", default=os.path.join(ROOT, "docs", "img", "host-100-example.png"))
    args = ap.parse_args(argv)
    disks, unserved = host_disks(args.disks)
    img = host_overview_image(disks, BUDGET, when=WHEN, above_floor=6 * GiB,
                              unserved=unserved)
    img.save(args.png, optimize=True)
    print(f"{args.png}: {img.width}x{img.height}, {args.disks} disks")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
