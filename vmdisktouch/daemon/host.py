"""The one cycle driver: 1..N disk images, one budget, every cycle driven here.

Theory of operation
-------------------
Each disk keeps its own heat, access source, holder and recharger (a
``DiskWatcher``, which observes and acts for its disk and runs no cycle of
its own); the selection is shared. A single disk is a host of one. Each
cycle ``Host.tick``:

1. asks every disk to observe and decide up to the selection
   (``DiskWatcher.prepare``: its ``regions.DiskMap``, its candidate regions
   with the heat that ranks them; heat is in the same units on every disk);
2. selects over all of them at once (``policy.select``): the regions
   of every disk in one priority queue, taken until the host's budget is
   full, so memory goes where the heat is, whichever disk it is on, each
   disk within its own cap (its ``max_hold``) when it has one. When every
   disk has a miss-ratio curve with reads in it (the trace source), each
   disk's cap is first its share of the budget by what memory saves it
   (``core.shares``): the curves decide how much, the heat which blocks;
3. hands each disk its share (``DiskWatcher.act``), the disks that hold
   less than before first, so that their releases come before the others'
   loads and the sum held never exceeds the budget, even within a cycle.

A disk whose image is gone (deleted, replaced) is released, closed and
reported in ``failed`` at once; any other failure (unreadable, truncated
under a read) is logged, and the disk dropped at the ``ERROR_THRESHOLD``-th
in a row, in a warning with the journal's ``DISK_DROPPED`` id. The others go on.
The cycle fails only when no disk is left (``NoDiskLeft``, with the exit
status of the last failure: 75 when the image went, so systemd restarts the
daemon on whatever the path names then).

Whatever is done for one disk (its turn of a cycle, a drain, a reload, its
close) runs in its log context (``about``: ``journal.disk_context``), so
every line logged meanwhile, at any layer, carries its ``DISK``, ``DOMAIN``
and ``TARGET`` in the journal. After each cycle the host's events an operator
alerts on (budget full, shedding under the floor) are noted (``alerts``).

With ``VMDISKTOUCH_RECORD=FILE`` the host's one recorder (``record``) writes
each cycle: every disk's observation and plan, the budget and the selection.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace

import numpy as np

from vmdisktouch.adapters.systemd import journal
from vmdisktouch.core import regions
from vmdisktouch.core.policy import select
from vmdisktouch.core.shares import Splitter
from vmdisktouch.daemon.alerts import HostAlerts
from vmdisktouch.daemon.reasons import Allotment, disk_name
from vmdisktouch.daemon.record import Recorder
from vmdisktouch.errors import ImageGoneError, VmdtError
from vmdisktouch.report import DiskLine, HostReport
from vmdisktouch.sizes import format_size
from vmdisktouch.system.hold.ledger import Ledger

log = logging.getLogger("vmdisktouch")


# After this many failed cycles in a row a disk is dropped (an image gone: at once).
ERROR_THRESHOLD = 10


class NoDiskLeft(ImageGoneError):
    """Every disk of the host failed; the exit status is the last failure's."""

    def __init__(self, message: str, exit_code: int = ImageGoneError.exit_code):
        super().__init__(message)
        self.exit_code = exit_code


class Host:
    """The disks served together under one budget: ``ledger`` (a ``Ledger``, or its bytes),
    which every disk's holder draws from once the host has it (``adopt``)."""

    def __init__(self, watchers: list, ledger: Ledger | int, block_size: int,
                 caps: dict[str, int] | None = None, close=None, may_be_empty=False,
                 spill_factor: float = 0.0, recorder=None):
        self.watchers = list(watchers)
        self.recorder = recorder              # ``record.Recorder``: one file for every disk
        self.weights: dict[str, float] = {}     # image path -> ranking weight (overrides)
        self.may_be_empty = may_be_empty          # following libvirt: no VM running is fine
        self.close_disk = close or _close_watcher   # releases, closes (and saves) a disk
        self.ledger = ledger if isinstance(ledger, Ledger) else Ledger(ledger)
        for w in self.watchers:
            self.ledger.adopt(w.holder)
            w.recorder = recorder
        self.spill_factor = float(spill_factor)   # ``spill``: x the budget, unlocked
        self.block_size = int(block_size)
        self.caps = dict(caps or {})         # image path -> most bytes it may hold
        self.failed: dict[str, str] = {}     # image path -> why it was dropped
        self.failures: dict[int, int] = {}   # id(watcher) -> failed cycles in a row
        self._last_error: BaseException | None = None
        self.cycle = 0
        self.cycle_seconds = 0.0      # the last tick, every disk's turn and the selection
        self.alerts = HostAlerts()
        self.splitter = Splitter()            # the budget split by the curves
        self.by_curve: set[int] = set()       # id(w) of the disks capped by the curves now
        self.demands: dict = {}               # path -> its ``Demand`` this cycle (or None)

    @property
    def budget(self) -> int:
        """The host's budget, bytes: the ledger's one number."""
        return self.ledger.budget

    def set_budget(self, budget: int) -> int:
        """A new budget (a reload), the excess released at once. Returns bytes released."""
        return self.ledger.set_budget(budget)

    def tick(self) -> list:
        """One cycle over every disk; returns their ``CycleReport``s."""
        started = time.perf_counter()
        maps, ready = [], []
        for w in list(self.watchers):
            with about(w):
                try:
                    m = w.prepare()
                except (VmdtError, OSError) as exc:
                    self._failed(w, exc)
                    continue
            ready.append(w)
            if m is not None:
                maps.append((w, self._weighed(w.image.path, m)))
        budget_blocks = self.budget // self.block_size
        maps = self._by_curves(maps, budget_blocks)
        alloc, spilled = select([m for _, m in maps], budget_blocks,
                                self.spill_factor, [w.spilled for w, _ in maps])
        targets = {id(w): runs for (w, _), runs in zip(maps, alloc.runs)}
        spills = {id(w): runs for (w, _), runs in zip(maps, spilled)}
        self._allot(ready, maps, alloc)
        bs = self.block_size

        def growth(w) -> int:
            return sum(b - a for a, b in targets.get(id(w), [])) * bs - w.holder.held_bytes()

        acted = []                                   # (disk, its report)
        for w in sorted(ready, key=growth):          # who shrinks first
            with about(w):
                try:
                    acted.append((w, w.act(targets.get(id(w), []), spills.get(id(w), ()))))
                except (VmdtError, OSError) as exc:
                    self._failed(w, exc)
                else:
                    self.failures.pop(id(w), None)
        if self.recorder is not None:
            self._record(ready, maps, alloc, budget_blocks)
        self.alerts.note(self.watchers, acted, self.budget, self.block_size)
        if not self.watchers and not self.may_be_empty:
            self._no_disk_left()
        self.cycle += 1
        self.cycle_seconds = time.perf_counter() - started
        return [r for _, r in acted]

    def _by_curves(self, maps: list, budget_blocks: int) -> list:
        """Each disk's cap cut to its share by the curves (``core.shares.Splitter``)."""
        demands = [w.demand(m, self.weights.get(w.image.path, 1.0)) for w, m in maps]
        self.demands = {w.image.path: d for (w, _), d in zip(maps, demands)}
        out, cut = self.splitter.caps([w.image.path for w, _ in maps], [m for _, m in maps],
                                      demands, budget_blocks, self.block_size)
        self.by_curve = {id(w) for (w, _), c in zip(maps, cut) if c}
        return [(w, m) for (w, _), m in zip(maps, out)]

    def _weighed(self, path: str, m: regions.DiskMap) -> regions.DiskMap:
        """This disk's map with its cap and weight (``overrides``), if it has them."""
        return weighed(m, self._cap_blocks(path), self.weights.get(path, 1.0))

    def _cap_blocks(self, path: str) -> int | None:
        cap = self.caps.get(path)
        return None if cap is None else cap // self.block_size

    def _record(self, ready: list, maps: list, alloc, budget_blocks: int) -> None:
        """The cycle's line of the record: every disk's part, the budget, the selection."""
        selected = {w.image.path: (alloc.runs[d], alloc.share[d], alloc.wanted[d],
                                   alloc.limit[d]) for d, (w, _) in enumerate(maps)}
        self.recorder.write(self.cycle, budget_blocks,
                            [(w.image.path, self._cap_blocks(w.image.path),
                              self.weights.get(w.image.path, 1.0)) for w in ready], selected,
                            self.demands, budget_blocks * self.block_size, self.block_size,
                            {w.image.path: self._advice_inputs(w) for w in ready})

    def _advice_inputs(self, w) -> dict | None:
        """What the budget's advice reads of disk ``w`` this cycle (the record's ``advice``:
        a replay of the verdicts, tests/unit/test_verdict_steady.py)."""
        a = w.allotment
        if a is None:
            return None
        gain = getattr(w.source, "gain", None) or {}
        return {"share": a.share, "wanted": a.wanted, "curve_wants": a.curve_wants,
                "wants_bytes": gain.get("wants_bytes"), "held": w.holder.held_bytes(),
                "size": w.image.size, "evidence": w.curve_evidence()}

    def _allot(self, ready: list, maps: list, alloc) -> None:
        """Tell each disk its share of the budget and what limited it (``Allotment``)."""
        bs, named = self.block_size, [w for w, _ in maps]
        for w in ready:
            w.allotment = Allotment(0, 0, None, None, self.budget)
        for d, w in enumerate(named):
            top = alloc.top[d]
            limit = alloc.limit[d]
            if limit == "budget" and self.weights.get(w.image.path, 1.0) < 1.0:
                limit = "weight"
            if limit == "cap" and id(w) in self.by_curve:
                limit = "curve"
            wanted = alloc.wanted[d] * bs
            wants = w.curve_wants(wanted)
            w.allotment = Allotment(alloc.share[d] * bs,
                                    wanted if wants is None else min(wanted, wants), limit,
                                    None if top is None else disk_name(named[top]),
                                    self.budget, self.caps.get(w.image.path),
                                    self.weights.get(w.image.path, 1.0), wants)

    def held_bytes(self) -> int:
        return self.ledger.held()

    def add(self, w) -> None:
        """Serve one more disk from the next cycle on; its holder draws from the host's budget."""
        self.ledger.adopt(w.holder)
        w.recorder = self.recorder
        self.watchers.append(w)
        self.failed.pop(w.image.path, None)

    def set_override(self, path: str, weight: float = 1.0, cap: int | None = None) -> None:
        self.weights[path] = weight
        if cap is None:
            self.caps.pop(path, None)
        else:
            self.caps[path] = cap

    def each(self, fn) -> list:
        """``fn(w)`` for every disk, each in its log context (``about``)."""
        out = []
        for w in list(self.watchers):
            with about(w):
                out.append(fn(w))
        return out

    def remove(self, path: str, why: str) -> None:
        """Stop serving ``path`` (its domain stopped, its disk was unplugged): released now."""
        for w in list(self.watchers):
            if w.image.path == path:
                with about(w):
                    held = w.holder.held_bytes()
                    self.watchers.remove(w)
                    self._close(w)
                    log.info("%s: %s; released %s", path, why, format_size(held))

    def _failed(self, w, exc: BaseException) -> None:
        """A cycle of ``w`` failed: counted, and ``w`` dropped when its image is gone or at
        the ``ERROR_THRESHOLD``-th failure in a row."""
        n = self.failures.get(id(w), 0) + 1
        if isinstance(exc, ImageGoneError) or n >= ERROR_THRESHOLD:
            self.failures.pop(id(w), None)
            self._drop(w, exc)
            return
        self.failures[id(w)] = n
        log.error("%scycle failed (%d/%d): %s", w.emitter.cycles.label, n, ERROR_THRESHOLD,
                  str(exc) or exc.__class__.__name__)

    def _no_disk_left(self) -> None:
        exc = self._last_error
        code = getattr(exc, "exit_code", ImageGoneError.exit_code)
        if len(self.failed) == 1:        # one disk: its own failure is the message
            raise NoDiskLeft(next(iter(self.failed.values())), code)
        raise NoDiskLeft("no disk left to serve: " + "; ".join(
            f"{p}: {why}" for p, why in self.failed.items()), code)

    def _drop(self, w, exc: BaseException) -> None:
        """No longer serve ``w``: a warning, the journal's ``DISK_DROPPED`` (the daemon goes
        on, or says why it cannot in its last line)."""
        self._last_error = exc
        why = str(exc) or exc.__class__.__name__
        log.warning("%s: dropped%s: %s", w.image.path,
                    ", the other disks go on" if len(self.watchers) > 1 else "", why,
                    extra=journal.fields(message_id=journal.DISK_DROPPED))
        self.failed[w.image.path] = why
        self.watchers.remove(w)
        self._close(w)

    def _close(self, w) -> None:
        with about(w):
            try:
                self.close_disk(w)
            except (VmdtError, OSError) as err:
                log.warning("%s: releasing it failed: %s", w.image.path, err)

    def report(self, interval: float, min_free: int,
               skipped: list[dict] | None = None) -> HostReport:
        """The cycle's one report: the budget, the sum held, each disk's report, share and
        why it holds less than it wants, the failures; ``skipped``: the disks libvirt has
        that are not served, and why (docs/status.md)."""
        from vmdisktouch.daemon.emit import process_fields
        avail, above = self.memory(min_free)
        return HostReport(
            **process_fields(interval), time=time.time(), budget_bytes=self.budget,
            held_bytes=self.held_bytes(), mem_available_bytes=avail, min_free_bytes=min_free,
            above_floor_bytes=above, cycle=self.cycle,
            cycle_seconds=round(self.cycle_seconds, 4),
            disks=[w.last_disk for w in self.watchers if w.last_disk is not None],
            lines=[self._disk_line(w) for w in self.watchers],
            failed=[{"path": p, "error": why} for p, why in self.failed.items()],
            skipped=skipped,
            budget_advice=None if self.alerts.verdict is None else self.alerts.verdict.to_json())

    def memory(self, min_free: int) -> tuple[int | None, int | None]:
        """(MemAvailable, the part above the floor ``min_free``) as the last cycle saw it;
        Nones before any disk reported."""
        avail = next((w.last_disk.mem_available_bytes for w in self.watchers
                      if w.last_disk is not None), None)
        return avail, None if avail is None else max(0, avail - min_free)

    def _disk_line(self, w) -> DiskLine:
        a, d = w.allotment, w.last_disk
        v = self.alerts.verdicts.get(w.image.path)
        return DiskLine(w.image.path, w.domain, w.target, w.holder.held_bytes(),
                        None if a is None else a.share, None if a is None else a.wanted,
                        None if d is None else d.limited_by,
                        None if d is None else d.not_held_reason,
                        round(float(w.policy.state.total.sum(dtype=float)), 3),
                        self.caps.get(w.image.path), self.weights.get(w.image.path, 1.0),
                        None if v is None else v.to_json())

    def close(self) -> None:
        try:
            while self.watchers:
                self._close(self.watchers.pop())
        finally:
            if self.recorder is not None:
                self.recorder.close()
                self.recorder = None


def weighed(m: regions.DiskMap, cap_blocks: int | None, weight: float) -> regions.DiskMap:
    """Map ``m`` with a cap (blocks; None: none) and a ranking weight (1: none), as the
    host's selection takes it (also the replay of a recorded host, tests/replay.py)."""
    if cap_blocks is None and weight == 1.0:
        return m
    boost = m.boost
    if weight != 1.0:
        boost = (np.full(m.total_heat.size, weight, dtype=np.float32) if boost is None
                 else boost * np.float32(weight))
    return replace(m, boost=boost, cap_blocks=cap_blocks)


def about(w):
    """The log context of disk ``w``: its path, and its domain and target when libvirt
    knows them (``journal.disk_context``)."""
    return journal.disk_context(w.image.path, w.domain, w.target)


def _close_watcher(w) -> None:
    try:
        w.close()
    finally:
        w.image.close()




def host_of(w) -> Host:
    """A host of one disk: ``w``'s cycle driver, with its own settings (tests, profiles)."""
    return Host([w], w.config.max_hold, w.block_size, spill_factor=w.config.spill,
                recorder=Recorder.from_env())
