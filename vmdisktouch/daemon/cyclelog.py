"""The daemon's log of its cycles: a line when something changed, a summary every few minutes.

A cycle is logged at INFO when it is the first, when it loaded and released
together at least a sixteenth (``MATERIAL``) of what the disk holds or may
hold, when what it targeted and skipped changed (memory pressure, a lock
refused), or when the reason it holds less than it wants changed (its code,
``reasons``). Any other cycle is logged at DEBUG (``--debug``): a guest
that writes all the time, a spill that tops up, an edge that moves by a
block, or a VM that is off no longer write a line every cycle (four
disks of a host wrote 287 lines in 16 minutes). Every ``SUMMARY_SECONDS`` one INFO
line sums up the cycles since the last one: a steady host writes only these.

The line says how much of what was loaded came from the disk and how much
was already in the page cache (only locked), and, when less than the budget
is held than the disk wants, why (``reasons``).
"""

from __future__ import annotations

import logging
import statistics

from vmdisktouch.sizes import counted, format_size

log = logging.getLogger("vmdisktouch")

SUMMARY_SECONDS = 300.0
MATERIAL = 16         # a cycle that loads and releases 1/16 of what the disk holds is news


class CycleLog:
    """Decides the level of each cycle's line and writes the periodic summary."""

    def __init__(self, label: str = ""):
        self.label = f"{label}: " if label else ""
        self._first = True
        self._last_code: str | None = None      # the reason's code (``reasons``)
        self._last_skipped = 0                  # the same skip again is no news (a limit)
        self._since: float | None = None        # start of the summary period (cycle time)
        self._period: list = []                 # the period's reports

    def changed(self, r, why: str | None) -> bool:
        """The cycle is news: the first, a move of at least ``1 / MATERIAL`` of what the disk
        holds or may hold, a new skip, or another reason (its code: a text that names
        MemAvailable changes every cycle)."""
        moved = r.loaded_bytes + r.released_bytes
        out = (self._first or moved * MATERIAL >= max(r.held_bytes, r.share_bytes, 1)
               or r.skipped_bytes != self._last_skipped
               or r.limited_by != self._last_code)
        self._first = False
        self._last_code = r.limited_by
        self._last_skipped = r.skipped_bytes
        return out

    def log(self, r, c, why: str | None, now: float) -> None:
        level = logging.INFO if self.changed(r, why) else logging.DEBUG
        loaded = format_size(r.loaded_bytes)
        if r.loaded_bytes:
            loaded += (f" ({format_size(r.loaded_bytes - r.relocked_bytes)} from disk, "
                       f"{format_size(r.relocked_bytes)} relocked)")
        if r.spill_read_bytes:
            loaded += f", spilled {format_size(r.spill_read_bytes)} unlocked"
        log.log(level, "%scycle %d: held %s/%s in %s, resident %s, rewritten %s, "
                "loaded %s, released %s, MemAvailable %s, %.3fs%s",
                self.label, r.cycle, format_size(r.held_bytes), format_size(r.share_bytes),
                counted(len(r.regions), "region"), format_size(r.resident_bytes),
                counted(r.rewritten_blocks, "block"), loaded,
                format_size(r.released_bytes), format_size(r.mem_available_bytes),
                r.cycle_seconds, f"; not holding more: {why}" if why else "")
        self._summary(r, c, now)

    def _summary(self, r, c, now: float) -> None:
        if self._since is None:
            self._since = now
        self._period.append(r)
        if now - self._since < SUMMARY_SECONDS:
            return
        p, self._period, minutes = self._period, [], (now - self._since) / 60
        self._since = now
        secs = [x.cycle_seconds for x in p]
        log.info("%slast %.0f min: %s (median %.3fs, max %.3fs), loaded %s, released "
                 "%s, rewritten %s; now held %s/%s in %s",
                 self.label, minutes, counted(len(p), "cycle"), statistics.median(secs),
                 max(secs), format_size(sum(x.loaded_bytes for x in p)),
                 format_size(sum(x.released_bytes for x in p)),
                 counted(sum(x.rewritten_blocks for x in p), "block"), format_size(r.held_bytes),
                 format_size(r.share_bytes), counted(len(r.regions), "region"))
