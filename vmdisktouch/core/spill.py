"""The spill: the next-ranked regions past the budget, cached but not locked.

Theory of operation
-------------------
The budget (``max_hold``) bounds what the daemon locks. When the guest's hot
set is larger, the regions ranked just below the budget's last one are still
read often, and on a host with memory nobody uses they may as well be in the
page cache: read there by the daemon they are charged to its own memory
cgroup, outside the VM's limit, and the kernel reclaims them before anything
locked when memory is needed. ``beyond`` names them: a selection over the
budget plus ``factor`` times the budget (the same queue, the same rules, so
the same priority order), less what the budget's own selection chose, at
most ``factor`` times the budget, highest priority first. The system side
(``system.hold.spill``) reads them, paced, only into free memory.

What was spilled last cycle counts as held in that wider selection: it is
cached already, as a held block is, and ranks with the same incumbency and
stay rules (``regions``). Without that, the spill past a hot zone is
background read at random, and the noise picks another window of it
nearly every other cycle, each read beside the guest's own I/O
(docs/benchmarks.md, why-spill).

Only a disk whose rules have ``spill`` (the trace source) spills: its
evidence is the guest's reads, which the daemon's own reads do not add to.
With the polling source the daemon's reads would be residency, the feedback
``policy.self_loaded`` exists to suppress; its lease already leaves released
regions cached, without a bound, and against it a trace source that held
the budget and nothing else left its guest slower (docs/benchmarks.md,
why-spill).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from vmdisktouch.core import regions
from vmdisktouch.core.runs import Run, runs_to_mask, subtract


def beyond(maps: list[regions.DiskMap], budget_blocks: int, factor: float,
           rules: regions.Rules, chosen: list[list[Run]],
           previous: list[list[Run]] | None = None) -> list[list[Run]]:
    """Per disk: the runs to spill, highest priority first, disjoint from ``chosen`` (the
    budget's selection of the same ``maps``), at most ``factor x budget_blocks`` in all.
    ``previous``: per disk, the runs spilled last cycle (they count as held: see above)."""
    extra = int(budget_blocks * max(0.0, factor))
    out: list[list[Run]] = [[] for _ in maps]
    if extra <= 0 or not any((m.rules or rules).spill for m in maps):
        return out
    # A disk that does not spill keeps what it was chosen, no more: the room is the others'.
    wide = [replace(m, cap_blocks=sum(b - a for a, b in chosen[d]))
            if not (m.rules or rules).spill
            else _incumbent(m if m.cap_blocks is None
                            else replace(m, cap_blocks=int(m.cap_blocks * (1 + factor))),
                            previous[d] if previous else ())
            for d, m in enumerate(maps)]
    wider = regions.select_many(wide, budget_blocks + extra, rules)
    left = extra
    for d, (m, runs) in enumerate(zip(maps, wider)):
        if not (m.rules or rules).spill:
            continue
        taken = sorted(chosen[d])
        for run in runs:
            for a, b in subtract(run, taken):
                if left <= 0:
                    return out
                b = min(b, a + left)
                out[d].append((a, b))
                left -= b - a
    return out


def _incumbent(m: regions.DiskMap, spilled: list[Run]) -> regions.DiskMap:
    """``m`` with the blocks spilled last cycle marked held: the wider selection weighs
    them as incumbents and keeps them unless a pick carries more (``Rules``)."""
    if not spilled:
        return m
    mask = runs_to_mask(spilled, np.asarray(m.total_heat).size)   # clipped: a shrunk image
    return replace(m, held_mask=mask if m.held_mask is None
                   else np.asarray(m.held_mask, dtype=bool) | mask)
