"""Emit: a disk's cycle as its report (``report.DiskReport``), its two PNGs and its log line.

The status file is the host's, written once per cycle from the one report
(``daemon.service``); ``status_bytes`` is its text.

Every file goes through ``adapters.outputs`` (checked paths, atomic
replacement, a failed write logged and counted, never fatal). PIL is
imported only when a PNG is asked for.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import time
from dataclasses import dataclass

import numpy as np

from vmdisktouch.daemon.cyclelog import CycleLog
from vmdisktouch.report import DiskReport

log = logging.getLogger("vmdisktouch")


@dataclass
class CycleReport:
    cycle: int
    cycle_seconds: float
    held_bytes: int
    resident_bytes: int
    regions: list[tuple[int, int]]          # byte ranges held
    rewritten_blocks: int
    rewritten_ranges: list[list[int]]        # [offset, length] byte pairs shown red
    mem_available_bytes: int
    loaded_bytes: int
    released_bytes: int
    skipped_bytes: int
    size_bytes: int
    relocked_bytes: int = 0                  # of loaded_bytes: already cached, only locked
    not_held_reason: str | None = None       # why less than it wants is held (``reasons``)
    limited_by: str | None = None            # that reason's code (``report.CODES``)
    share_bytes: int = 0                     # its share of the budget (``reasons.Allotment``)
    spill_read_bytes: int = 0                # read by the spill in this cycle (unlocked)
    shed_bytes: int = 0                      # of released_bytes: under the floor (``alerts``)


def process_fields(interval: float) -> dict:
    """What ``vmdisktouch status`` needs to tell a live status file from a stale one."""
    from vmdisktouch import __version__
    return {"pid": os.getpid(), "version": __version__, "interval_seconds": interval}


def _ratio(v) -> float | None:
    """A gain for the status file: rounded, None unless a finite positive number."""
    return round(float(v), 3) if isinstance(v, (int, float)) and math.isfinite(v) and v > 0 \
        else None


def status_bytes(status: dict) -> bytes:
    """The status file's text: one line of compact JSON, because ``json`` encodes it in C
    only without ``indent`` (docs/benchmarks.md, why-status). ``python3 -m json.tool FILE``
    or ``vmdisktouch status`` shows it to a human. A number that is not finite is written
    as null (``finite``): NaN and Infinity are not JSON, and ``vmdisktouch status`` refuses
    a file that holds them, hiding a live daemon."""
    try:
        text = json.dumps(status, separators=(",", ":"), allow_nan=False)
    except ValueError:
        text = json.dumps(finite(status), separators=(",", ":"), allow_nan=False)
    return (text + "\n").encode()


def finite(obj):
    """``obj`` with every float that is not finite replaced by None."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


class Emitter:
    """Writes what the configuration asks for, each cycle."""

    def __init__(self, outputs, label: str = ""):
        self.outputs = outputs
        self.cycles = CycleLog(label)

    def disk_report(self, r: CycleReport, c, *, path: str, domain, allotment, domain_active,
                    holding: bool, lock_cap, charges, source: dict,
                    warmed_from: str | None = None,
                    adopted_since: float | None = None,
                    adopted_gain: tuple = (None, None)) -> DiskReport:
        """The report of cycle ``r`` under settings ``c``; ``domain``: (domain, target) or
        Nones; ``allotment``: the last selection's (``reasons.Allotment``); ``source``: the
        access source's figures (``access_source``, ``events_lost``, ``trace``, ``spill``,
        ``thrashing_ranges``)."""
        return DiskReport(
            path=path, domain=domain[0], target=domain[1], **process_fields(c.interval),
            cycle=r.cycle, cycle_seconds=round(r.cycle_seconds, 4), size_bytes=r.size_bytes,
            block_size=c.block_size,
            budget_bytes=r.share_bytes,               # this disk's share of the budget
            host_budget_bytes=c.max_hold if allotment is None else allotment.budget,
            wanted_bytes=None if allotment is None else allotment.wanted,
            held_bytes=r.held_bytes, resident_bytes=r.resident_bytes, regions=r.regions,
            rewritten_blocks=r.rewritten_blocks, rewritten_ranges=r.rewritten_ranges,
            mem_available_bytes=r.mem_available_bytes, min_free_bytes=c.min_free,
            loaded_bytes=r.loaded_bytes,
            loaded_from_disk_bytes=r.loaded_bytes - r.relocked_bytes,
            released_bytes=r.released_bytes, skipped_bytes=r.skipped_bytes,
            not_held_reason=r.not_held_reason, limited_by=r.limited_by,
            domain_active=domain_active,
            warmed_from=warmed_from,                  # "state", "metadata" or None (cold)
            holding=holding, lock_cap_bytes=lock_cap, charges=charges,
            output_errors=self.outputs.errors, time=time.time(),
            adopted_since=adopted_since,
            adopted_gain=_ratio(adopted_gain[0]) if adopted_since else None,
            advised_gain=_ratio(adopted_gain[1]) if adopted_since else None, **source)

    def _pictures(self, r: CycleReport, c, report: DiskReport, resident: np.ndarray,
                  held: np.ndarray, policy, holes: np.ndarray | None) -> None:
        from vmdisktouch.adapters.pictures import figure, render  # PIL only when PNGs are asked for
        n = held.size
        layout = render.Layout.fit(n, blocks_per_pixel=c.blocks_per_pixel,
                                   width=c.width, aspect=c.aspect)
        layout = dataclasses.replace(layout, scale=figure.fit_scale(layout.width, c.scale))

        def header(what: str) -> list[str]:
            return figure.header_lines(
                report.title, report.time, held=r.held_bytes, budget=r.share_bytes,
                resident=r.resident_bytes, size=r.size_bytes, cycle=r.cycle,
                blocks_per_pixel=layout.blocks_per_pixel, block_size=c.block_size, what=what)

        if c.map_png:
            red = np.zeros(n, dtype=bool)
            red[policy.red.blocks] = True
            thrash = None
            thrashing = policy.thrashing()
            if thrashing.size:
                thrash = np.zeros(n, dtype=bool)
                thrash[thrashing] = True
            if holes is not None:
                holes = holes[:n] if holes.size >= n else None
            grid = render.block_map_image(resident, held, red, layout, thrash, holes)
            fig = figure.compose(grid, layout, c.block_size, header("block map"))
            self.outputs.write("map_png", c.map_png, render.png_bytes(fig.image))
        if c.heat_png:
            vmax = c.amp_resident + c.amp_rewritten
            grid = render.heat_image(policy.state.total, layout, vmax=vmax, held_mask=held,
                                     vmin=c.threshold / 10 if c.threshold > 0 else None)
            fig = figure.compose(grid, layout, c.block_size, header("heat map"),
                                 colorbar=(vmax, c.threshold))
            self.outputs.write("heat_png", c.heat_png, render.png_bytes(fig.image))

    def emit(self, r: CycleReport, c, report: DiskReport, resident: np.ndarray,
             held: np.ndarray, policy, holes: np.ndarray | None = None) -> None:
        """Write the PNGs settings ``c`` ask for; log the cycle's line. ``holes``: per block,
        for the block map (None: not known)."""
        if c.heat_png or c.map_png:
            self._pictures(r, c, report, resident, held, policy, holes)
        self.cycles.log(r, c, r.not_held_reason, time.monotonic())
