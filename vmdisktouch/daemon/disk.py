"""One disk image's part of a cycle: observe, decide, act, emit.

Theory of operation
-------------------
A ``DiskWatcher`` observes and acts for its own disk, with the parts
``build`` made; it runs no cycle of its own: the host (``daemon.host``)
drives every cycle, for one disk or many, and between ``prepare`` (steps 1
and 2 up to the selection) and ``act`` (steps 3 and 4) selects over every
disk served (``policy.select``).

1. Observe (``_observe``). Check the image is still the same file and
   follow a size change. Ask the access source (``sources``) what the
   guest did: with the trace source, the blocks it read, wrote and
   refaulted, from kernel tracepoints, and residency kept from the cache's
   events (reconciled by a mincore pass every few cycles); with the polling
   source, residency scanned (``ResidencyTracker``: cachestat, then mincore
   of the ranges that changed) and a rotating share of the held blocks
   checksummed (``BlockChecksums``): the fraction of each block's sixteen
   parts that changed is how much of it the guest rewrote. Read the file's
   allocated size. Together: one ``policy.Observation``.
2. Decide. ``Policy.prepare`` turns the observation and the policy's memory
   into this disk's candidate map; the host's selection (``policy.select``)
   gives it its targets, in priority order, and ``Policy.finish`` the
   ``Plan`` (``core/policy`` explains every rule). Its only question to the system is the probe for
   holes (``Image.data_runs``).
3. Act. ``Recharger.act`` hands the targets to the holder, which releases
   first, then loads in priority order, never above the budget or below
   the free-memory floor, and recharges held blocks charged to another
   memory-limited cgroup beyond its cap. Blocks newly held are hashed at
   once by the polling source, so a write before the next cycle counts. ``Policy.settle`` learns
   what is held now, the holes met and the blocks ceded.
4. Emit. The status JSON and the PNGs are written atomically
   (``report``); one log line.

With ``VMDISKTOUCH_RECORD=FILE`` each cycle's observation and plan are
also noted in the host's record (``record``, ``recorder``: the host sets it):
the golden traces of the policy tests.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Callable

import numpy as np

from vmdisktouch.core import heat
from vmdisktouch.core.policy import Observation, Policy, PolicyParams
from vmdisktouch.core.runs import byte_ranges, consecutive_runs, runs_to_mask
from vmdisktouch.errors import VmdtError
from vmdisktouch.daemon.act import Acted, Recharger
from vmdisktouch.daemon.emit import CycleReport, Emitter
from vmdisktouch.daemon.reasons import Allotment, Facts, why_not_held
from vmdisktouch.sizes import counted, format_size
from vmdisktouch.report import DiskReport
from vmdisktouch.core import advice
from vmdisktouch.core.shares import Demand, guest_depth, heat_curve, saved_per_second
from vmdisktouch.system.hold.spill import SpillResult

EVIDENCE = 2       # a curve speaks for a disk once it has seen its reads this many times over

log = logging.getLogger("vmdisktouch")


def depth_of(source, cost: float | None) -> float:
    """The guest's reads in flight as its misses show (``shares.guest_depth``): the pages
    it read a second that needed a page added (its source's last gain), times ``cost``."""
    gain = getattr(source, "gain", None) or {}
    pages = gain.get("pages_read_per_second") or 0.0
    return guest_depth(pages * (1.0 - (gain.get("cache_hit_ratio") or 0.0)), cost)


class DiskWatcher:
    """Runs the vmdisktouch cycle on one open image (made by ``build.build``)."""

    def __init__(self, image, config, *, policy: Policy, holder, source,
                 recharger: Recharger, emitter: Emitter, clock: Callable[[], float],
                 mem_available: Callable[[], int], spiller=None, miss_cost=None):
        self.image = image
        self.config = config
        self.block_size = config.block_size
        self.policy = policy
        self.holder = holder
        self.source = source
        self.recharger = recharger
        self.emitter = emitter
        self.clock = clock
        self.mem_available = mem_available
        self.recorder = None                     # the host's ``record.Recorder``, if any
        self.spiller = spiller                   # None: no spill (``system.hold.spill``)
        self.miss_cost = miss_cost               # None: not measured (``observe.miss_cost``)
        self.last_spill = SpillResult()
        self.spilled: list = []                  # the runs spilled last cycle (``core.spill``)
        self.cycle = 0
        self.last_report: CycleReport | None = None
        self.last_disk: DiskReport | None = None   # the report of the last cycle
        # False while the owning libvirt domain is shut off: hold nothing, keep scanning.
        self.hold_enabled = True
        self.domain_active: bool | None = None   # from libvirt; None: not under libvirt
        self.domain: str | None = None           # its libvirt domain and target, if known
        self.adopted: float | None = None        # ``vmdisktouch adopt`` switched it since
        self.adopted_gain: tuple = (None, None)  # since then: measured, advised (``adoption``)
        self.target: str | None = None
        self.allotment: Allotment | None = None  # the last selection's share (``host``)
        self.warmed_from: str | None = None      # "state", "metadata" (``served``); None: cold
        self._restored = False                   # restored heat not loaded yet (``restore``)
        self._released_between = 0               # by a reload or a size change
        self._cycle: tuple | None = None         # prepare's (start, observation, resident)
        self._map = None                         # prepare's map of the last full cycle
        self._idle: tuple | None = None          # an idle full cycle's state (``_quiet``)
        self._skipping = False                   # this cycle is skipped (``prepare``)
        self._hole_map: tuple | None = None      # ((allocation, nblocks), holes per block)

    @property
    def outputs(self):
        return self.emitter.outputs

    @property
    def state(self):
        """The heat map (``policy.state``)."""
        return self.policy.state

    def reconfigure(self, config) -> int:
        """Take new settings (SIGHUP) keeping the holds; returns the bytes released.

        A smaller budget or a higher floor releases the lowest-priority regions
        at once. The block size is the unit of every map: it cannot change
        without a restart, so a new one is ignored with a warning.
        """
        if config.block_size != self.block_size:
            log.warning("block_size cannot change on reload (%s stays; restart to change it)",
                        format_size(self.block_size))
            config = type(config)(config, block_size=self.block_size)
        if config.access_source != self.config.access_source:
            log.warning("access_source cannot change on reload (%s stays, the %s source; "
                        "restart to change it)", self.config.access_source, self.source.name)
            config = type(config)(config, access_source=self.config.access_source)
        self.config = config
        self.policy.params = PolicyParams.of(config)
        self.holder.load_rate = config.load_rate
        if self.spiller is not None:
            self.spiller.load_rate = config.load_rate
        released = self.holder.set_floor(config.min_free)      # the budget: the host's
        self._released_between += released
        return released

    # -- the cycle --------------------------------------------------------

    def demand(self, m, weight: float = 1.0):
        """What memory buys this disk (``core.shares.Demand``), for its map ``m`` this
        cycle: from its curve once that is evidence (``_curve_seen``), before that from
        the curve its heat implies (``shares.heat_curve``, ``seen`` False); None without
        a curve at all (the mincore source)."""
        mrc = getattr(self.source, "mrc", None)
        if mrc is None or not mrc.reads_per_second:
            return None
        page = self.source.page_size
        cost = self.miss_cost.seconds if self.miss_cost is not None else None
        depth = depth_of(self.source, cost)
        if self._curve_seen(m.candidate_blocks() * self.block_size) is None:
            return Demand(heat_curve(m.total_heat, m.candidates, self.block_size),
                          mrc.reads_per_second, cost, weight, seen=False, depth=depth)
        return Demand(lambda b: mrc.curve(np.asarray(b) / page), mrc.reads_per_second, cost,
                      weight, depth=depth)

    def curve_wants(self, candidates: int) -> int | None:
        """What its curve says still pays (``mrc.wants``, in the cycle's gain); None without
        a curve that is evidence yet (``_curve_seen``). A budget verdict also waits for
        ``advice.evidence``'s minimum (``alerts``)."""
        gain = getattr(self.source, "gain", None)
        if self._curve_seen(candidates) is None or not gain:
            return None
        return gain.get("wants_bytes")

    def curve_evidence(self) -> dict | None:
        """What its curve stands on (``advice.evidence``): the reads it has seen (decayed,
        as its histogram), the re-reads among them and how long it has watched, and whether
        that is enough to say a size; None without a curve."""
        mrc = getattr(self.source, "mrc", None)
        if mrc is None:
            return None
        return advice.of_curve(mrc)

    def _curve_seen(self, candidates: int):
        """The curve (``core.mrc``) once it has seen the guest's reads come back, else None:
        when at least 1 - 1/``EVIDENCE`` of them were re-reads (its working set read about
        ``EVIDENCE`` times over), or it has read ``EVIDENCE`` times the ``candidates`` bytes
        its heat would hold (a guest that never re-reads as much: nothing more to wait
        for). A young curve has seen only the reuses shorter than its age: a zone re-read
        every five minutes looked flat past what 4 minutes showed, and lost its memory to a
        disk read more often but less per byte, where the heat's read rate per block was
        right from the start (docs/benchmarks/host-budget.md#host-budget-xy)."""
        mrc = getattr(self.source, "mrc", None)
        if mrc is None or not mrc.reads_per_second:
            return None
        if mrc.reuse_share >= 1 - 1 / EVIDENCE or \
                mrc.reads * self.source.page_size >= EVIDENCE * max(candidates, 1):
            return mrc
        return None

    def prepare(self):
        """Observe and decide up to the selection: this disk's ``regions.DiskMap`` (None
        while holding is off). ``act`` with the targets the selection gave it follows.

        A quiet cycle is skipped (``_quiet``): its map is the last full cycle's, which
        had no candidate, and ``act`` only reports; a disk nobody reads costs a poll a
        cycle, not passes over its blocks (docs/benchmarks/host-cost.md)."""
        t0 = self.clock()
        self._skipping = self._quiet()
        if self._skipping:
            if self.miss_cost is not None:         # its probes keep their pace all the same
                self.miss_cost.cycle(self._cycle[1].resident, self.image.size)
            self._cycle = (t0,) + self._cycle[1:3] + (self.clock(),)
            return self._map
        obs, resident_bytes, misses = self._observe(t0)
        if self.miss_cost is not None:
            self.miss_cost.cycle(obs.resident, self.image.size, misses)
        probe = (self._probe if not self.recorder
                 else self.recorder.probe(self.image.path, self._probe))
        m = self._map = self.policy.prepare(obs, probe)
        self._cycle = (t0, obs, resident_bytes, self.clock())
        return m

    def _quiet(self) -> bool:
        """This cycle can change nothing: the last full cycle was idle (``_was_idle``) with
        the same settings and domain state, the image is the same file of the same size,
        and its source saw nothing since (``TraceSource.quiet``: the polling source never
        is). The heat only decays meanwhile: the next full cycle decays it over the whole
        time since the last (``heat.step`` over ``dt``), as the cycles skipped would have."""
        if self._idle != self._idle_key():
            return False
        self.image.check_identity()
        if self.image.current_size() != self.image.size:
            return False
        quiet = getattr(self.source, "quiet", None)
        return quiet is not None and quiet()

    def _idle_key(self) -> tuple:
        """What a skipped cycle must find as the idle full cycle left it: the holding and
        domain state, and the settings (a reload makes new ones)."""
        return (self.hold_enabled, self.domain_active, self.config)

    def _was_idle(self, r: CycleReport) -> bool:
        """The full cycle just run left nothing that a next cycle without events would
        change: nothing held, spilled or loaded, released or rewritten, no per-disk
        picture to redraw, no heat at the threshold (without reads it only decays)."""
        c = self.config
        return not (c.heat_png or c.map_png or self._restored or self.spilled
                    or self.holder.held_bytes() or self.last_spill.target_bytes
                    or r.loaded_bytes or r.released_bytes or r.skipped_bytes
                    or r.rewritten_blocks or r.spill_read_bytes) \
            and float(self.policy.state.total.max(initial=0.0)) < c.threshold

    def act(self, targets, spill_runs=()) -> CycleReport:
        """Hold ``targets`` (this disk's share of the selection), spill ``spill_runs``
        (``core.spill``) into free memory, learn, report."""
        if self._skipping:
            return self._act_skipped(targets, spill_runs)
        t0, obs, resident_bytes, prepared = self._cycle
        # This disk's own time: the selection and, on a host, the other disks' turns
        # between its prepare and its act are not its own.
        own_start = t0 + (self.clock() - prepared)
        plan = self.policy.finish(targets)
        # A cold disk's first loads, and a warm one's first selection, at once (``restore``).
        self.holder.unpaced = self.source.cold or self._restored
        acted = self.recharger.act(plan, obs.held, t0, self.config, holding=obs.holding)
        self._restored = self._restored and not obs.holding
        self.policy.settle(acted.held, holes=acted.holes, ceded=acted.ceded)
        if acted.result.loaded_bytes:
            self.source.taken(np.flatnonzero(acted.held & ~obs.held), self.image.size)
        self.source.settled(acted.held)
        spilling = self.spiller is not None and spill_runs and obs.holding
        self.last_spill = (self.spiller.warm(spill_runs, self.config.min_free,
                                             resident=obs.resident)
                           if spilling else SpillResult())
        self.source.cached(self.last_spill.cached)
        self.spilled = list(spill_runs) if spilling else []   # the next selection's incumbents
        self.source.brace(acted.held, self.last_spill.target_bytes)
        self.cycle += 1
        report = self._report(own_start, obs, acted, resident_bytes)
        self._idle = self._idle_key() if self._was_idle(report) else None
        if self.recorder:
            self.recorder.disk(self.image.path, self.config, self.image.is_regular,
                               obs, plan, acted, self.policy)
        self.last_disk = self.disk_report(report)      # the host's report gathers it
        self.emitter.emit(report, self.config, self.last_disk, obs.resident,
                          acted.held, self.policy,
                          holes=self._holes(obs.allocation) if self.config.map_png else None)
        return report

    def _act_skipped(self, targets, spill_runs) -> CycleReport:
        """A skipped cycle's act: the last full cycle's report, counted as this cycle's,
        with its time and MemAvailable (the figures an idle cycle would give). Targets
        given all the same (none should be: its map had no candidate) end the quiet: the
        next cycle is full."""
        if targets or spill_runs:
            self._idle = None
        t0, obs = self._cycle[:2]
        self.cycle += 1
        self.last_report = replace(self.last_report, cycle=self.cycle,
                                   cycle_seconds=self.clock() - t0,
                                   mem_available_bytes=self.mem_available(),
                                   share_bytes=self._share_bytes())
        self.last_disk = self.disk_report(self.last_report)
        self.emitter.emit(self.last_report, self.config, self.last_disk, obs.resident,
                          self.policy.held_after, self.policy)
        return self.last_report

    def _holes(self, allocation: int | None) -> np.ndarray | None:
        """The image's holes per block, for the block map: probed again only when the
        allocation (``st_blocks``) or the size changed; None for a block device."""
        n = self.policy.nblocks
        key = (allocation, n)
        if allocation is None:
            return None
        if self._hole_map is None or self._hole_map[0] != key:
            data = runs_to_mask(self.image.data_runs((0, n), self.block_size), n)
            self._hole_map = (key, ~data)
        return self._hole_map[1]

    def _observe(self, now: float) -> tuple[Observation, int, tuple[int, int] | None]:
        self.image.check_identity()
        self._follow_size()
        held = runs_to_mask(self.holder.held_runs(), self.policy.nblocks)
        seen = self.source.observe(self.image.size, held, self.config)
        obs = Observation(now, seen.resident, held, seen.rewritten, self.image.allocation(),
                          self.hold_enabled, reads=seen.reads, refaults=seen.refaults,
                          read_counts=seen.read_counts, read_recent=seen.read_recent,
                          reconcile=seen.reconcile)
        return obs, seen.resident_bytes, seen.misses

    def pump(self) -> bool:
        """Between cycles: let the source drain what it has buffered (trace events).
        True when the guest's reads ask for a cycle now (``core.shift``).

        A failure here is left for the next cycle's observation to report.
        """
        try:
            return self.source.pump(between=True)
        except (OSError, VmdtError) as exc:
            log.debug("draining trace events between cycles failed: %s", exc)
            return False

    def _probe(self, run):
        return self.image.data_runs(run, self.block_size)

    def _follow_size(self) -> None:
        before = self.image.size
        size = self.image.refresh_size()
        if size == before:
            return
        old, new = format_size(before), format_size(size)
        if old == new:
            old, new = f"{before} bytes", f"{size} bytes"
        log.warning("%s: size changed from %s to %s; adapting", self.image.path, old, new)
        self._released_between += self.holder.resize(size)
        n = self.image.block_count(self.block_size)
        self.policy.resize(n)
        self.source.resize(n)
        self.recharger.charges.resize(n)

    def _report(self, t0: float, obs: Observation, acted: Acted,
                resident_bytes: int) -> CycleReport:
        bs, size = self.block_size, self.image.size
        released_between, self._released_between = self._released_between, 0
        n = min(acted.held.size, obs.held.size, obs.resident.size)
        fresh = acted.held[:n] & ~obs.held[:n]           # loaded this cycle
        relocked = int(float(obs.resident[:n][fresh].sum()) * bs) if fresh.any() else 0
        self.last_report = CycleReport(
            cycle=self.cycle,
            cycle_seconds=self.clock() - t0,
            held_bytes=self.holder.held_bytes(),
            resident_bytes=resident_bytes,
            regions=[(s * bs, min(e * bs, size) - s * bs) for s, e in self.holder.held_runs()],
            rewritten_blocks=int(obs.rewritten.blocks.size),
            rewritten_ranges=byte_ranges(*self.policy.red.run_edges(), bs, size),
            mem_available_bytes=self.mem_available(),
            loaded_bytes=acted.result.loaded_bytes,
            released_bytes=acted.released_bytes + released_between,
            skipped_bytes=acted.result.skipped_bytes,
            size_bytes=size,
            relocked_bytes=min(relocked, acted.result.loaded_bytes),
            spill_read_bytes=self.last_spill.read_bytes,
            shed_bytes=acted.result.shed_bytes,
            share_bytes=self._share_bytes(),
        )
        why = why_not_held(self.last_report, self.config, Facts(
            obs.holding, self.allotment, lambda: float(self.policy.state.total.max(initial=0.0)),
            self.config.threshold, acted.result.lock_refused,
            int(self.policy.ceded.blocks.size) * bs, arriving=self.domain_active is True))
        self.last_report.limited_by, self.last_report.not_held_reason = why or (None, None)
        return self.last_report

    def _share_bytes(self) -> int:
        """Its share of the budget: the last selection's, or ``max_hold`` before one."""
        return self.config.max_hold if self.allotment is None else self.allotment.share

    def disk_report(self, r: CycleReport) -> DiskReport:
        return self.emitter.disk_report(
            r, self.config, path=self.image.path, domain=(self.domain, self.target),
            allotment=self.allotment, domain_active=self.domain_active,
            holding=self.hold_enabled, lock_cap=self.holder.lock_cap,
            charges=self.recharger.charges.status(), source=self._source_status(),
            warmed_from=self.warmed_from, adopted_since=self.adopted,
            adopted_gain=self.adopted_gain)

    def _source_status(self) -> dict:
        bs, size = self.block_size, self.image.size
        sp = self.last_spill
        source = self.source.status()
        cost = self.miss_cost.status() if self.miss_cost is not None else None
        gain = source.get("gain")
        if gain is not None:
            s = cost and cost["seconds"]
            source["gain"] = {**gain, "read_seconds_saved_per_second": (
                None if not s else round(saved_per_second(
                    gain["held_reads_per_second"], s, depth_of(self.source, s)), 4)),
                "curve_seen": self.allotment is not None and
                self.allotment.curve_wants is not None}
        ev = self.curve_evidence()
        if ev is not None and isinstance(source.get("mrc"), dict):
            source["mrc"] = {**source["mrc"], "re_reads": ev["re_reads"],
                             "window_seconds": ev["window_seconds"],
                             "enough_reads": ev["enough"], "wait_seconds": ev["wait_seconds"]}
        return {**source, "miss_cost": cost,
                "spill": {"target_bytes": sp.target_bytes, "read_bytes": sp.read_bytes,
                          "backed_off_bytes": sp.backed_off_bytes, "stopped": sp.stopped},
                "thrashing_ranges": [[s * bs, min(e * bs, size) - s * bs]
                                     for s, e in consecutive_runs(self.policy.thrashing())]}

    def last_maps(self) -> tuple[np.ndarray, np.ndarray]:
        """(resident fraction, held) per block, as of the last cycle."""
        resident = (self._cycle[1].resident if self._cycle is not None
                    else np.zeros(self.policy.nblocks, dtype=np.float32))
        return resident, self.policy.held_after

    def restore(self, saved, away_seconds: float) -> None:
        """Start from saved heat (``warm_state.Saved``: the state file's, or a domain's
        summary's), each block's capped by ``heat.cap_loaded`` (one WARNING line when it
        was over), decayed over ``away_seconds``.

        The first selection made while holding is loaded unpaced, as a cold disk's
        first loads are: it is what the guest read just before it went away (a
        restart, a reboot, a restore, a migration), so each second paced is a
        second the guest waits on the disk for it (docs/benchmarks.md,
        warm-restart-reboot)."""
        params = self.policy.params.heat
        loaded, capped = heat.cap_loaded(heat.HeatState(saved.heat_resident,
                                                        saved.heat_rewritten), params)
        if capped:
            log.warning("%s: the heat loaded for %s was above %g, the most reads make; "
                        "capped to it", self.image.path, counted(capped, "block"),
                        heat.loaded_most(params))
        k = np.float32(heat.decay_factor(params.decay, max(0.0, away_seconds)))
        self.policy.state = heat.HeatState(loaded.heat_resident * k, loaded.heat_rewritten * k)
        # decayed to now: the next cycle's step counts from now, not from the last cycle (a
        # disk that waited for its domain's arrival would lose that wait's decay twice)
        self.policy.last_time = self.clock()
        self._restored = True

    def warm_state(self) -> tuple[np.ndarray, np.ndarray, list]:
        """(heat resident, heat rewritten, held runs) to save."""
        st = self.policy.state
        return st.heat_resident, st.heat_rewritten, list(self.holder.held_runs())

    def close(self) -> None:
        self.holder.release_all()
        self.holder.close()
        self.source.close()
        self.recharger.close()
        if self.miss_cost is not None:
            self.miss_cost.close()

