"""Re-derive the golden traces' plans after a deliberate change of the policy's rules.

The observations of tests/golden/policy stay as recorded (real bench_hotzone
runs, a host of three disks); each cycle's plan of each disk (its targets,
heat sum and red runs) and a host's selection are replaced by what the
current policy makes of them, and ``replanned`` names why. Run it only
with a change of the rules that docs/benchmarks.md measures side by side; the
replay test then pins the new rules.

    .venv/bin/python -m tools.golden_replan WHY [NAME ...]
"""

from __future__ import annotations

import gzip
import json
import sys

import numpy as np

from tests.support.replay import read_record, replay_host
from tests.support.golden import GOLDEN, HOST_SCENARIOS, SCENARIOS, TRACE_SCENARIOS


def replan(name: str, why: str) -> int:
    """Rewrite trace ``name``; returns the number of cycles whose targets changed."""
    path = GOLDEN / f"{name}.jsonl.gz"
    cycles = read_record(path)
    changed = 0
    for _, h, disks, alloc in replay_host(cycles):
        cycle_changed = False
        for c, plan, policy in disks:
            targets = [list(r) for r in plan.targets]
            cycle_changed |= targets != c["targets"]
            c["targets"] = targets
            c["heat_sum"] = float(plan.heat.sum(dtype=np.float64))
            c["red"] = [list(r) for r in policy.red.runs()]
            c["replanned"] = why
        if h.get("selection") is not None:      # a host's record: its selection too
            mapped = [k for k, s in enumerate(h["selection"]) if s is not None]
            for d, k in enumerate(mapped):
                h["selection"][k] = dict(runs=[list(r) for r in alloc.runs[d]],
                                         share=int(alloc.share[d]),
                                         wanted=int(alloc.wanted[d]), limit=alloc.limit[d])
        changed += cycle_changed
    with gzip.GzipFile(path, "wb", mtime=0) as f:
        for c in cycles:
            f.write((json.dumps(c, separators=(",", ":")) + "\n").encode())
    return changed


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    why, names = argv[0], argv[1:] or list(SCENARIOS + TRACE_SCENARIOS + HOST_SCENARIOS)
    for name in names:
        print(f"{name}: {replan(name, why)} cycles replanned")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
