"""What holding a disk in memory would buy: a forecast from its miss-ratio curve.

Theory of operation
-------------------
Pure core, for ``vmdisktouch advise``. The disk was watched for a while: its
reads and writes a second, its miss-ratio curve (``core.mrc``: the share of
its reads an LRU cache of each size would serve), the time a read waits when
it goes to the device (``miss``) and when the page cache serves it (``hit``),
and the share the page cache serves now (0 for a disk QEMU opens with
O_DIRECT, ``cache=none``).

The size advised is what the curve wants (``MissRatioCurve.wants``: past
it, one GiB more would serve less than 2 % more of the reads), at most the
image. Held, it serves ``h`` of the reads: the curve's height there (an LRU
cache of that size), or more, the share of the window's reads that fell on
the hottest blocks of that size (``hottest_share``), since the daemon holds
the hottest blocks and the page cache keeps what it can besides: an LRU of
the zone's size loses zone pages to each cold read, a hold does not. Each
read then waits ``(h - now) * (miss - hit)`` less on average.

What that buys in reads a second depends on how the guest issues them. A
guest waiting on its own I/O (a database's sync reads, a boot) keeps the
same number of requests in flight, ``depth``: at least one while it waits,
and at least as many as the device holds on average (Little's law: the I/O
rate times the mean wait, as measured). Each request's cycle (its wait at
the device and the guest's and QEMU's own time around it) is ``depth /
rate``; hits take ``saved`` seconds of waiting a second off the ``depth``
seconds of cycles a second, so the rate becomes ``rate / (1 - saved /
depth)``. The time outside the device's wait (QEMU's, the guest's) does not
shrink, which is why the device's depth alone (less than one for a sync
guest) would promise far more. A guest that issues at a fixed pace gets
lower latency instead, and no more reads: the forecast says "at this
queue depth" for that reason.

A window too short to stand on (``advice.evidence`` with advise's minimum,
``advice.ADVISE``: its seconds, its re-reads, and the size's own pages seen
read again) says no size at all: ``not_enough``, with how much longer to
watch. A curve of a few seconds has seen only the reuses shorter than its
age: a 432 MiB hot zone watched 10 s looked like 168M for 27 % of the reads,
watched 60 s 504M for 82 % (docs/benchmarks/advise.md#advise-window).

A curve that is what uniform reads of the whole image would give (every
page as likely as any other: ``uniform_curve``, from a cold start) wants the
whole image: no smaller size helps. A curve that stays at zero (no page read twice in the window) buys
nothing at any size. Both are said as such, not as a size.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

GiB = 1 << 30
UNIFORM_SLACK = 0.05      # a curve within this of the straight line to the image: uniform
WHOLE = 0.9               # wants at least this share of the image: the image, not a part
NO_REUSE = 0.01           # a curve below this at the image: nothing read twice


@dataclass(frozen=True)
class Watched:
    """What the watch measured of one disk (every rate a second, every time in seconds)."""
    image_bytes: int
    page_size: int
    reads_per_second: float
    writes_per_second: float
    read_wait: float | None       # the mean wait of a read as it is now (None: not measured)
    write_wait: float | None      # of a write
    miss: float | None            # a read that goes to the device
    hit: float                    # a read the page cache serves
    hit_ratio_now: float          # the share of reads served from memory now
    pages_read: float             # the pages the curve was fed (its reads)
    buffered: bool                # through the page cache now (cache=writethrough and the like)


@dataclass(frozen=True)
class Forecast:
    """The advice for one disk: a size and what it would buy, or why none helps."""
    verdict: str                  # "hold", "uniform", "no_reuse", "no_reads", "no_latency",
                                  # "not_enough"
    bytes: int                    # the size advised (0: none)
    hit_ratio: float              # the share of reads served from memory with it held
    saved_per_read: float         # seconds a read waits less, on average
    more_reads_per_second: float  # at the same queue depth
    depth: float | None           # the I/O in flight, on average
    buffered: bool                # the disk goes through the page cache now
    evidence: dict | None = None  # what the curve stands on (``advice.evidence``)

    def to_json(self) -> dict:
        return {"verdict": self.verdict, "bytes": int(self.bytes),
                "hit_ratio": round(self.hit_ratio, 4),
                "saved_per_read_us": round(self.saved_per_read * 1e6, 1),
                "more_reads_per_second": round(self.more_reads_per_second, 1),
                "queue_depth": None if self.depth is None else round(self.depth, 2),
                "buffered": self.buffered, "evidence": self.evidence}


def cache_hit_ratio(pages_read: float, pages_added: float) -> float | None:
    """The share of the pages read that needed no page added to the cache (readahead adds
    pages too, so it is a lower bound); None without reads."""
    return max(0.0, 1.0 - pages_added / pages_read) if pages_read > 0 else None


def uniform_curve(sizes, image_pages: int, reads: float) -> np.ndarray:
    """The LRU hit ratio at each size (pages) of ``reads`` reads of pages drawn uniformly
    from ``image_pages``, from a cold start. A re-read hits a cache of S pages when fewer
    than S distinct pages came between, that is when its gap, in reads, is under
    G = -N ln(1 - S/N); a gap is geometric (q = 1 - 1/N the chance a read is not of
    the page), so the t-th read hits with 1 - q^min(G, t), summed in closed form."""
    n = max(float(image_pages), 2.0)
    r = max(float(reads), 1.0)
    q = 1.0 - 1.0 / n
    s = np.clip(np.asarray(sizes, dtype=float), 0.0, n)
    with np.errstate(divide="ignore"):
        g = np.minimum(np.where(s >= n, np.inf, -n * np.log1p(-s / n)), r)
    qg = q ** g
    return (g - (1 - qg) / (1 - q) + (r - g) * (1 - qg)) / r


def is_uniform(curve: list[list[float]], image_bytes: int, page_size: int,
               reads: float) -> bool:
    """The curve is what uniform reads over the whole image would give (``uniform_curve``,
    within ``UNIFORM_SLACK``): every page as likely as any other, so no part of the
    image serves more per byte held than the rest."""
    pts = np.asarray(curve, dtype=float)
    if pts.size == 0 or image_bytes <= 0:
        return False
    model = uniform_curve(pts[:, 0] / page_size, image_bytes // page_size, reads)
    return bool(np.max(np.abs(pts[:, 1] - model)) <= UNIFORM_SLACK)


def hottest_share(block_reads: np.ndarray, nblocks: int) -> float:
    """The share of the reads that fell on the ``nblocks`` most read blocks: what holding
    them would have served (the daemon holds the hottest blocks, not an LRU's pages)."""
    total = float(block_reads.sum())
    if total <= 0 or nblocks <= 0:
        return 0.0
    k = min(int(nblocks), block_reads.size)
    return float(np.partition(block_reads, block_reads.size - k)[block_reads.size - k:].sum()
                 / total)


def depth(w: Watched) -> float | None:
    """The requests the guest keeps in flight: at least one, and at least the device's
    average (Little's law: each rate times its mean wait)."""
    if w.read_wait is None:
        return None
    return max(1.0, w.reads_per_second * w.read_wait
               + w.writes_per_second * (w.write_wait or 0.0))


def forecast(w: Watched, window: list[list[float]], hit_at, wants: int,
             hottest_at=lambda size: 0.0, evidence_for=None) -> Forecast:
    """The advice for a disk ``w``: ``window`` its curve as the window saw it, from a cold
    start (``[[bytes, hit_ratio], ...]``, held to ``uniform_curve``), ``hit_at(bytes)``
    the steady state's height at any size, ``wants`` what that wants,
    ``hottest_at(bytes)`` the share of the reads on the hottest blocks of that size, and
    ``evidence_for(bytes)`` what the curve stands on for a size of so many bytes
    (``advice.evidence``; None: not judged)."""
    image = int(w.image_bytes)
    q = depth(w)
    ev = evidence_for(0) if evidence_for else None
    if w.reads_per_second <= 0:
        return Forecast("no_reads", 0, 0.0, 0.0, 0.0, q, w.buffered, ev)
    if ev is not None and not ev["enough"]:
        # no re-read in a window of its full length is the finding, not a lack of one
        long_enough = ev["window_seconds"] >= ev["minimum"]["window_seconds"]
        verdict = "no_reuse" if long_enough and hit_at(image) < NO_REUSE else "not_enough"
        return Forecast(verdict, 0, 0.0, 0.0, 0.0, q, w.buffered, ev)
    f = _forecast(w, window, hit_at, wants, hottest_at, q)
    if evidence_for and f.verdict in ("hold", "no_latency"):   # a part of the image: seen?
        ev = evidence_for(f.bytes)
        if not ev["enough"]:
            return Forecast("not_enough", 0, 0.0, 0.0, 0.0, q, w.buffered, ev)
    return replace(f, evidence=ev)


def _forecast(w: Watched, window, hit_at, wants: int, hottest_at, q) -> Forecast:
    """``forecast`` of a disk read in a window that is evidence."""
    image = int(w.image_bytes)
    if hit_at(image) < NO_REUSE:
        return Forecast("no_reuse", 0, 0.0, 0.0, 0.0, q, w.buffered)
    uniform = is_uniform(window, image, w.page_size, w.pages_read)
    size = image if uniform or wants >= WHOLE * image else max(int(wants), w.page_size)
    h = max(float(hit_at(size)), float(hottest_at(size)), w.hit_ratio_now)
    if w.miss is None:
        return Forecast("no_latency", size, h, 0.0, 0.0, q, w.buffered)
    saved = max(0.0, h - w.hit_ratio_now) * max(0.0, w.miss - w.hit)
    more = 0.0
    if q:
        waiting = saved * w.reads_per_second          # seconds of waiting a second it saves
        more = w.reads_per_second * (1.0 / max(1.0 - waiting / q, 1e-9) - 1.0)
    return Forecast("uniform" if uniform else "hold", size, h, saved, more, q, w.buffered)
