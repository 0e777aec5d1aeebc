"""Never slower: whether an adopted disk's guest waits longer for its I/O than before.

Theory of operation
-------------------
QEMU times every request of a disk's device from the guest's submission to its
completion, hit or miss, read, write or flush: its block accounting (libvirt's block
statistics ``rd_total_times``, ``wr_total_times``, ``flush_total_times`` and their
counts; QMP ``query-blockstats``' ``rd_total_time_ns`` and the rest, for a QEMU libvirt
does not run). That is the guest's own wait, the figure adopting
must not make worse. The tracepoints see the host's side only: once adopted, a read the
page cache serves and a write it takes reach neither the device nor the direct-I/O
tracepoints, and a flush reaches none of them.

Before the switch the counters are read ``BASELINE_WINDOWS + 1`` times, ``WINDOW_S``
apart: the baseline, ``BASELINE_WINDOWS`` windows with O_DIRECT. After it they are
read every ``WINDOW_S`` (the host service): windows of the same length. A window's
figure is the mean time of one I/O at the baseline's mix: each kind's mean (read,
write, flush) weighted by its share of the baseline's I/Os, so that a guest that reads
more after the switch is compared read for read. A kind with fewer than
``MIN_KIND_OPS`` in either window is left out of both.

The noise is the baseline's own: the largest departure of one of its windows from the
pooled baseline, relative. A window is slower when its figure exceeds the baseline's
by more than ``MARGIN`` plus that noise. The first ``SETTLE_WINDOWS`` after the switch
are not judged: adopting left the image's pages out of the cache, and the daemon holds
its hot zone only after its first cycles. ``SLOW_WINDOWS`` slower windows in a row
release the disk: a disk slower from the start goes within
``(SETTLE_WINDOWS + SLOW_WINDOWS) * WINDOW_S`` of the switch. A window with fewer than
``MIN_OPS`` I/Os is not judged and breaks no run (a guest that waits little cannot be
made to wait long).

The gain measured since the switch is the pooled baseline's figure over the pooled
figure of the judged windows since: the ratio ``advise`` forecasts (the mean time of an
I/O now over then).
"""

from __future__ import annotations

from dataclasses import dataclass

from vmdisktouch.core.rules import (ADOPT_BASELINE_WINDOWS, ADOPT_MARGIN, ADOPT_MIN_OPS,
                                    ADOPT_SETTLE_WINDOWS, ADOPT_SLOW_WINDOWS, ADOPT_WINDOW_S)

WINDOW_S = ADOPT_WINDOW_S
BASELINE_WINDOWS = ADOPT_BASELINE_WINDOWS
SETTLE_WINDOWS = ADOPT_SETTLE_WINDOWS
SLOW_WINDOWS = ADOPT_SLOW_WINDOWS
MARGIN = ADOPT_MARGIN
MIN_OPS = ADOPT_MIN_OPS
MIN_KIND_OPS = 10        # I/Os of a kind (read, write, flush) for its mean to count
KINDS = ("read", "write", "flush")


@dataclass(frozen=True)
class Counters:
    """QEMU's block accounting of one disk at a moment: I/Os and their total time (ns)
    per kind, cumulative since the domain started."""
    when: float
    ops: tuple[int, int, int]
    ns: tuple[int, int, int]

    @classmethod
    def from_libvirt(cls, stats: dict, when: float) -> "Counters":
        """From ``virDomainBlockStatsFlags``' fields (a missing one counts 0)."""
        def get(key):
            return max(0, int(stats.get(key, 0) or 0))
        return cls(when, (get("rd_operations"), get("wr_operations"), get("flush_operations")),
                   (get("rd_total_times"), get("wr_total_times"), get("flush_total_times")))

    @classmethod
    def from_qmp(cls, stats: dict, when: float) -> "Counters":
        """From a drive's ``stats`` in QMP ``query-blockstats`` (a missing one counts 0)."""
        return cls.from_libvirt({k.replace("_total_time_ns", "_total_times"): v
                                 for k, v in stats.items()}, when)

    def since(self, earlier: "Counters") -> "Window":
        """The window between ``earlier`` and this reading."""
        return Window(max(0.0, self.when - earlier.when),
                      tuple(max(0, a - b) for a, b in zip(self.ops, earlier.ops)),
                      tuple(max(0, a - b) for a, b in zip(self.ns, earlier.ns)))


@dataclass(frozen=True)
class Window:
    """The guest's I/O over some seconds: counts and total ns per kind (``KINDS``)."""
    seconds: float
    ops: tuple[int, ...]
    ns: tuple[int, ...]

    def __add__(self, other: "Window") -> "Window":
        return Window(self.seconds + other.seconds,
                      tuple(a + b for a, b in zip(self.ops, other.ops)),
                      tuple(a + b for a, b in zip(self.ns, other.ns)))

    @property
    def total(self) -> int:
        return sum(self.ops)

    @property
    def rate(self) -> float:
        """I/Os a second."""
        return self.total / self.seconds if self.seconds > 0 else 0.0

    def mean(self, kind: int) -> float | None:
        """The mean time of one I/O of ``kind`` (s); None with fewer than MIN_KIND_OPS."""
        n = self.ops[kind]
        return self.ns[kind] / n / 1e9 if n >= MIN_KIND_OPS else None

    def to_json(self) -> dict:
        return {"seconds": round(self.seconds, 3), "ops": list(self.ops), "ns": list(self.ns)}

    @classmethod
    def from_json(cls, doc: dict) -> "Window":
        ops, ns = [int(x) for x in doc["ops"]], [int(x) for x in doc["ns"]]
        if len(ops) != len(KINDS) or len(ns) != len(KINDS):
            raise ValueError("a window has one count and one time per kind")
        return cls(float(doc["seconds"]), tuple(ops), tuple(ns))


def timed(reads: dict, seconds: float, sleep) -> dict[str, list[Window]]:
    """The baseline of each disk of ``reads`` (key -> a call that reads its ``Counters``
    now): its guest's I/O over ``seconds``, in ``BASELINE_WINDOWS`` windows, the disks
    together; nothing for 0 s."""
    if seconds <= 0 or not reads:
        return {}
    readings = {key: [read()] for key, read in reads.items()}
    for _ in range(BASELINE_WINDOWS):
        sleep(seconds / BASELINE_WINDOWS)
        for key, read in reads.items():
            readings[key].append(read())
    return {key: [b.since(a) for a, b in zip(r, r[1:])] for key, r in readings.items()}


def pooled(windows: list[Window]) -> Window:
    out = Window(0.0, (0,) * len(KINDS), (0,) * len(KINDS))
    for w in windows:
        out = out + w
    return out


def ratio(before: Window, after: Window) -> tuple[float, float, float] | None:
    """``(after / before, before's figure, after's figure)``: the mean time of an I/O at
    ``before``'s mix (the module docstring); None when no kind has enough I/Os in both."""
    b = a = weight = 0.0
    for k in range(len(KINDS)):
        mb, ma = before.mean(k), after.mean(k)
        if mb is None or ma is None:
            continue
        share = before.ops[k]
        b, a, weight = b + share * mb, a + share * ma, weight + share
    if weight == 0 or b <= 0:
        return None
    return a / b, b / weight, a / weight


def noise(baseline: list[Window]) -> float:
    """The baseline's spread: its windows' largest relative departure from their pool."""
    whole = pooled(baseline)
    return max((abs(r[0] - 1.0) for w in baseline if w.total >= MIN_OPS
                and (r := ratio(whole, w)) is not None), default=0.0)


@dataclass
class Verdict:
    """A judged window: how much slower (after / before), and whether it releases."""
    slower_by: float            # the window's figure over the baseline's, less 1
    release: bool
    reason: str | None = None


class Judge:
    """Judges the windows after the switch against the baseline (the module docstring)."""

    def __init__(self, baseline: list[Window], margin: float = MARGIN):
        self.before = pooled(baseline)
        self.noise = noise(baseline)
        self.limit = margin + self.noise
        self.seen = 0                 # windows since the switch
        self.run = 0                  # slower windows in a row
        self.after = pooled([])       # the judged windows, pooled

    @property
    def usable(self) -> bool:
        """Whether the baseline has enough I/O to compare anything with."""
        return self.before.total >= MIN_OPS

    def add(self, window: Window) -> Verdict | None:
        """One window after the switch; its verdict, or None when it is not judged."""
        self.seen += 1
        if self.seen <= SETTLE_WINDOWS or window.total < MIN_OPS or not self.usable:
            return None
        r = ratio(self.before, window)
        if r is None:
            return None
        self.after = self.after + window
        slower_by = r[0] - 1.0
        self.run = self.run + 1 if slower_by > self.limit else 0
        if self.run < SLOW_WINDOWS:
            return Verdict(slower_by, False)
        return Verdict(slower_by, True, (
            f"the guest's I/O took {r[0]:.2f}x as long as before adoption for "
            f"{self.run} windows of {window.seconds:.0f} s (a mean {r[2] * 1e6:,.0f} us "
            f"against {r[1] * 1e6:,.0f} us; allowed {self.limit:.0%}: "
            f"{self.limit - self.noise:.0%} and the noise measured before, "
            f"{self.noise:.0%})"))

    @property
    def gain(self) -> float | None:
        """The baseline's mean I/O time over the judged windows' since the switch."""
        r = ratio(self.before, self.after)
        return None if r is None or r[0] <= 0 else 1.0 / r[0]
