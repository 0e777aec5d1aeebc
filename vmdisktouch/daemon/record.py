"""The recorder: each host cycle's observations and plans as one gzip JSON line.

Enabled with the environment variable ``VMDISKTOUCH_RECORD=FILE`` (a
developer's tool, not a setting): the golden traces of the policy tests
(``tests/unit/test_golden.py``, ``tests/golden/policy``) are such files,
recorded from ``bench_hotzone`` runs and from a host of three disks
(docs/architecture.md, "Golden traces"). One recorder serves the host, for
one disk or many (``Host``, which gives every disk it serves to it).

A cycle's line holds the host's cycle number, its budget in blocks
(``budget_blocks``), ``disks``: one record per disk that acted, in the
host's order, and ``selection``: what the shared selection gave each of
them (null for a disk that had no map: holding off), indexed like
``disks``. A disk's record holds its path, its cap (blocks, or null) and
ranking weight, its curve at the sizes the budget's split looks at, with
its read rate, its miss cost and whether it is its own curve or the one its
heat implies (``demand``: null without a curve; ``seen``: false for a young
curve's stand-in), what its policy observed (time, residency, held runs,
rewrites, allocation, the hole probes and their answers), what it decided
(targets, the heat map's sum, the red blocks) and what its holder did (held
runs after it acted, holes met, blocks ceded).

The first traces (before the host's recorder) are one disk's records
alone, one a line; ``tests/replay.py`` reads them as a host of one.
"""

from __future__ import annotations

import gzip
import json
import os

import numpy as np

from vmdisktouch.core.regions import mask_runs
from vmdisktouch.core.shares import grid

ENV = "VMDISKTOUCH_RECORD"


def _f32(values) -> list[float]:
    """float32 values as the shortest decimals that give them back: the policy reads them as
    float32, and 17 digits of a float32 do not compress."""
    return [float(x) for x in np.asarray(values, dtype=np.float32).astype(str)]


def _runs(runs) -> list[list[int]]:
    return [[int(a), int(b)] for a, b in runs]


class Recorder:
    """The host's one record file; each disk's part of a cycle is noted (``probe``,
    ``disk``) and the host writes the cycle's line (``write``)."""

    def __init__(self, path: str):
        self.file = gzip.open(path, "wt")
        self.probes: dict[str, list] = {}     # disk path -> this cycle's probes
        self.disks: dict[str, dict] = {}      # disk path -> this cycle's record

    @classmethod
    def from_env(cls) -> "Recorder | None":
        path = os.environ.get(ENV)
        return cls(path) if path else None

    def probe(self, disk: str, probe):
        """``probe`` of disk ``disk``, with its questions and answers noted for this cycle."""
        probes = self.probes[disk] = []

        def recorded(run):
            answer = probe(run)
            probes.append([int(run[0]), int(run[1]), _runs(answer)])
            return answer
        return recorded

    def disk(self, disk: str, config, sparse_file: bool, obs, plan, acted, policy) -> None:
        """Disk ``disk``'s part of this cycle, once it acted."""
        c = config
        nz = np.flatnonzero(obs.resident)
        line = dict(
            path=disk, t=obs.now, nblocks=int(obs.held.size), enabled=obs.holding,
            settings=dict(block_size=c.block_size, max_hold=c.max_hold, interval=c.interval,
                          rewritten_seconds=c.rewritten_seconds, foreign_share=c.foreign_share,
                          amp_resident=c.amp_resident, sigma_resident=c.sigma_resident,
                          amp_rewritten=c.amp_rewritten, sigma_rewritten=c.sigma_rewritten,
                          decay=c.decay, threshold=c.threshold),
            resident=[nz.tolist(), _f32(obs.resident[nz])],
            held=_runs(mask_runs(obs.held)),
            rewritten=[obs.rewritten.blocks.tolist(),
                       np.asarray(obs.rewritten.values, dtype=float).tolist()],
            skip_holes=sparse_file, probes=self.probes.pop(disk, []),
            allocation=obs.allocation,
            targets=_runs(plan.targets), holes_found=_runs(acted.holes),
            ceded=_runs(acted.ceded), held_after=_runs(mask_runs(acted.held)),
            heat_sum=float(plan.heat.sum(dtype=np.float64)), red=_runs(policy.red.runs()))
        if obs.reads is not None:      # the trace source
            line.update(reads=obs.reads.blocks.tolist(),
                        read_counts=None if obs.read_counts is None else
                        [obs.read_counts.blocks.tolist(),
                         np.asarray(obs.read_counts.values, dtype=float).tolist()],
                        read_recent=None if obs.read_recent is None else
                        [obs.read_recent.blocks.tolist(),
                         _f32(obs.read_recent.values)],
                        refaults=[obs.refaults.blocks.tolist(),
                                  np.asarray(obs.refaults.values, dtype=float).tolist()],
                        reconcile=obs.reconcile)
        self.disks[disk] = line

    def write(self, cycle: int, budget_blocks: int, disks: list, selected: dict,
              demands: dict | None = None, budget: int = 0, block_size: int = 1,
              advice: dict | None = None) -> None:
        """The host's cycle ``cycle``: ``disks``, (path, cap blocks or None, weight) in the
        host's order (those that did not act are left out); ``selected``: path -> (runs,
        share, wanted, limit) of the shared selection, for the disks that had a map;
        ``demands``: path -> its ``shares.Demand`` (or None), written as its curve at the
        sizes the split looks at (``shares.grid``), its rate and its miss cost;
        ``advice``: path -> what the budget's advice reads of it (``Host._advice_inputs``)."""
        records, selection = [], []
        sizes = grid(budget, block_size)
        for path, cap, weight in disks:
            rec = self.disks.pop(path, None)
            if rec is None:
                continue
            d = (demands or {}).get(path)
            demand = None if d is None else dict(
                hit=[float(x) for x in d.hit_ratio(sizes)],      # exact: the split's ties
                pages_per_second=float(d.pages_per_second),
                miss_cost=None if d.miss_cost is None else float(d.miss_cost),
                seen=bool(d.seen))
            records.append({"path": path, "cap_blocks": cap, "weight": float(weight),
                            "demand": demand, "advice": (advice or {}).get(path),
                            **{k: v for k, v in rec.items() if k != "path"}})
            s = selected.get(path)
            selection.append(None if s is None else dict(
                runs=_runs(s[0]), share=int(s[1]), wanted=int(s[2]), limit=s[3]))
        self.disks.clear()
        self.probes.clear()
        line = dict(cycle=int(cycle), budget_blocks=int(budget_blocks), disks=records,
                    selection=selection)
        self.file.write(json.dumps(line, separators=(",", ":")) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()
