"""Replaying a recorded daemon run (``VMDISKTOUCH_RECORD``) through fresh ``Policy``s.

A record is a host's (``daemon.record``): each cycle every disk's record and
the shared selection's result. ``replay_host`` feeds each disk's observations
to its own fresh ``Policy`` and makes the cycle's plans through ONE selection
over every disk's map (``policy.select``, the recorded budget, each disk's
recorded cap and weight), as ``Host.tick`` does. The first traces are one
disk's records alone, one a line: they are read as a host of one whose
budget is the disk's ``max_hold`` (``host_cycle``). ``replay`` is the host
of one's replay, disk by disk.

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
from vmdisktouch.core.shares import Demand, Splitter, grid
from vmdisktouch.core.sparse import Sparse
from vmdisktouch.daemon.host import weighed


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


def host_cycle(line: dict) -> dict:
    """A line of a record as a host's cycle: a host's as it is; a disk's alone (the
    first traces) as a host of one, its budget the disk's ``max_hold``, its selection
    not recorded (None)."""
    if "disks" in line:
        return line
    s = line["settings"]
    return {"budget_blocks": s["max_hold"] // s["block_size"], "disks": [line],
            "selection": None}


def disk_cycles(cycles: list[dict], disk: int = 0) -> list[dict]:
    """The records of one disk (the ``disk``-th of a host's first cycle) in a record of
    either kind, cycle by cycle."""
    hosts = [host_cycle(c) for c in cycles]
    path = hosts[0]["disks"][disk].get("path")
    return [d for h in hosts for d in h["disks"] if d.get("path") == path]


def _key(d: dict, index: int):
    return d.get("path", index)


class _Disk:
    """One disk's fresh ``Policy`` as its records find it."""

    def __init__(self, d: dict):
        self.settings = d["settings"]
        self.policy = Policy(d["nblocks"], PolicyParams.of(SimpleNamespace(**self.settings)),
                             sparse_file=d["skip_holes"])

    def follow(self, d: dict) -> Policy:
        """New settings (a reload) and size, as recorded."""
        if d["settings"] != self.settings:
            self.settings = d["settings"]
            self.policy.params = PolicyParams.of(SimpleNamespace(**self.settings))
        if d["nblocks"] != self.policy.nblocks:
            self.policy.resize(d["nblocks"])
        return self.policy


def demand(d: dict, budget: int, block_size: int) -> Demand | None:
    """A disk record's ``demand`` (its curve at the split's sizes) as the host had it."""
    rec = d.get("demand")
    if rec is None:
        return None
    sizes, hit = grid(budget, block_size), np.asarray(rec["hit"], dtype=float)
    return Demand(lambda s: np.interp(s, sizes, hit), rec["pages_per_second"],
                  rec["miss_cost"], d.get("weight", 1.0), rec.get("seen", True))


def replay_host(cycles: list[dict], strict: bool = True):
    """Yield (cycle number, host cycle, [(disk record, plan, policy)], allocation) for every
    recorded cycle: each disk's plan made through ONE selection over every disk's map, with
    the recorded budget; the allocation's lists are indexed like the disks with a map. A
    disk not in a cycle is no longer served: it starts again from a fresh ``Policy``."""
    disks: dict = {}
    splitter = Splitter()
    for i, line in enumerate(cycles):
        h = host_cycle(line)
        disks = {_key(d, k): disks.get(_key(d, k)) or _Disk(d)
                 for k, d in enumerate(h["disks"])}
        policies, maps = [], []
        for k, d in enumerate(h["disks"]):
            policy = disks[_key(d, k)].follow(d)
            probes = RecordedProbes(d["probes"], strict)
            m = policy.prepare(observation(d), probes)
            assert not (strict and probes.left), \
                f"cycle {i}, disk {_key(d, k)}: recorded probes not made: {probes.left}"
            policies.append(policy)
            if m is not None:
                maps.append((k, weighed(m, d.get("cap_blocks"), d.get("weight", 1.0))))
        bs = h["disks"][maps[0][0]]["settings"]["block_size"] if maps else 1
        capped, _ = splitter.caps([_key(h["disks"][k], k) for k, _ in maps],
                                  [m for _, m in maps],
                                  [demand(h["disks"][k], h["budget_blocks"] * bs, bs)
                                   for k, _ in maps], h["budget_blocks"], bs)
        maps = [(k, m) for (k, _), m in zip(maps, capped)]
        alloc, _ = select([m for _, m in maps], h["budget_blocks"], 0.0, [[] for _ in maps])
        runs = {k: r for (k, _), r in zip(maps, alloc.runs)}
        plans = [p.finish(runs.get(k, [])) for k, p in enumerate(policies)]
        yield i, h, list(zip(h["disks"], plans, policies)), alloc
        for d, policy in zip(h["disks"], policies):
            policy.settle(runs_to_mask(d["held_after"], d["nblocks"]),
                          holes=[tuple(r) for r in d.get("holes_found", [])],
                          ceded=[tuple(r) for r in d.get("ceded", [])])


def replay(cycles: list[dict], strict: bool = True):
    """Yield (cycle number, record, plan, policy) for every cycle of a host of one (a
    first trace, or a host's record of one disk)."""
    for i, h, disks, _ in replay_host(cycles, strict):
        assert len(disks) == 1, f"cycle {i}: {len(disks)} disks; replay_host replays a host"
        (c, plan, policy), = disks
        yield i, c, plan, policy
