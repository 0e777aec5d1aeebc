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

What a switch costs. A disk QEMU opens with O_DIRECT (``cache=none``) that
would be served must go through the page cache (``cache=writethrough``),
and that path is not free (``system.observe.io_watch.switch_cost``
measures it on the host, the write through QEMU itself on the image's own
file system):

* ``path_extra``: what one hit through QEMU's buffered path (its thread
  pool, ``aio=threads``) takes beyond one read through its direct path
  (``aio=native``), besides the wait at the device: a worker thread's
  wake-up; ``miss_extra``, what a miss takes more through the pool (its
  worker blocks, is woken, and wakes the main loop: 11-14 µs here where a hit
  paid about 3). A read pays the mix, ``h`` of the one and ``1 - h`` of the
  other: charging every read the hit's extra promised fast-read 2.3-2.8 x the
  gain it got (docs/benchmarks/advise.md#advise-cases);
* ``write_extra``: what one write through QEMU's writethrough path (the
  write, then a flush, each through its thread pool) takes beyond one
  through its direct path. Each write waits that much more after the
  switch (not measured on a block device, which nothing writes: taken as 0,
  and said). The guest's own flushes are not seen: the forecast takes a
  guest that does not flush after every write (one that does already pays a
  flush per write, and loses less).

A queue-bound device (``queue_bound``: its reads' mean wait ``QUEUE_BOUND``
times their median or more: a queue or a rate limit in front of it, as on
a busy array) is not held to its waits now: the misses left find no queue.
A read then waits the hits and, for the misses left, the device's typical
(median) wait, a write its typical wait too; and the device serves at most
the misses a second it serves now, so the reads a second are at most those
misses over the share left to miss (``reads * (1 - now) / (1 - h)``). A
miss's mean wait instead understated the gain 2.7 times on a device
throttled to 400 reads a second (docs/benchmarks/advise.md#advise-cases).

The depth is the device's (Little's law on the waits seen), not the guest's,
which QEMU's own time hides from the tracepoints: fio at queue depth 8 kept
2.8 at the device, and its cycle was 175 µs, not the device's 62. With writes
in flight together, each waits for the others' flushes (QEMU runs one flush
at a time per disk): 190 -> 376 µs served, where one write alone pays 100 µs
more. Both are out of the forecast's reach, which promised such a guest +46 %
where it did 3 % fewer reads (docs/benchmarks/advise.md#advise-app).

Adopting instead (``adopt``: ``vmdisktouch adopt`` switches a running ``cache=none``
disk to the page cache and keeps the guest's write cache on): a write is copied into
the page cache and done, and the guest's next flush writes back what came before it.
A guest that flushes after each write pays what it paid (the write at the device,
then the flush), and one that flushes less pays less. The forecast takes the first,
the bound: a write waits ``path_extra`` more (the worker's wake-up), no flush more.
Measured (docs/benchmarks/adopt.md#adopt-writes: fio 80 % reads at queue depth 1
through QEMU): adopted did 1.31 x cache=none's reads/s with a flush after each write,
1.77 x without one; the forecast said 1.25 x and 1.43 x.

With the rates now (``r`` reads, ``w`` writes a second) and ``depth`` I/O in
flight, an I/O's cycle is ``T = depth / (r + w)``; the switch changes it by
``(r * dr + w * dw) / (r + w)``, with ``dr = path_extra - (h - now) * (miss
- hit)`` a read's change and ``dw = write_extra`` a write's. The guest then
does ``depth / T'`` I/O a second in the same mix: reads/s, writes/s and the
mean I/O time, with and without. A mixed workload on a fast disk can come
out slower: the verdict is then ``no_gain``, with the reason. A disk
already buffered pays neither: it does not switch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

GiB = 1 << 30
UNIFORM_SLACK = 0.05      # a curve within this of the straight line to the image: uniform
WHOLE = 0.9               # wants at least this share of the image: the image, not a part
NO_REUSE = 0.01           # a curve below this at the image: nothing read twice
NO_GAIN = 0.0             # reads/s gained at most this: no gain
QUEUE_BOUND = 2.0         # a mean miss this many times its median: the device is queue-bound


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
    miss_typical: float | None = None  # the median wait of a read at the device (None: not
                                       # measured: the device is taken as not queue-bound)
    write_typical: float | None = None  # and of a write
    path_extra: float | None = None   # QEMU's buffered path's extra time a read (None: not
                                      # measured: taken as 0, and said)
    write_extra: float | None = None  # a write through QEMU's writethrough path beyond one
                                      # through its direct path (None: not measured)
    miss_extra: float | None = None   # a read the device serves, through QEMU's thread pool
                                      # beyond its direct path (None: ``path_extra``)


@dataclass(frozen=True)
class Rates:
    """The guest's I/O at its queue depth: reads and writes a second, and the mean time of
    one I/O's cycle (depth / rate, seconds)."""
    reads: float
    writes: float
    io_time: float | None

    def to_json(self) -> dict:
        return {"reads_per_second": round(self.reads, 1),
                "writes_per_second": round(self.writes, 1),
                "mean_io_time_us": None if self.io_time is None
                else round(self.io_time * 1e6, 1)}


@dataclass(frozen=True)
class Forecast:
    """The advice for one disk: a size and what it would buy, or why none helps."""
    verdict: str                  # "hold", "uniform", "no_gain", "no_reuse", "no_reads",
                                  # "no_latency", "not_enough"
    bytes: int                    # the size advised (0: none)
    hit_ratio: float              # the share of reads served from memory with it held
    saved_per_read: float         # seconds a read waits less, on average (the switch's
                                  # extra path included: negative when it costs more)
    more_reads_per_second: float  # at the same queue depth (negative: fewer)
    depth: float | None           # the I/O in flight, on average
    buffered: bool                # the disk goes through the page cache now
    evidence: dict | None = None  # what the curve stands on (``advice.evidence``)
    now: Rates | None = None      # the guest's I/O as watched
    then: Rates | None = None     # and with the size held (after the switch)
    write_cost: float | None = 0.0   # seconds a write waits more after the switch (None:
                                     # not measured, a block device: taken as 0, and said)
    path_extra: float | None = None   # a read's extra time through the buffered path
    reason: str | None = None     # why no gain (``no_gain``)
    queue_bound: bool = False     # the device's waits are a queue's (``queue_bound``)
    adopt: bool = False           # a live adoption's (the guest's write cache kept), not a
                                  # switch to cache=writethrough

    def to_json(self) -> dict:
        return {"verdict": self.verdict, "bytes": int(self.bytes),
                "hit_ratio": round(self.hit_ratio, 4),
                "saved_per_read_us": round(self.saved_per_read * 1e6, 1),
                "more_reads_per_second": round(self.more_reads_per_second, 1),
                "queue_depth": None if self.depth is None else round(self.depth, 2),
                "buffered": self.buffered, "evidence": self.evidence,
                "write_cost_us": None if self.write_cost is None
                else round(self.write_cost * 1e6, 1),
                "path_extra_us": None if self.path_extra is None
                else round(self.path_extra * 1e6, 1),
                "now": None if self.now is None else self.now.to_json(),
                "then": None if self.then is None else self.then.to_json(),
                "reason": self.reason, "queue_bound": self.queue_bound,
                "adopt": self.adopt}


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
             hottest_at=lambda size: 0.0, evidence_for=None, adopt: bool = False) -> Forecast:
    """The advice for a disk ``w``: ``window`` its curve as the window saw it, from a cold
    start (``[[bytes, hit_ratio], ...]``, held to ``uniform_curve``), ``hit_at(bytes)``
    the steady state's height at any size, ``wants`` what that wants,
    ``hottest_at(bytes)`` the share of the reads on the hottest blocks of that size, and
    ``evidence_for(bytes)`` what the curve stands on for a size of so many bytes
    (``advice.evidence``; None: not judged); ``adopt``: the switch is a live adoption
    (module docstring), not to cache=writethrough."""
    image = int(w.image_bytes)
    q = depth(w)
    base = dict(depth=q, buffered=w.buffered, now=rates(w, q), path_extra=w.path_extra,
                adopt=adopt and not w.buffered)
    ev = evidence_for(0) if evidence_for else None
    if w.reads_per_second <= 0:
        return Forecast("no_reads", 0, 0.0, 0.0, 0.0, evidence=ev, **base)
    if ev is not None and not ev["enough"]:
        # no re-read in a window of its full length is the finding, not a lack of one
        long_enough = ev["window_seconds"] >= ev["minimum"]["window_seconds"]
        verdict = "no_reuse" if long_enough and hit_at(image) < NO_REUSE else "not_enough"
        return Forecast(verdict, 0, 0.0, 0.0, 0.0, evidence=ev, **base)
    f = _forecast(w, window, hit_at, wants, hottest_at, base)
    if evidence_for and f.verdict in ("hold", "no_latency", "no_gain"):   # seen?
        ev = evidence_for(f.bytes)
        if not ev["enough"]:
            return Forecast("not_enough", 0, 0.0, 0.0, 0.0, evidence=ev, **base)
    return replace(f, evidence=ev)


def rates(w: Watched, q: float | None, dr: float = 0.0, dw: float = 0.0) -> Rates:
    """The guest's rates at depth ``q`` when a read takes ``dr`` and a write ``dw`` seconds
    longer (module docstring): its cycle ``q / (r + w)`` changes by the mix's mean."""
    r, wr = w.reads_per_second, w.writes_per_second
    total = r + wr
    if not q or total <= 0:
        return Rates(r, wr, None)
    t0 = q / total
    t1 = max(t0 + (r * dr + wr * dw) / total, 1e-9)
    return Rates(r * t0 / t1, wr * t0 / t1, t1)


def queue_bound(w: Watched) -> bool:
    """The device's reads wait in a queue or a rate limit (module docstring): the mean
    wait is ``QUEUE_BOUND`` times the median or more."""
    return bool(w.miss and w.miss_typical and not w.buffered
                and w.miss >= QUEUE_BOUND * w.miss_typical)


def _unqueued(w: Watched, h: float, extra: float, dw: float, q: float | None):
    """``(saved, then)`` for a queue-bound device (module docstring): a read waits ``h``
    hits and the misses left the device's typical wait, a write its typical wait (their
    queue gone); at most as many misses a second as the device serves now."""
    after = h * w.hit + (1.0 - h) * w.miss_typical + extra
    now = w.hit_ratio_now * w.hit + (1.0 - w.hit_ratio_now) * w.miss
    if w.write_typical is not None and w.write_wait is not None:
        dw += min(0.0, w.write_typical - w.write_wait)
    then = rates(w, q, after - now, dw)
    cap = w.reads_per_second * (1.0 - w.hit_ratio_now) / max(1.0 - h, 1e-9)
    if q and then.reads > cap:
        mix = 1.0 + w.writes_per_second / w.reads_per_second
        then = Rates(cap, cap * (mix - 1.0), q / (cap * mix))
    return now - after, then


def _forecast(w: Watched, window, hit_at, wants: int, hottest_at, base: dict) -> Forecast:
    """``forecast`` of a disk read in a window that is evidence."""
    image = int(w.image_bytes)
    if hit_at(image) < NO_REUSE:
        return Forecast("no_reuse", 0, 0.0, 0.0, 0.0, **base)
    uniform = is_uniform(window, image, w.page_size, w.pages_read)
    size = image if uniform or wants >= WHOLE * image else max(int(wants), w.page_size)
    h = max(float(hit_at(size)), float(hottest_at(size)), w.hit_ratio_now)
    if w.miss is None:
        return Forecast("no_latency", size, h, 0.0, 0.0, **base)
    extra = 0.0 if w.buffered else (
        h * (w.path_extra or 0.0) + (1.0 - h) * (w.miss_extra if w.miss_extra is not None
                                                 else w.path_extra or 0.0))
    saved = max(0.0, h - w.hit_ratio_now) * max(0.0, w.miss - w.hit) - extra
    write_cost: float | None = 0.0
    if base["adopt"] and w.writes_per_second > 0:
        write_cost = max(0.0, w.path_extra or 0.0)
    elif not w.buffered and w.writes_per_second > 0:
        write_cost = None if w.write_extra is None else max(0.0, w.write_extra)
    bound = queue_bound(w)
    if bound:
        saved, then = _unqueued(w, h, extra, write_cost or 0.0, base["depth"])
    else:
        then = rates(w, base["depth"], -saved, write_cost or 0.0)
    more = then.reads - base["now"].reads if base["depth"] else 0.0
    verdict, reason = ("uniform" if uniform else "hold"), None
    if base["depth"] and more <= NO_GAIN:
        verdict = "no_gain"
        if saved <= 0 and not extra:
            reason = (f"the page cache already serves {w.hit_ratio_now:.0%} of the reads, as "
                      f"much as {size / (1 << 20):,.0f} MiB held would")
        elif (write_cost or 0.0) * w.writes_per_second > max(saved, 0.0) * w.reads_per_second:
            reason = (f"each write would wait about {write_cost * 1e6:,.0f} µs more "
                      + ("(through QEMU's buffered path)" if base["adopt"] else
                         "(a flush per write under cache=writethrough)")
                      + ", more than the reads save")
        else:
            reason = (f"a read from memory through QEMU's buffered path saves less than that "
                      f"path costs ({extra * 1e6:,.0f} µs a read)")
    return Forecast(verdict, size, h, saved, more, write_cost=write_cost, reason=reason,
                    then=then, queue_bound=bound, **base)
