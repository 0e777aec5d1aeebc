"""Read shift: wake the cycle early when the guest's reads leave what is held (trace source).

Theory of operation
-------------------
Pure core (numpy only). The trace source is drained between cycles (about
once a second, ``run.PUMP_SECONDS``). Each drain, this counts the guest's
read events that fell in blocks the daemon holds and those outside them.

In steady state the share outside is the guest's background (the hot-zone
guest: 10 % of its reads), or, when its hot set is larger than the budget,
high but steady. When the guest moves its hot zones, the share outside
jumps (0.1 to 0.9), and the policy's ranking follows within seconds (the
read rate of ``core.intensity`` passes the held zones' about 3 s after the
move); but the next cycle may be up to an interval (5 s) away. So a drain
whose share outside is at least ``WAKE_SHARE`` and at least ``WAKE_RATIO``
times the *baseline* asks for a cycle now (docs/rationale.md#wake-share,
docs/rationale.md#wake-ratio). The baseline is the lowest share outside over
the last ``BASELINE_CYCLES`` cycles that ran on schedule: a scheduled cycle
whose window held the move (a share of 0.5) must not raise the bar to 1.0
and keep the next drains from asking (docs/rationale.md#baseline-cycles).

A cold disk (no scheduled cycle has seen ``MIN_READS`` reads yet: a daemon
just started, a disk just opened) has no baseline: its first drain of
``MIN_READS`` reads, half of them outside what is held, starts a cycle, so
the first evidence is acted on within a drain, not an interval: a cold hot
zone is held in seconds (docs/rationale.md#min-reads).

Bounds:

* a drain of fewer than ``MIN_READS`` read events never wakes (a guest
  reading little has nothing to gain from a cycle sooner);
* at most ``MAX_EARLY`` early cycles in a row: a shift the policy does not
  follow (the new reads are too few to win) costs that many extra cycles
  per scheduled cycle, until ``BASELINE_CYCLES`` scheduled cycles have seen
  the new share and it is the baseline; more early cycles did not follow a
  move sooner (docs/rationale.md#max-early);
* the held blocks are those after the last cycle's loads (``settled``), so
  once the daemon holds the new zones their reads count as inside.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from vmdisktouch.core.rules import BASELINE_CYCLES, MAX_EARLY, MIN_READS, WAKE_RATIO, WAKE_SHARE


class ReadShift:
    """Counts of read events in and outside the held blocks, per drain and per cycle."""

    def __init__(self):
        self.held = np.zeros(0, dtype=bool)
        self._recent: deque = deque(maxlen=BASELINE_CYCLES)   # shares, scheduled cycles
        self.early = 0                           # early cycles in a row
        self.woke = False                        # the coming cycle was asked for early
        self._drain = (0, 0)                     # (outside, total) of the last drain
        self._cycle = [0, 0]                     # (outside, total) since the last cycle

    def count(self, blocks: np.ndarray, counts: np.ndarray) -> None:
        """One drain's read events per block (``AccessLog.feed``)."""
        blocks = np.asarray(blocks, dtype=np.int64)
        counts = np.asarray(counts, dtype=np.int64)
        total = int(counts.sum())
        inside = blocks < self.held.size
        inside[inside] = self.held[blocks[inside]]
        outside = total - int(counts[inside].sum())
        self._drain = (outside, total)
        self._cycle[0] += outside
        self._cycle[1] += total

    @property
    def cold(self) -> bool:
        """No scheduled cycle has seen ``MIN_READS`` reads yet: no baseline."""
        return not self._recent

    @property
    def baseline(self) -> float | None:
        """The lowest share outside of the last scheduled cycles (None: none yet)."""
        return min(self._recent) if self._recent else None

    def wanted(self) -> bool:
        """Whether the last drain asks for a cycle now (and notes that it did)."""
        outside, total = self._drain
        if self.woke or self.early >= MAX_EARLY or total < MIN_READS:
            return self.woke
        share = outside / total
        base = self.baseline if self.baseline is not None else 0.0   # cold: no baseline
        self.woke = share >= WAKE_SHARE and share >= WAKE_RATIO * base
        return self.woke

    def settled(self, held: np.ndarray) -> None:
        """A cycle ended holding ``held`` (per block): start counting the next one."""
        outside, total = self._cycle
        if self.woke:
            self.early += 1
        else:
            self.early = 0
            if total >= MIN_READS:
                self._recent.append(outside / total)
        self.woke = False
        self.held = np.asarray(held, dtype=bool).copy()
        self._cycle = [0, 0]
        self._drain = (0, 0)
