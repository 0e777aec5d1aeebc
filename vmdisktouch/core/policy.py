"""The policy: which blocks to hold, from one cycle's observation and its own memory.

Theory of operation
-------------------
Everything that decides what is held lives in this module, the way a state
machine's rules live in one file: ``Policy``, which applies the rules
(their constants are data in ``core.rules``: value, unit, meaning; their
reasons in docs/rationale.md). It is pure (numpy only): the daemon observes the image,
asks ``prepare``, ``select`` and ``finish`` for a plan, has the holder carry it out, and tells
``settle`` what was held in the end. Nothing here reads a file, a clock or
a page-cache bit; the same observations give the same plans, which is what
the golden replay tests (``tests/unit/test_golden.py``) check.

One cycle:

``prepare(observation, probe) -> DiskMap``, ``select`` (over every disk served),
``finish(targets) -> Plan``

1. Rewrites. The blocks rewritten (``Observation.rewritten``, the fraction
   of each block), if held, are shown red for ``rewritten_seconds`` (the
   trace source sees writes everywhere; red is the held ones'); those of
   this cycle and the last are ``recent``, the first class of the selection.
2. Suppression. The residency of a block is not the guest's, and is
   replaced by 0 in the heat step, when the block is held now, when the
   daemon itself brought it into the cache (``self_loaded``, below), or
   when it was displaced from the hold less than ``RELEASED_GRACE`` ago.
3. Heat. ``heat.step`` smooths residency and rewrites and folds them into
   the decaying map over the time since the last cycle.
4. Holes. Blocks known to be holes of a sparse file are cut out of the
   heat: holding them would spend the budget on zeros. Candidate blocks not
   probed yet are probed first (``probe``: the image's SEEK_DATA/SEEK_HOLE),
   so the budget goes to data from the first cycle. What is known holds
   while the file's allocated size is unchanged (``core.holes``).
5. Cede. Blocks ceded to a guest's own cache (see ``settle``) are cut out
   for ``CEDE_SECONDS``.
6. Select. ``regions`` cuts the map at the threshold, keeps held
   runs while their mean heat is at least ``HOLD_FRACTION`` of it, ranks
   the runs by heat per block (rewritten ones first, held resident heat
   weighed ``INCUMBENT_WEIGHT`` times) and ``regions.allocate`` fills the
   budget of every disk at once by benefit per byte: the plan's targets,
   highest priority first. The holder loads them in that order and, under
   memory pressure, sheds from the end. While holding is off (the domain is
   shut off) the plan is empty and everything is released.

With the trace source (``Observation.reads`` set) step 2 has nothing to
suppress: the evidence is the guest's reads, held blocks included, and the
daemon's own loading is not traced; residency counts only in a cycle whose
events were lost (``reconcile``). Step 6 then ranks held heat with a small margin
(``TRACED_INCUMBENT``), multiplies it by the read intensity (``core.intensity``)
and thrash (``core.thrash``), and splits a region too large where the intensity does.

``settle(held, holes, ceded)`` after the holder acted:

* ``self_loaded``: a block the daemon loaded while the guest had less than
  ``GUEST_RESIDENT`` of it cached stays marked until the kernel evicts it;
* displaced blocks (released while still candidates) start their grace;
* holes the holder met and blocks ceded in the recharge are remembered.

Blocks the daemon loaded
^^^^^^^^^^^^^^^^^^^^^^^^
A block loaded while the guest had not cached it (a region's shoulders:
the smoothing makes a region wider than the guest's cached extent) stays
cached after its release, and its residency would heat it as if the guest
used it: held regions would grow by the smoothing's reach every cycle; so
it stays suppressed until the kernel evicts it
(docs/rationale.md#guest-resident).

Blocks the daemon released
^^^^^^^^^^^^^^^^^^^^^^^^^^
Right after a release a block is still cached *because we held it*. When
it was let go because hotter regions took its place (displaced: still a
candidate), that residency would win it the rematch at once, so a
displaced block's residency is suppressed for ``RELEASED_GRACE``: time for
reclaim to take what the guest left (docs/rationale.md#released-grace).
Blocks released because their lease ran out (no longer candidates) are not
suppressed: their renewal is the point of the lease (see ``heat``).
Releases between cycles (a smaller budget on reload, the domain stopped)
count as displacements.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from vmdisktouch.core import heat, regions, spill
from vmdisktouch.core.holes import KnownHoles, Probe
from vmdisktouch.core.intensity import Intensity
# the rules it decides with (``core.rules``: each one's meaning, unit and reason), imported
# from here by the daemon and the tests too
from vmdisktouch.core.rules import (
    CEDE_SECONDS, GUEST_RESIDENT, HOLD_FRACTION, INCUMBENT_WEIGHT, RELEASED_GRACE,
    REWRITTEN_DENSITY, SPLIT_CONTRAST, SPLIT_MIN_BLOCKS, SPLIT_MIN_RATIO, TRACED_INCUMBENT)
from vmdisktouch.core.runs import Run, runs_to_mask
from vmdisktouch.core.sparse import Sparse
from vmdisktouch.core.thrash import Thrash

SELECT_RULES = regions.Rules(hold_fraction=HOLD_FRACTION, incumbent_weight=INCUMBENT_WEIGHT,
                             rewritten_density=REWRITTEN_DENSITY)
TRACED_RULES = regions.Rules(hold_fraction=HOLD_FRACTION, incumbent_weight=TRACED_INCUMBENT,
                             rewritten_density=REWRITTEN_DENSITY, split_contrast=SPLIT_CONTRAST,
                             split_min_blocks=SPLIT_MIN_BLOCKS,
                             split_min_ratio=SPLIT_MIN_RATIO, stay_unless_better=True,
                             rewritten_first=False, spill=True)


@dataclass(frozen=True)
class PolicyParams:
    """The operator's settings the policy uses (``vmdisktouch.settings`` defines them)."""
    heat: heat.HeatParams
    interval: float              # seconds; the first cycle's time step
    rewritten_seconds: float     # how long a rewritten block is shown red

    @classmethod
    def of(cls, config) -> "PolicyParams":
        return cls(
            heat.HeatParams(amp_resident=config.amp_resident,
                            sigma_resident=config.sigma_resident,
                            amp_rewritten=config.amp_rewritten,
                            sigma_rewritten=config.sigma_rewritten,
                            decay=config.decay, threshold=config.threshold),
            interval=config.interval, rewritten_seconds=config.rewritten_seconds)


@dataclass(frozen=True)
class Observation:
    """What one cycle saw of the image, before anything was changed."""
    now: float                   # seconds, any monotonic origin
    resident: np.ndarray         # per block: the fraction in the page cache
    held: np.ndarray             # per block (bool): held by the daemon now
    rewritten: Sparse            # held blocks whose checksum changed: the fraction rewritten
    allocation: int | None       # the file's allocated size (st_blocks); None: no holes
    holding: bool = True         # False while the owning domain is shut off
    # The trace source only (None: the polling source, residency is the evidence):
    reads: Sparse | None = None  # blocks the guest read in this cycle (value 1)
    refaults: Sparse = field(default_factory=Sparse.empty)  # share of each block's pages refaulted
    reconcile: bool = False      # events were lost: residency is evidence too this cycle
    read_counts: Sparse | None = None  # read events per block (None: ``reads`` stand in)
    read_recent: Sparse | None = None  # read events per block weighted by recency (intensity)


@dataclass(frozen=True)
class Plan:
    """What to hold: ``targets`` in priority order (the holder sheds from the end)."""
    targets: list[Run]
    heat: np.ndarray             # the heat map after this cycle's step
    recent: np.ndarray | None    # rewritten fraction in this cycle or the last (None: none)
    candidates: np.ndarray       # blocks that may be held (threshold and hysteresis)

    @cached_property
    def quiet(self) -> np.ndarray:
        """Blocks not rewritten lately: where a recharge disturbs the guest least."""
        if self.recent is None:
            return np.ones(self.heat.size, dtype=bool)
        return self.recent <= 0


class Policy:
    """The policy's memory of one image and the rules that use it."""

    def __init__(self, nblocks: int, params: PolicyParams, *, sparse_file: bool):
        self.params = params
        self.sparse_file = sparse_file      # a regular file: it may have holes
        self.nblocks = int(nblocks)
        self.state = heat.new_state(self.nblocks)
        self.last_rewritten = Sparse.empty()  # rewritten in the last cycle (fractions)
        self.red = Sparse.empty()             # shown red: the time of the last rewrite
        self.released = Sparse.empty()        # displaced: the time of the release
        self.ceded = Sparse.empty()           # left to the guest's cache: the time
        self.thrash: Thrash | None = None     # trace source, once a page refaulted
        self.intensity: Intensity | None = None  # trace source: read rates
        self.self_loaded = np.zeros(self.nblocks, dtype=bool)
        self.held_after = np.zeros(self.nblocks, dtype=bool)  # held when the last cycle ended
        self.known = KnownHoles(self.nblocks)                 # holes (a sparse file)
        self.last_time: float | None = None
        self._pending: tuple[Observation, np.ndarray] | None = None
        self._prepared: tuple | None = None    # prepare's maps, for finish

    # -- one cycle ---------------------------------------------------------

    def prepare(self, obs: Observation, probe: Probe) -> regions.DiskMap | None:
        """Steps 1-5: this disk's part of a selection (None: holding is off); a
        selection over one budget (``regions.allocate``) and ``finish`` follow."""
        n, p, now = self.nblocks, self.params, obs.now
        held = np.asarray(obs.held, dtype=bool)
        recent, rewritten = self._rewrites(obs.rewritten, held, now)
        dt = p.interval if self.last_time is None else max(now - self.last_time, 1e-3)
        self.last_time = now
        self._note_released(self.held_after & ~held, now)     # between cycles
        evidence, suppressed = self._evidence(obs, held)
        self.state = heat.step(self.state, evidence, suppressed, rewritten, dt, p.heat)
        boost = self._boost(obs, held, dt)
        rules = SELECT_RULES if obs.reads is None else TRACED_RULES

        total = self.state.total
        cut, rewritten_heat = self.known.cut(
            (total, self.state.heat_rewritten), obs.allocation,
            (regions.candidate_mask(total, p.heat.threshold, held, SELECT_RULES)
             if self.sparse_file and obs.holding else None), probe)
        self.ceded = self.ceded.newer_than(now, CEDE_SECONDS)
        if self.ceded.blocks.size:
            keep = np.ones(n, dtype=np.float32)
            keep[self.ceded.blocks] = 0
            cut, rewritten_heat = cut * keep, rewritten_heat * keep
        cand = regions.candidate_mask(cut, p.heat.threshold, held, rules)
        self._pending = (obs, cand)
        self._prepared = (total, recent, cand)
        if not obs.holding:
            return None
        return regions.DiskMap(cut, p.heat.threshold, rewritten_heat, held, recent, cand,
                               boost, rules=rules)

    def finish(self, targets: list[Run]) -> Plan:
        """The plan of this cycle, with the targets the selection gave this disk."""
        # The plan has them now: kept here past the cycle they would be one heat map, a
        # candidate mask and a rewritten map a disk held for nothing (a quarter MiB and
        # more of a 64 GiB image).
        (total, recent, cand), self._prepared = self._prepared, None
        return Plan(targets, total, recent, cand)

    def settle(self, held: np.ndarray, *, holes: list[Run] = (), ceded: list[Run] = ()) -> None:
        """What the holder holds after carrying out the last plan, and what it learned."""
        obs, cand = self._pending
        self._pending = None
        self.known.met(holes)
        if ceded:
            self.ceded = self.ceded.merged(Sparse.of_mask(runs_to_mask(ceded, self.nblocks),
                                                          obs.now))
        held = np.array(held, dtype=bool)          # the policy's own copy
        self.self_loaded = self_loaded(self.self_loaded, obs.resident, obs.held, held)
        self._note_released(obs.held & ~held & cand, obs.now)
        self.held_after = held

    def resize(self, nblocks: int) -> None:
        """The image grew or shrank: keep what is known of the common prefix."""
        n = int(nblocks)
        self.state = heat.resize_state(self.state, n)
        self.last_rewritten = self.last_rewritten.below(n)
        self.red = self.red.below(n)
        self.released = self.released.below(n)
        self.ceded = self.ceded.below(n)
        for part in (self.thrash, self.intensity):
            if part is not None:
                part.resize(n)
        self.self_loaded = _resized(self.self_loaded, n)
        self.held_after = _resized(self.held_after, n)
        self.known = KnownHoles(n)
        self.nblocks = n

    # -- the steps ---------------------------------------------------------

    def _rewrites(self, now_rewritten: Sparse, held: np.ndarray, now: float):
        """(recent, rewritten): the first class of the selection and this cycle's rewrites."""
        n = self.nblocks
        shown = now_rewritten.blocks[held[now_rewritten.blocks]]
        self.red = self.red.merged(Sparse(shown, np.full(shown.size, now)))
        self.red = self.red.newer_than(now, self.params.rewritten_seconds)
        rewritten = now_rewritten.dense(n)
        recent = None
        if rewritten is not None or self.last_rewritten.blocks.size:
            recent = self.last_rewritten.dense(n, always=True)
            if rewritten is not None:
                np.maximum(recent, rewritten, out=recent)
        self.last_rewritten = now_rewritten
        return recent, rewritten

    def _evidence(self, obs: Observation, held: np.ndarray):
        """(evidence, suppressed) for the heat step: residency with the daemon's own blocks
        suppressed (polling), or the reads, everywhere (trace; after lost events the
        suppressed residency stands in for the missed reads)."""
        evidence = None if obs.reads is None else obs.reads.dense(self.nblocks, always=True)
        if evidence is not None and not obs.reconcile:
            return evidence, None
        suppressed = held | self.self_loaded
        suppressed[self.released.blocks] = True
        if evidence is None:
            return obs.resident, suppressed
        np.maximum(evidence, np.where(suppressed, np.float32(0), obs.resident), out=evidence)
        return evidence, None

    def _boost(self, obs: Observation, held: np.ndarray, dt: float):
        """The rank multiplier of the blocks: read intensity times thrash (trace source),
        or None (polling)."""
        if obs.reads is None:
            return None
        if self.intensity is None:
            self.intensity = Intensity(self.nblocks)
        self.intensity.fold(_read_counts(obs), dt, self.params.heat.sigma_resident,
                            obs.read_recent)
        boost, thrash = self.intensity.multiplier(), self._thrash(obs, held, dt)
        return thrash if boost is None else boost if thrash is None else boost * thrash

    def _thrash(self, obs: Observation, held: np.ndarray, dt: float):
        """The thrash multiplier of the blocks (``core.thrash``), or None with no refaults."""
        if obs.refaults.blocks.size and self.thrash is None:
            self.thrash = Thrash(self.nblocks)
        if self.thrash is None:
            return None
        reads = _read_counts(obs)
        self.thrash.fold(obs.refaults, reads if reads is not None else Sparse.empty(), held,
                         heat.decay_factor(self.params.heat.decay, dt))
        if not self.thrash.active:
            self.thrash = None
            return None
        return self.thrash.multiplier(held)

    def thrashing(self) -> np.ndarray:
        """Blocks thrashing now and not held (``Thrash.thrashing``)."""
        if self.thrash is None:
            return np.zeros(0, dtype=np.intp)
        return self.thrash.thrashing(self.held_after)

    def _note_released(self, mask: np.ndarray, now: float) -> None:
        """Remember the blocks of ``mask`` as released at ``now``; forget those past the grace."""
        if mask.any():
            self.released = self.released.merged(Sparse.of_mask(mask, now))
        self.released = self.released.newer_than(now, RELEASED_GRACE)


def select(maps: list[regions.DiskMap], budget_blocks: int, spill_factor: float,
           spilled: list[list[Run]]) -> tuple[regions.Allocation, list[list[Run]]]:
    """Step 6 for one disk or many, the one selection every mode runs: (the allocation:
    each disk's targets, share and limit; each disk's spill). Every disk's regions go in
    one priority queue under one budget, by benefit per byte (``regions.allocate``); the
    regions ranked next are spilled (``spill``); ``spilled``: each disk's spill of the
    last cycle."""
    alloc = regions.allocate(maps, budget_blocks, SELECT_RULES)
    return alloc, spill.beyond(maps, budget_blocks, spill_factor, SELECT_RULES, alloc.runs,
                               spilled)


def self_loaded(previous, resident, held_before, held_after) -> np.ndarray:
    """Blocks whose residency the daemon itself caused; suppressed as if held.

    A block loaded while less than ``GUEST_RESIDENT`` resident is marked;
    it stays marked while it is held or still resident, and once the kernel
    has evicted it (below ``GUEST_RESIDENT``) residency there is the
    guest's again. ``resident``: this cycle's scan, taken before the holder
    acted; ``held_before``/``held_after``: held before and after it acted.
    """
    guest = np.asarray(resident) >= GUEST_RESIDENT
    before = np.asarray(held_before, dtype=bool)
    after = np.asarray(held_after, dtype=bool)
    prev = np.zeros(guest.shape, bool) if previous is None else np.asarray(previous, dtype=bool)
    return (prev & (after | guest)) | (after & ~before & ~guest)


def _read_counts(obs: Observation) -> Sparse | None:
    """Read events per block (the trace source), the 0/1 reads standing in for them."""
    return obs.read_counts if obs.read_counts is not None else obs.reads


def _resized(a: np.ndarray, n: int) -> np.ndarray:
    out = np.zeros(n, dtype=a.dtype)
    k = min(n, a.size)
    out[:k] = a[:k]
    return out
