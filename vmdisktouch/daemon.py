"""The daemon's cycle for one disk image: sample, heat, plan, hold, show.

This module wires the pure core (``heat``, ``regions``) to the OS layer
(``residency``, ``holder``, ``checksums``, ``meminfo``) and the emitters
(``render``, ``atomic``). It holds no policy of its own beyond the order of
the steps; every part comes in through the constructor, so tests can pass
fakes at these seams, and the clock is passed in.

One cycle (``DiskWatcher.tick``):

1. Check the image is still the same file; re-read its size and, when it
   changed, resize every per-block map and drop holds beyond the new end.
2. Scan residency (cachestat/mincore) into a per-block resident fraction,
   re-reading only the ranges whose cachestat record changed
   (``residency_tracker``).
3. Checksum the held blocks (``pread``, never the mapping) in 16 parts
   each: the fraction of a block's parts that changed is how much of it
   the guest rewrote. Blocks newly taken into hold in step 5 are
   hashed right after their load, so a write before the next cycle counts.
4. Step the heat map: held blocks, blocks cached only because the
   daemon loaded them (``heat.self_loaded``) and blocks released in the last
   ``heat.RELEASED_GRACE`` seconds are zeroed (feedback suppression),
   residency and rewrites are smoothed and folded into the decaying map.
5. Select target runs under the budget (blocks known to be holes of a
   sparse file, and blocks ceded to a guest's own cache, left out) and hand
   them to the holder, which releases first, then loads, never above the
   budget or below the floor. Held blocks charged to another memory-limited
   cgroup beyond its cap are recharged on the way (``_hold``; ``charges``).
6. Write the status JSON and the PNGs atomically (``outputs``); log one line.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import stat
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from vmdisktouch.core import charges, heat, regions
from vmdisktouch.system import checksums, holder, meminfo, residency
from vmdisktouch.adapters import outputs
from vmdisktouch.system.charge_tracker import ChargeTracker
from vmdisktouch.system.image import Image
from vmdisktouch.system.residency_tracker import ResidencyTracker
from vmdisktouch.core.runs import consecutive_runs
from vmdisktouch.sizes import format_size

log = logging.getLogger("vmdisktouch")


def _memcg(reader):
    """The memory-cgroup reader to use, or None (logged once) where it cannot work."""
    if reader != "auto":
        return reader
    from vmdisktouch.system import memcg
    reader = memcg.MemcgReader()
    if not reader.available:
        log.info("not checking whose memory cgroup the held pages are charged to: %s",
                 reader.reason)
        reader.close()
        return None
    return reader


def runs_to_mask(runs, nblocks: int) -> np.ndarray:
    mask = np.zeros(nblocks, dtype=bool)
    for start, stop in runs:
        mask[start:min(stop, nblocks)] = True
    return mask


def _resized(a: np.ndarray, n: int, fill) -> np.ndarray:
    """``a`` cut or extended with ``fill`` to length ``n``."""
    out = np.full(n, fill, dtype=a.dtype)
    k = min(n, a.size)
    out[:k] = a[:k]
    return out


@dataclass(frozen=True)
class _Sparse:
    """Values of a few blocks of a per-block map: block numbers (sorted, unique) and values."""
    blocks: np.ndarray
    values: np.ndarray

    @classmethod
    def empty(cls) -> "_Sparse":
        return cls(np.zeros(0, dtype=np.intp), np.zeros(0))

    def where(self, keep: np.ndarray) -> "_Sparse":
        return _Sparse(self.blocks[keep], self.values[keep])

    def below(self, n: int) -> "_Sparse":
        return self.where(self.blocks < n)

    def merged(self, newer: "_Sparse") -> "_Sparse":
        """Both sets of blocks; ``newer``'s value where both have one."""
        blocks = np.concatenate((newer.blocks, self.blocks))
        values = np.concatenate((newer.values, self.values))
        blocks, first = np.unique(blocks, return_index=True)   # first: newer wins
        return _Sparse(blocks, values[first])

    def dense(self, n: int, always: bool = False) -> np.ndarray | None:
        """The full float32 map (0 elsewhere); None when empty unless ``always``."""
        if not self.blocks.size and not always:
            return None
        out = np.zeros(n, dtype=np.float32)
        out[self.blocks] = self.values
        return out

    def runs(self) -> list[tuple[int, int]]:
        """Maximal runs of consecutive blocks."""
        return consecutive_runs(self.blocks)


@dataclass
class CycleReport:
    cycle: int
    cycle_seconds: float
    held_bytes: int
    resident_bytes: int
    regions: list[tuple[int, int]]          # byte ranges held
    rewritten_blocks: int
    rewritten_ranges: list[tuple[int, int]]  # byte ranges shown red
    mem_available_bytes: int
    loaded_bytes: int
    released_bytes: int
    skipped_bytes: int
    size_bytes: int


def _runs(mask_or_runs) -> list:
    if isinstance(mask_or_runs, np.ndarray):
        return [list(r) for r in regions.mask_runs(mask_or_runs)]
    return [[int(a), int(b)] for a, b in mask_or_runs]


class _Recorder:
    """Each cycle's observation and decision as one gzip JSON line (VMDISKTOUCH_RECORD).

    For the golden replay tests of the policy (tests/core/test_golden.py).
    """

    def __init__(self, path: str):
        self.file = gzip.open(path, "wt")
        self.cycle: dict = {}

    def write(self) -> None:
        self.file.write(json.dumps(self.cycle, separators=(",", ":")) + "\n")
        self.file.flush()
        self.cycle = {}

    def close(self) -> None:
        self.file.close()


class DiskWatcher:
    """Runs the vmdisktouch cycle on one open image."""

    def __init__(self, image: Image, config, *, clock: Callable[[], float] = time.monotonic,
                 mem_available: Callable[[], int] = meminfo.mem_available,
                 sleep: Callable[[float], object] = time.sleep,
                 out: outputs.Outputs | None = None, memcg_reader="auto"):
        self.image = image
        self.config = config
        self.clock = clock
        # Unreadable MemAvailable reads as 0: nothing is loaded and, with a
        # floor, everything is shed (the floor cannot be checked).
        self.mem_available = meminfo.FailSafe(mem_available)
        self.outputs = out if out is not None else outputs.Outputs(
            [outputs.Protected.of_fd(image.fd, f"the disk image {image.path}")])
        self._lock_refused = False
        self.block_size = config.block_size
        residency.validate_block_size(self.block_size)
        self.params = self._heat_params(config)
        self.size = image.current_size()
        self.nblocks = self._nblocks(self.size)
        self.state = heat.new_state(self.nblocks)
        # Rewrites, kept sparse (a few blocks of a million): the blocks rewritten
        # in the last cycle with the fraction rewritten, and the blocks shown red
        # with the time of their last rewrite (both sorted by block).
        self.last_rewritten = _Sparse.empty()
        self.red = _Sparse.empty()
        self.self_loaded = np.zeros(self.nblocks, dtype=bool)   # see heat.self_loaded
        self.ceded = _Sparse.empty()        # blocks left to the guest's cache, with the time
        self.released = _Sparse.empty()     # blocks released lately, with the time (heat.RELEASED_GRACE)
        self._held_after = np.zeros(self.nblocks, dtype=bool)   # held at the end of the last tick
        self.holes = np.zeros(self.nblocks, dtype=bool)         # see _without_holes
        self.probed = np.zeros(self.nblocks, dtype=bool)        # data or hole known
        self.allocation: int | None = None
        self.holder = holder.Holder(
            image.fd, self.size, self.block_size, config.max_hold, config.min_free,
            mem_available=self.mem_available, load_rate=config.load_rate, sleep=sleep)
        self.sums = checksums.BlockChecksums(image.fd, self.block_size)
        self.tracker = ResidencyTracker(image.fd, self.block_size)
        self.charges = ChargeTracker(_memcg(memcg_reader), self.block_size, self.nblocks)
        self.cycle = 0
        self.last_time: float | None = None
        self.last_report: CycleReport | None = None
        # False while the owning libvirt domain is shut off: hold nothing, keep scanning.
        self.hold_enabled = True
        self.domain_active: bool | None = None   # from libvirt; None: not under libvirt
        self._released_between = 0               # by a reload or a size change
        path = os.environ.get("VMDISKTOUCH_RECORD")
        self.recorder = _Recorder(path) if path else None

    @staticmethod
    def _heat_params(config) -> heat.HeatParams:
        return heat.HeatParams(
            amp_resident=config.amp_resident, sigma_resident=config.sigma_resident,
            amp_rewritten=config.amp_rewritten, sigma_rewritten=config.sigma_rewritten,
            decay=config.decay, threshold=config.threshold)

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
        self.params = self._heat_params(config)
        self.config = config
        self.holder.load_rate = config.load_rate
        released = self.holder.set_budget(config.max_hold, config.min_free)
        self._released_between += released
        return released

    def _nblocks(self, size: int) -> int:
        return -(-size // self.block_size)

    # -- the cycle --------------------------------------------------------

    def _follow_size(self) -> None:
        size = self.image.current_size()
        if size == self.size:
            return
        old, new = format_size(self.size), format_size(size)
        if old == new:
            old, new = f"{self.size} bytes", f"{size} bytes"
        log.warning("%s: size changed from %s to %s; adapting", self.image.path, old, new)
        self._released_between += self.holder.resize(size)
        self.size = size
        n = self._nblocks(size)
        self.state = heat.resize_state(self.state, n)
        self.last_rewritten = self.last_rewritten.below(n)
        self.red = self.red.below(n)
        self.self_loaded = _resized(self.self_loaded, n, False)
        self.released = self.released.below(n)
        self.ceded = self.ceded.below(n)
        self._held_after = _resized(self._held_after, n, False)
        self.holes = np.zeros(n, dtype=bool)
        self.probed = np.zeros(n, dtype=bool)
        self.sums.resize(n)
        self.charges.resize(n)
        self.nblocks = n

    def tick(self) -> CycleReport:
        t0 = self.clock()
        self.image.check_identity()
        self._follow_size()
        n = self.nblocks

        res = self.tracker.scan(self.size)
        fraction = res.fraction()
        held_mask = runs_to_mask(self.holder.held_runs(), n)

        held_blocks = np.flatnonzero(held_mask)
        part = self.sums.update(held_blocks, self.size, skip_unwritten=True)
        hit = part > 0
        now_rewritten = _Sparse(held_blocks[hit], part[hit])   # fraction of each block rewritten
        self.red = self.red.merged(_Sparse(now_rewritten.blocks,
                                           np.full(now_rewritten.blocks.size, t0)))
        self.red = self.red.where(t0 - self.red.values < self.config.rewritten_seconds)
        rewritten = now_rewritten.dense(n)
        # Rewritten in this cycle or the one before: the first class of regions.select.
        recent = None
        if rewritten is not None or self.last_rewritten.blocks.size:
            recent = self.last_rewritten.dense(n, always=True)
            if rewritten is not None:
                np.maximum(recent, rewritten, out=recent)
        self.last_rewritten = now_rewritten
        rec = self.recorder.cycle if self.recorder else None
        if rec is not None:
            c = self.config
            nz = np.flatnonzero(fraction)
            rec.update(
                t=t0, nblocks=n, size=self.size, enabled=self.hold_enabled,
                settings=dict(block_size=self.block_size, max_hold=c.max_hold,
                              interval=c.interval, rewritten_seconds=c.rewritten_seconds,
                              foreign_share=c.foreign_share, amp_resident=c.amp_resident,
                              sigma_resident=c.sigma_resident, amp_rewritten=c.amp_rewritten,
                              sigma_rewritten=c.sigma_rewritten, decay=c.decay,
                              threshold=c.threshold),
                resident=[nz.tolist(), fraction[nz].astype(float).tolist()],
                held=_runs(held_mask),
                rewritten=[now_rewritten.blocks.tolist(),
                           np.asarray(now_rewritten.values, dtype=float).tolist()],
                skip_holes=self.holder.skip_holes, probes=[])
        dt = self.config.interval if self.last_time is None else max(t0 - self.last_time, 1e-3)
        self.last_time = t0
        self._note_released(self._held_after & ~held_mask, t0)   # between ticks: budget, stop
        suppressed = held_mask | self.self_loaded
        suppressed[self.released.blocks] = True
        self.state = heat.step(self.state, fraction, suppressed, rewritten, dt, self.params)

        budget_blocks = self.config.max_hold // self.block_size
        total, rewritten_heat = self._without_holes(self.state.total, self.state.heat_rewritten,
                                                    held_mask)
        self.ceded = self.ceded.where(t0 - self.ceded.values < charges.CEDE_SECONDS)
        if self.ceded.blocks.size:                   # see _cede
            keep = np.ones(n, dtype=np.float32)
            keep[self.ceded.blocks] = 0
            total, rewritten_heat = total * keep, rewritten_heat * keep
        cand = regions.candidate_mask(total, self.params.threshold, held_mask)
        targets = (regions.select(total, rewritten_heat, self.params.threshold, budget_blocks,
                                  held_mask, recent, candidates=cand)
                   if self.hold_enabled else [])
        if rec is not None:
            rec["targets"] = _runs(targets)
        result, held_now = self._hold(targets, recent, held_mask, t0)
        self.self_loaded = heat.self_loaded(self.self_loaded, fraction, held_mask, held_now)
        # Released although still a candidate: displaced by hotter regions (not a lease
        # that ran out, which is renewed on its residency at once; see heat).
        self._note_released(held_mask & ~held_now & cand, t0)
        self._held_after = held_now
        if result.loaded_bytes:
            self.sums.baseline(np.flatnonzero(held_now & ~held_mask), self.size)
        released_between, self._released_between = self._released_between, 0
        self.cycle += 1

        bs = self.block_size
        report = CycleReport(
            cycle=self.cycle,
            cycle_seconds=self.clock() - t0,
            held_bytes=self.holder.held_bytes(),
            resident_bytes=res.resident_pages * res.page_size,
            regions=[(s * bs, min(e * bs, self.size) - s * bs) for s, e in self.holder.held_runs()],
            rewritten_blocks=int(now_rewritten.blocks.size),
            rewritten_ranges=[(s * bs, min(e * bs, self.size) - s * bs)
                              for s, e in self.red.runs()],
            mem_available_bytes=self.mem_available(),
            loaded_bytes=result.loaded_bytes,
            released_bytes=result.released_bytes + released_between,
            skipped_bytes=result.skipped_bytes,
            size_bytes=self.size,
        )
        self.last_report = report
        if rec is not None:
            rec.update(held_after=_runs(held_now), heat_sum=float(self.state.total.sum(dtype=np.float64)),
                       red=_runs(self.red.runs()))
            self.recorder.write()
        self._emit(report, fraction, held_now)
        return report

    def _hold(self, targets, recent, held_mask: np.ndarray, now: float):
        """Apply the targets, recharging held blocks over another group's cap on the way.

        Blocks already held and over a cap are dropped before ``apply``, which
        loads them again under the daemon's own charge. Blocks that ``apply``
        just locked while the guest's group pays for them (cached pages keep
        their charge) are sampled at once, and those over the cap go straight
        back out and in again, within the cycle: the group never waits a
        cycle with more of its memory pinned than its cap.
        """
        n = self.nblocks
        result = None
        before = held_mask
        for _round in range(2):
            recharge = self._recharge(recent) if self.hold_enabled else []
            if _round and not recharge:
                break
            before = before & ~runs_to_mask(recharge, n)
            step = self.holder.apply(targets)
            result = step if result is None else result.plus(step)
            self._note_lock_refusal(step.lock_refused)
            for a, b in self.holder.last_holes:
                self.holes[a:b] = True
            if self.recorder:
                self.recorder.cycle.setdefault("holes_found", []).extend(_runs(self.holder.last_holes))
            held_now = runs_to_mask(self.holder.held_runs(), n)
            self.charges.update(self.holder, before, held_now, now)
            if not step.loaded_bytes:
                break
            before = held_now
        if result.loaded_bytes and self.hold_enabled:
            held_now = self._cede(recent, held_now, now)
        return result, held_now

    def _cede(self, recent, held_now: np.ndarray, now: float) -> np.ndarray:
        """Release what is still over a cap right after its reload, and leave it alone a while.

        A guest that reads a block again between its drop and the reload
        faults it back in under its own group's charge (a page has one
        owner: whoever faults it first). Such blocks are released, not
        dropped, and kept out of the selection for ``charges.CEDE_SECONDS``:
        the guest's own cache keeps what it reads that often, charged where
        it belongs, and the daemon does not churn on it.
        """
        runs = self.charges.plan(self._quiet(recent), self.state.total,
                                 self.config.foreign_share, per_cycle=1 << 62, count=False)
        if not runs:
            return held_now
        released = self.holder.release(runs)
        self._released_between += released
        mask = runs_to_mask(runs, self.nblocks)
        blocks = np.flatnonzero(mask)
        self.ceded = self.ceded.merged(_Sparse(blocks, np.full(blocks.size, now)))
        log.info("%s: %s the guest keeps re-reading stays its own cache (charged to its "
                 "memory cgroup), not held, for %gs", self.image.path, format_size(released),
                 charges.CEDE_SECONDS)
        held_now = held_now & ~mask
        if self.recorder:
            self.recorder.cycle.setdefault("ceded", []).extend(_runs(runs))
        self.charges.update(self.holder, held_now, held_now, now)
        return held_now

    def _quiet(self, recent: np.ndarray | None) -> np.ndarray:
        """Blocks not rewritten in this cycle or the last: where a recharge disturbs least."""
        return np.ones(self.nblocks, dtype=bool) if recent is None else recent <= 0

    def _recharge(self, recent: np.ndarray | None) -> list[tuple[int, int]]:
        """Drop the held blocks over another group's cap (``charges``); ``apply`` reloads them."""
        rate = self.config.load_rate
        per_cycle = int(rate * self.config.interval) if rate else 256 << 20
        runs = self.charges.plan(self._quiet(recent), self.state.total,
                                 self.config.foreign_share, per_cycle)
        if runs:
            moved = self.holder.drop(runs)
            over = ", ".join(f"{c.group.path} (held {format_size(c.held)}, cap "
                             f"{format_size(c.cap or 0)})" for c in self.charges.last
                             if c.excess)
            log.info("%s: recharging %s held for memory cgroups over their cap: %s",
                     self.image.path, format_size(moved), over)
        return runs

    def _note_lock_refusal(self, message: str | None) -> None:
        """One line when the lock limit starts refusing, one when loads go through again."""
        if message and not self._lock_refused:
            log.warning("%s: mlock refused after %s held: %s; holding at most that until a "
                        "reload", self.image.path, format_size(self.holder.held_bytes()),
                        message)
        self._lock_refused = bool(message) or (self._lock_refused
                                               and self.holder.lock_cap is not None)

    def _note_released(self, mask: np.ndarray, now: float) -> None:
        """Remember the blocks of ``mask`` as released at ``now``; forget those past the grace."""
        let_go = np.flatnonzero(mask)
        if let_go.size:
            self.released = self.released.merged(_Sparse(let_go, np.full(let_go.size, now)))
        self.released = self.released.where(now - self.released.values < heat.RELEASED_GRACE)

    def _without_holes(self, total: np.ndarray, rewritten_heat: np.ndarray,
                       held_mask: np.ndarray):
        """The heat maps with the blocks known to be holes cut out (set to 0).

        A hole of a sparse file is never held (``holder``), so a region
        selected over holes would spend its budget on nothing. Every
        candidate block (``regions.candidate_mask``) whose state is not known
        yet is probed before the selection (``holder.data_runs``: a few
        ``lseek`` calls per candidate region, once), so the budget goes to
        data from the first cycle. Learning the holes only from what the
        holder was given instead left the budget two-thirds empty: on a
        1 TiB thin image with 1000 cached 1 MiB extents and a 256 MiB budget
        each selected region was an extent and 4 blocks of hole around it,
        and the daemon held a median 88 MiB (docs/benchmarks.md, daemon-cost).
        The holder also reports the target blocks it found to be holes.

        What is known holds while the file's allocated size (``st_blocks``)
        is unchanged. When it grows (the guest filled a hole), the known
        holes are forgotten and probed again as they become candidates;
        when it shrinks (something was punched), everything is forgotten.
        """
        stamp = self._allocation()
        if self.recorder:
            self.recorder.cycle["allocation"] = stamp
        if stamp != self.allocation:
            if stamp is None or self.allocation is None or stamp < self.allocation:
                self.probed[:] = False
            else:
                self.probed &= ~self.holes
            self.holes[:] = False
            self.allocation = stamp
        if self.holder.skip_holes and self.hold_enabled:
            self._probe_candidates(total, held_mask)
        if not self.holes.any():
            return total, rewritten_heat
        keep = ~self.holes
        return total * keep, rewritten_heat * keep

    def _probe_candidates(self, total: np.ndarray, held_mask: np.ndarray) -> None:
        """Learn data or hole for the candidate blocks not probed yet."""
        unknown = regions.candidate_mask(total, self.params.threshold, held_mask) & ~self.probed
        if not unknown.any():
            return
        for a, b in regions.mask_runs(unknown):
            data = self.holder.data_runs((a, b))
            if self.recorder:
                self.recorder.cycle["probes"].append([a, b, _runs(data)])
            self.probed[a:b] = True
            pos = a
            for s, e in data + [(b, b)]:
                self.holes[pos:s] = True
                pos = e

    def _allocation(self) -> int | None:
        try:
            st = os.fstat(self.image.fd)
        except OSError:
            return None
        return st.st_blocks if stat.S_ISREG(st.st_mode) else None

    # -- output -----------------------------------------------------------

    def status_obj(self, r: CycleReport) -> dict:
        c = self.config
        return {
            "path": self.image.path,
            "cycle": r.cycle,
            "cycle_seconds": round(r.cycle_seconds, 4),
            "size_bytes": r.size_bytes,
            "block_size": self.block_size,
            "budget_bytes": c.max_hold,
            "held_bytes": r.held_bytes,
            "resident_bytes": r.resident_bytes,
            "regions": [list(x) for x in r.regions],
            "rewritten_blocks": r.rewritten_blocks,
            "rewritten_ranges": [list(x) for x in r.rewritten_ranges],
            "mem_available_bytes": r.mem_available_bytes,
            "min_free_bytes": c.min_free,
            "loaded_bytes": r.loaded_bytes,
            "released_bytes": r.released_bytes,
            "skipped_bytes": r.skipped_bytes,
            "domain_active": self.domain_active,
            "holding": self.hold_enabled,
            "lock_cap_bytes": self.holder.lock_cap,
            "charges": self.charges.status(),
            "output_errors": self.outputs.errors,
            "time": time.time(),
        }

    def _emit(self, r: CycleReport, fraction: np.ndarray, held: np.ndarray) -> None:
        c = self.config
        if c.status:
            text = json.dumps(self.status_obj(r), indent=2) + "\n"
            self.outputs.write("status", c.status, text.encode())
        if c.heat_png or c.map_png:
            from vmdisktouch.adapters import render  # PIL only when PNGs are asked for
            layout = render.Layout.fit(self.nblocks, blocks_per_pixel=c.blocks_per_pixel,
                                       width=c.width, aspect=c.aspect, scale=c.scale)
            if c.map_png:
                red = np.zeros(self.nblocks, dtype=bool)
                red[self.red.blocks] = True
                image = render.block_map_image(fraction, held, red, layout)
                self.outputs.write("map_png", c.map_png, render.png_bytes(image))
            if c.heat_png:
                image = render.heat_image(self.state.total, layout)
                self.outputs.write("heat_png", c.heat_png, render.png_bytes(image))
        log.info("cycle %d: held %s/%s in %d regions, resident %s, rewritten %d blocks, "
                 "loaded %s, released %s, MemAvailable %s, %.3fs",
                 r.cycle, format_size(r.held_bytes), format_size(c.max_hold), len(r.regions),
                 format_size(r.resident_bytes), r.rewritten_blocks, format_size(r.loaded_bytes),
                 format_size(r.released_bytes), format_size(r.mem_available_bytes),
                 r.cycle_seconds)

    def close(self) -> None:
        if self.recorder:
            self.recorder.close()
        self.holder.release_all()
        self.holder.close()
        self.sums.close()
        if self.charges.reader is not None:
            self.charges.reader.close()
