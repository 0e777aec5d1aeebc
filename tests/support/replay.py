"""Replaying a recorded daemon run (``VMDISKTOUCH_RECORD``) through a fresh ``Policy``.

Shared by the golden traces (tests/unit/test_golden.py) and the check that a
real daemon's record replays to its own plans (tests/e2e/test_record.py).
"""

from __future__ import annotations

import gzip
import json
from types import SimpleNamespace

import numpy as np

from vmdisktouch.core.policy import Observation, Plan, Policy, PolicyParams, select
from vmdisktouch.core.runs import runs_to_mask
from vmdisktouch.core.sparse import Sparse


def read_record(path) -> list[dict]:
    """The cycles of a record file, in order."""
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f]


def observation(c: dict) -> Observation:
    n = c["nblocks"]
    resident = np.zeros(n, dtype=np.float32)
    blocks, values = c["resident"]
    resident[blocks] = values
    rblocks, rvalues = c["rewritten"]
    return Observation(now=c["t"], resident=resident, held=runs_to_mask(c["held"], n),
                       rewritten=Sparse(np.asarray(rblocks, dtype=np.intp),
                                        np.asarray(rvalues, dtype=float)),
                       allocation=c.get("allocation"), holding=c["enabled"],
                       reads=None if "reads" not in c else _ones(c["reads"]),
                       refaults=_refaults(c.get("refaults", [])),
                       reconcile=c.get("reconcile", False),
                       read_counts=_refaults(c["read_counts"]) if c.get("read_counts") else None,
                       read_recent=_refaults(c["read_recent"]) if c.get("read_recent") else None)


def _refaults(rec) -> Sparse:
    """[blocks, values]; the first records kept blocks only (each counted as 1)."""
    if len(rec) == 2 and isinstance(rec[0], list):
        return Sparse(np.asarray(rec[0], dtype=np.intp), np.asarray(rec[1], dtype=np.float32))
    return _ones(rec)


def _ones(blocks) -> Sparse:
    return Sparse(np.asarray(blocks, dtype=np.intp), np.ones(len(blocks), dtype=np.float32))


class RecordedProbes:
    """Answers the policy's hole probes from the record, in the recorded order.

    ``strict``: a probe the recorded cycle did not make fails the test;
    otherwise it is answered "all data".
    """

    def __init__(self, probes, strict: bool = True):
        self.left = [((a, b), [tuple(r) for r in data]) for a, b, data in probes]
        self.strict = strict

    def __call__(self, run):
        if self.left and tuple(run) == self.left[0][0]:
            return self.left.pop(0)[1]
        assert not self.strict, f"probe of {run}; the recorded cycle made {self.left[:1]}"
        return [tuple(run)]


def plan_one(policy: Policy, obs: Observation, probe, budget_blocks: int) -> Plan:
    """One disk's plan through the one selection the host runs for every disk
    (``policy.select``) with a budget of ``budget_blocks``, with no spill."""
    m = policy.prepare(obs, probe)
    targets = [] if m is None else select([m], budget_blocks, 0.0, [[]])[0].runs[0]
    return policy.finish(targets)


def replay(cycles: list[dict], strict: bool = True):
    """Yield (cycle number, record, plan, policy) for every recorded cycle."""
    first = cycles[0]
    settings = first["settings"]
    policy = Policy(first["nblocks"], PolicyParams.of(SimpleNamespace(**settings)),
                    sparse_file=first["skip_holes"])
    for i, c in enumerate(cycles):
        if c["settings"] != settings:
            settings = c["settings"]
            policy.params = PolicyParams.of(SimpleNamespace(**settings))
        if c["nblocks"] != policy.nblocks:
            policy.resize(c["nblocks"])
        probes = RecordedProbes(c["probes"], strict)
        plan = plan_one(policy, observation(c), probes,
                        settings["max_hold"] // settings["block_size"])
        assert not (strict and probes.left), f"cycle {i}: recorded probes not made: {probes.left}"
        yield i, c, plan, policy
        policy.settle(runs_to_mask(c["held_after"], c["nblocks"]),
                      holes=[tuple(r) for r in c.get("holes_found", [])],
                      ceded=[tuple(r) for r in c.get("ceded", [])])
