"""The recorder: each cycle's observation and plan as one gzip JSON line.

Enabled with the environment variable ``VMDISKTOUCH_RECORD=FILE`` (a
developer's tool, not a setting): the golden traces of the policy tests
(``tests/unit/test_golden.py``, ``tests/golden/policy``) are such files,
recorded from ``bench_hotzone`` runs (docs/architecture.md, "Golden traces").
A cycle's line holds what the policy observed (time, residency, held runs,
rewrites, allocation, the hole probes and their answers), what it decided
(targets, the heat map's sum, the red blocks) and what the holder did
(held runs after it acted, holes met, blocks ceded).
"""

from __future__ import annotations

import gzip
import json
import os

import numpy as np

from vmdisktouch.core.regions import mask_runs

ENV = "VMDISKTOUCH_RECORD"


def _f32(values) -> list[float]:
    """float32 values as the shortest decimals that give them back: the policy reads them as
    float32, and 17 digits of a float32 do not compress."""
    return [float(x) for x in np.asarray(values, dtype=np.float32).astype(str)]


def _runs(runs) -> list[list[int]]:
    return [[int(a), int(b)] for a, b in runs]


class Recorder:
    def __init__(self, path: str, config, sparse_file: bool):
        self.file = gzip.open(path, "wt")
        self.config = config
        self.sparse_file = sparse_file
        self.probes: list = []

    @classmethod
    def from_env(cls, config, sparse_file: bool) -> "Recorder | None":
        path = os.environ.get(ENV)
        return cls(path, config, sparse_file) if path else None

    def probe(self, probe):
        """``probe``, with its questions and answers noted for this cycle's line."""
        def recorded(run):
            answer = probe(run)
            self.probes.append([int(run[0]), int(run[1]), _runs(answer)])
            return answer
        return recorded

    def write(self, obs, plan, acted, policy) -> None:
        c = self.config
        nz = np.flatnonzero(obs.resident)
        line = dict(
            t=obs.now, nblocks=int(obs.held.size), enabled=obs.holding,
            settings=dict(block_size=c.block_size, max_hold=c.max_hold, interval=c.interval,
                          rewritten_seconds=c.rewritten_seconds, foreign_share=c.foreign_share,
                          amp_resident=c.amp_resident, sigma_resident=c.sigma_resident,
                          amp_rewritten=c.amp_rewritten, sigma_rewritten=c.sigma_rewritten,
                          decay=c.decay, threshold=c.threshold),
            resident=[nz.tolist(), _f32(obs.resident[nz])],
            held=_runs(mask_runs(obs.held)),
            rewritten=[obs.rewritten.blocks.tolist(),
                       np.asarray(obs.rewritten.values, dtype=float).tolist()],
            skip_holes=self.sparse_file, probes=self.probes, allocation=obs.allocation,
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
        self.file.write(json.dumps(line, separators=(",", ":")) + "\n")
        self.file.flush()
        self.probes = []

    def close(self) -> None:
        self.file.close()
