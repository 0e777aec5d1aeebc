"""The holder's two guards on a load: the pace of its disk reads and the memory floor.

``Pacer`` spaces the starts of the chunks a load reads from disk by
``bytes / rate``, on an injected clock, and waits through an injected
``sleep`` (the daemon's stop event: True from it stops the load).
``MemGauge`` reads ``MemAvailable`` at most once per chunk's worth of bytes
locked and subtracts what was locked in between (reading
``/proc/meminfo`` for each single-block region cost system time in every
renewal cycle: docs/benchmarks.md, why-holder).
"""

from __future__ import annotations

from typing import Callable


class MemGauge:
    """``MemAvailable`` read at most once per ``every`` bytes locked; locks in between subtracted."""

    def __init__(self, read: Callable[[], int], every: int):
        self.read = read
        self.every = every
        self.value: int | None = None
        self.since = 0

    def get(self) -> int:
        if self.value is None or self.since >= self.every:
            self.value, self.since = self.read(), 0
        return self.value - self.since

    def took(self, nbytes: int) -> None:
        self.since += nbytes


class Pacer:
    """Spaces chunk starts by ``bytes / rate`` on ``clock``; ``wait`` is False once stopping."""

    def __init__(self, rate: int, sleep: Callable[[float], object], clock: Callable[[], float]):
        self.rate = rate
        self.sleep = sleep
        self.clock = clock
        self.next_start: float | None = None
        self.stopped = False

    def wait(self) -> bool:
        if self.stopped:
            return False
        if self.rate > 0 and self.next_start is not None:
            delay = self.next_start - self.clock()
            if delay > 0 and self.sleep(delay) is True:
                self.stopped = True
                return False
        return True

    def start(self, nbytes: int) -> None:
        if self.rate > 0:
            self.next_start = self.clock() + nbytes / self.rate
