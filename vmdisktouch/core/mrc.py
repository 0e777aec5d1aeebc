"""Miss-ratio curves from a disk's reads: what an LRU page cache of each size would hit.

Theory of operation
-------------------
An LRU cache of S pages serves a read of page p from memory exactly when
fewer than S distinct pages were read since p's last read: the read's
*reuse distance* is under S (Mattson's stack algorithm). The hit ratio at
S is the share of reads whose distance is under S; a first read never hits.
The curve of it over S is what more memory would buy, for every size at once.

Counting distinct pages exactly needs memory for every page ever read.
SHARDS (Waldspurger et al., FAST 2015) samples in space instead: a page is in
the sample when a hash of its number falls under a threshold T of 2^24 (the
rate R = T / 2^24), and then every read of it is seen. Distances among the
sampled pages, divided by R, estimate the true ones, and each sampled read
stands for 1/R reads. The sample is kept at a fixed size ("fixed-size
SHARDS"): when more than ``max_pages`` pages are in it, the one with the
largest hash leaves and T drops to that hash. Memory is then bounded
whatever the image size, and the rate follows what the guest reads.

Distances come from a Fenwick tree over the sampled reads in time: a page
marks the time of its last read, and a read's distance is the number of
marks after its page's previous one. Times are renumbered when the tree is
full.

Its cost is one Python step per sampled read (about 10 us), so the rate
also has a ceiling in sampled reads a second (``max_per_second``, a token
bucket of ten seconds' worth): a batch that brings more than the bucket
holds lowers the threshold to the hash that keeps that many, at once. A guest reading a million pages a second is
sampled more thinly, not more expensively. The rate never rises again (as
in SHARDS): the sample stays consistent. Where the kernel samples (``bpf_reads``), it
samples under the same threshold, and ``feed`` is told the pages read.

Reads come as page ranges, one a batch of the kernel's (``batch_ends``, ``Batches``),
and every page of a range is a read, however long it is (``feed_ranges``,
``sample_ranges``): a 64 MiB request is 16,384 reads in order, each sampled as a 4 KiB
read's one page is. Before, only a range's first 256 pages were: a zone re-read
in 4 MiB requests (one range each) looked a quarter of its size, in 64 MiB requests
(batches of 31 MiB) a 31st. Both trace paths feed ranges: the ring buffer's events, and
the kernel's sample (its sampled pages, and the ranges too long for it, whole).

The guest changes its mind: the histogram of distances is a decayed sum
(``decay``: weights halve every ``half_life`` seconds), so a changed working
set shows within a few half-lives. It is kept in bins of an eighth of an
octave (9 % apart) and read at any size by ``hit_ratio`` or ``curve``.

A curve taken over a short window from a cold start (``advise``) counts
every page's first read in the window as a miss, though most were re-reads
of reads before it: a 128 MiB zone read three times in the window shows a
third of its reads as misses that a cache holding the zone would serve.
With ``steady`` the curve treats those first reads as censored (their
distance is over the distinct pages read since the start, not infinite)
and estimates the steady state by Kaplan-Meier (``_steady``): within 2
points of the steady state at the zone's size where the window gave 15
less. Past the longest distance the window could see, it stays flat.

With ``rate=1`` and no ``max_pages`` it is the exact computation over
every page; the tests hold the sampled curve to it.
"""

from __future__ import annotations

import heapq

import numpy as np

HASH_BITS = 24
FULL = 1 << HASH_BITS              # T of a sample of every page
HASH_MUL = 0x9E3779B97F4A7C15      # Fibonacci hashing: page * phi, top bits (bpf_reads too)
_MUL = np.uint64(HASH_MUL)
BINS_PER_OCTAVE = 8
NBINS = 48 * BINS_PER_OCTAVE + 1   # distances up to 2^48 pages; the last bin: never reused
MAX_PAGES = 8192                   # the sample's size: 8 K pages, about 1.5 MiB in all
CHUNK_PAGES = 1 << 20              # ``sample_ranges`` expands this many pages at a time
HOLD_SECONDS = 0.25                # ``Batches``: a drain's newest events that may continue
CURVE_POINTS = 12                  # the status's curve: the image, a half, ... 1/2048 of it
GiB = 1 << 30
WANT_GAIN = 0.02                   # ``wants``: the size past which a GiB more serves less
BURST_SECONDS = 10                 # the ceiling's bucket: this many seconds of it
MAX_PER_SECOND = 400               # sampled reads a second, at most: 0.4 % of a core


def page_hash(pages: np.ndarray) -> np.ndarray:
    """The sampling hash of page numbers: their top ``HASH_BITS`` after a multiply by the
    golden ratio (uniform over any run of pages, so an aligned zone is sampled evenly)."""
    with np.errstate(over="ignore"):
        return ((np.asarray(pages, dtype=np.uint64) * _MUL) >> np.uint64(64 - HASH_BITS)
                ).astype(np.int64)


def pages_read(first: np.ndarray, last: np.ndarray) -> np.ndarray:
    """Every page of read ranges ``[first, last]`` (inclusive), in order."""
    first = np.asarray(first, dtype=np.int64)
    n = np.clip(np.asarray(last, dtype=np.int64) - first + 1, 0, None)
    if n.size == 0 or not n.any():
        return np.zeros(0, dtype=np.int64)
    starts = np.repeat(first - (np.cumsum(n) - n), n)
    return starts + np.arange(int(n.sum()), dtype=np.int64)


def sample_ranges(first: np.ndarray, last: np.ndarray, threshold: int = FULL,
                  chunk: int = CHUNK_PAGES) -> tuple[np.ndarray, int]:
    """The pages of read ranges ``[first, last]`` (inclusive) whose hash is under
    ``threshold``, in the order read, and how many pages the ranges hold: every page of
    every range, however long (a 64 MiB read is 16,384 pages, each sampled as a 4 KiB
    read's one is). Expanded ``chunk`` pages at a time: a read of a whole large image
    never becomes one array of its pages."""
    first = np.asarray(first, dtype=np.int64).ravel()
    n = np.clip(np.asarray(last, dtype=np.int64).ravel() - first + 1, 0, None)
    total = int(n.sum())
    if total <= chunk:
        pages = pages_read(first, first + n - 1)
        return pages[page_hash(pages) < threshold], total
    pieces = -(-n // chunk)                     # a range longer than a chunk: in pieces
    idx = np.repeat(np.arange(first.size), pieces)
    k = np.arange(idx.size) - np.repeat(np.cumsum(pieces) - pieces, pieces)
    pf = first[idx] + k * chunk
    pn = np.minimum(n[idx] - k * chunk, chunk)
    group = (np.cumsum(pn) - pn) // chunk       # consecutive pieces, ~a chunk of pages each
    cuts = np.flatnonzero(np.diff(group)) + 1
    out = []
    for f, m in zip(np.split(pf, cuts), np.split(pn, cuts)):
        pages = pages_read(f, f + m - 1)
        out.append(pages[page_hash(pages) < threshold])
    return np.concatenate(out), total


def batch_ends(first: np.ndarray, last: np.ndarray, *, open_ends: bool = False):
    """The last page each read event's batch returned, for READ events in time order. The
    kernel reports a long read once per batch of folios, each time from the batch's first
    page to the request's end (``0-4095, 31-4095, 62-4095``): an event that a later one
    continues (the same last page, a first page past its own and within its range) ends
    before that one's first page, so each page read counts once. ``open_ends``: also
    which events no later one continued though one still may (longer than a page)."""
    first = np.asarray(first, dtype=np.int64)
    last = np.asarray(last, dtype=np.int64)
    if first.size < 2:
        end = last.copy()
        return (end, last > first) if open_ends else end
    order = np.lexsort((np.arange(first.size), last))          # by last page, then time
    f, l = first[order], last[order]
    cont = (l[1:] == l[:-1]) & (f[1:] > f[:-1]) & (f[1:] <= l[:-1])
    end = l.copy()
    end[:-1][cont] = f[1:][cont] - 1
    out = np.empty_like(last)
    out[order] = end
    if not open_ends:
        return out
    still = np.empty(first.size, dtype=bool)
    still[order] = np.append(~cont, True) & (l > f)
    return out, still


class Batches:
    """A source's READ events, drain by drain, into the page ranges each batch of the
    kernel read (``batch_ends``). An event of the drain's last ``HOLD_SECONDS`` that no
    later one continued, and that one still may (longer than a page: a read split over
    two drains), waits for the next drain: there it is cut where its continuation starts,
    or taken whole. Without the wait the rest of a 64 MiB request would count twice, at
    short distances (reuse that never was)."""

    def __init__(self):
        z = np.zeros(0, np.int64)
        self._held = (z, z, z)

    def ranges(self, first: np.ndarray, last: np.ndarray,
               ts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """This drain's events (time order; ``ts`` in ns) -> the ranges read ``(first,
        last)``, in order."""
        hf, hl, ht = self._held
        first = np.concatenate((hf, np.asarray(first, dtype=np.int64)))
        last = np.concatenate((hl, np.asarray(last, dtype=np.int64)))
        ts = np.concatenate((ht, np.asarray(ts, dtype=np.int64)))
        end, still = batch_ends(first, last, open_ends=True)
        still[:hf.size] = False                 # held once already: taken whole now
        if ts.size:
            still &= ts >= ts.max() - int(HOLD_SECONDS * 1e9)
        self._held = first[still], last[still], ts[still]
        return first[~still], end[~still]


def _bin(distance: float) -> int:
    """The histogram bin of a distance in pages (bin 0: distance under one page)."""
    if distance < 1:
        return 0
    return min(NBINS - 2, 1 + int(np.log2(distance) * BINS_PER_OCTAVE))


# Each bin's distances, [low, high): a cache of ``high`` pages hits all of them.
_LOW = np.concatenate(([0.0], 2.0 ** (np.arange(NBINS - 2) / BINS_PER_OCTAVE)))
_HIGH = np.concatenate(([1.0], 2.0 ** (np.arange(1, NBINS - 1) / BINS_PER_OCTAVE)))


class _Fenwick:
    """Prefix sums over time slots, each 0 or 1 (a page's last read)."""

    def __init__(self, n: int):
        self.n = n
        self.tree = [0] * (n + 1)

    def add(self, i: int, v: int) -> None:
        i += 1
        tree, n = self.tree, self.n
        while i <= n:
            tree[i] += v
            i += i & -i

    def prefix(self, i: int) -> int:
        """Sum of slots [0, i)."""
        tree, s = self.tree, 0
        while i > 0:
            s += tree[i]
            i -= i & -i
        return s


class MissRatioCurve:
    """The reuse-distance histogram of one disk's reads, sampled (module docstring)."""

    def __init__(self, *, max_pages: int | None = MAX_PAGES, rate: float = 1.0,
                 half_life: float = 600.0, max_per_second: float | None = None,
                 steady: bool = False):
        self.max_pages = max_pages
        self.max_per_second = max_per_second
        self.lost = 0                        # sampled reads the kernel's ring lost
        self._tokens = BURST_SECONDS * (max_per_second or 0)   # sampled reads allowed now
        self.threshold = max(1, min(FULL, int(round(rate * FULL))))
        self.half_life = float(half_life)
        self.hist = np.zeros(NBINS)          # weight (reads) per distance bin
        self.steady = steady                 # ``curve``: the steady state (first reads censored)
        self.first = np.zeros(NBINS)         # first reads, by the distinct pages before them
        self.reads = 0.0                     # all reads fed, decayed like the histogram
        self.age = 0.0                       # seconds ``decay`` has aged it by
        self._last: dict[int, int] = {}      # sampled page -> time of its last read
        self._heap: list[tuple[int, int]] = []   # (-hash, page) of the sample
        cap = 4 * (max_pages or 1 << 16)
        self._tree = _Fenwick(cap)
        self._now = 0

    @property
    def rate(self) -> float:
        return self.threshold / FULL

    @property
    def sampled_pages(self) -> int:
        return len(self._last)

    @classmethod
    def for_image(cls, npages: int, **kw) -> MissRatioCurve:
        """A disk's curve: sampled from the start at the rate that keeps a read of the
        whole image within ``MAX_PAGES`` (and ``MAX_PER_SECOND``)."""
        kw.setdefault("max_per_second", MAX_PER_SECOND)
        return cls(rate=min(1.0, MAX_PAGES / max(1, int(npages))), **kw)

    def feed(self, pages: np.ndarray, total: int | None = None, lost: int = 0,
             seconds: float | None = None) -> None:
        """Reads of these page numbers, in the order they came. ``total``: the pages read in
        all, where ``pages`` is the kernel's sample of them (else every page read);
        ``lost``: sampled reads that did not arrive (the pages they stood for leave the
        total); ``seconds``: the time the batch covers (``max_per_second``)."""
        pages = np.asarray(pages, dtype=np.int64)
        total = pages.size if total is None else int(total)
        self.reads += max(0.0, total - lost * FULL / self.threshold)
        self.lost += int(lost)
        if pages.size == 0:
            return
        hashes = page_hash(pages)
        keep = hashes < self.threshold
        if self.max_per_second and seconds is not None:
            cap = self.max_per_second
            self._tokens = min(BURST_SECONDS * cap, self._tokens + cap * max(0.0, seconds))
            allowed = max(64, int(self._tokens))
            if int(keep.sum()) > allowed:
                self._lower(int(np.partition(hashes[keep], allowed)[allowed]))
                keep = hashes < self.threshold
            self._tokens = max(0.0, self._tokens - int(keep.sum()))
        for page, h in zip(pages[keep].tolist(), hashes[keep].tolist()):
            if h < self.threshold:           # the threshold may have dropped in this batch
                self._read(page, h)

    def feed_ranges(self, first: np.ndarray, last: np.ndarray, total: int | None = None,
                    lost: int = 0, seconds: float | None = None) -> None:
        """Reads of the page ranges ``[first, last]`` (inclusive), in the order they came:
        every page of each, sampled under the threshold (``sample_ranges``), then as
        ``feed``. The one way both trace paths feed the curve: the ring buffer's batches
        (``Batches``) and the kernel's sample (single pages, and the ranges too long for
        it to sample, ``bpf_reads``). ``total``: the pages read in all where the ranges
        are a sample of them (else every page of the ranges)."""
        pages, n = sample_ranges(first, last, self.threshold)
        self.feed(pages, n if total is None else total, lost, seconds)

    def _read(self, page: int, h: int) -> None:
        if self._now >= self._tree.n:
            self._renumber()
        tree, last, now = self._tree, self._last, self._now
        prev = last.get(page)
        weight = FULL / self.threshold
        if prev is None:
            self.hist[NBINS - 1] += weight
            self.first[_bin(len(last) * weight)] += weight
            last[page] = now
            heapq.heappush(self._heap, (-h, page))
            tree.add(now, 1)
            if self.max_pages is not None and len(last) > self.max_pages:
                self._shrink()
        else:
            distinct = tree.prefix(now) - tree.prefix(prev + 1)
            self.hist[_bin(distinct * weight)] += weight
            tree.add(prev, -1)
            tree.add(now, 1)
            last[page] = now
        self._now = now + 1

    def _shrink(self) -> None:
        """The page of the largest hash leaves; the threshold drops to its hash (pages of
        that hash or above are no longer sampled)."""
        while len(self._last) > self.max_pages:
            self._lower(-self._heap[0][0])

    def _lower(self, threshold: int) -> None:
        """Sample under ``threshold`` from now: the pages at or above it leave."""
        self.threshold = max(1, min(self.threshold, int(threshold)))
        while self._heap and -self._heap[0][0] >= self.threshold:
            _, page = heapq.heappop(self._heap)
            self._tree.add(self._last.pop(page), -1)

    def _renumber(self) -> None:
        """Give the sampled pages the times 0..n-1 in the order of their last reads, in a
        tree at least twice their number (the exact computation has no sample size)."""
        order = sorted(self._last.items(), key=lambda kv: kv[1])
        self._tree = _Fenwick(max(self._tree.n, 2 * len(order)))
        for t, (page, _) in enumerate(order):
            self._last[page] = t
            self._tree.add(t, 1)
        self._now = len(order)

    @property
    def reads_per_second(self) -> float | None:
        """The read rate the decayed total stands for: the total over the window it
        weighs (a half-life over ln 2 once it is old; less while it is young); None
        before it has aged."""
        if self.age <= 0:
            return None
        if self.half_life <= 0:
            return self.reads / self.age
        window = self.half_life / np.log(2) * (1 - 0.5 ** (self.age / self.half_life))
        return self.reads / window

    def decay(self, seconds: float) -> None:
        """Age the histogram by ``seconds``: what was read a half-life ago weighs half."""
        self.age += max(0.0, seconds)
        if seconds > 0 and self.half_life > 0:
            f = 0.5 ** (seconds / self.half_life)
            self.hist *= f
            self.first *= f
            self.reads *= f

    @property
    def re_reads(self) -> float:
        """The reads that were re-reads seen within the window (the window's curve past
        every size, never the steady state's estimate of the first reads): the evidence
        the curve stands on (``advice.evidence``)."""
        return self.reads * float(self.curve([np.inf], steady=False)[0])

    @property
    def reuse_share(self) -> float:
        """The share of its reads that were re-reads: the curve's height past every size."""
        return self.hit_ratio(np.inf)

    def hit_ratio(self, size_pages: float) -> float:
        """The share of reads an LRU cache of ``size_pages`` would have served."""
        return float(self.curve([size_pages])[0])

    def curve(self, sizes_pages, steady: bool | None = None) -> np.ndarray:
        """``hit_ratio`` at each size: the histogram's cumulative sum, linear within a
        bin. The sample's weight falls short of (or exceeds) the reads fed when the
        hottest pages happen to be in (or out of) it; the difference goes to the shortest
        distances (SHARDS-adj: on a Zipf trace, 0.024 of mean error becomes 0.001)."""
        sizes = np.asarray(sizes_pages, dtype=float)
        if self.reads <= 0:
            return np.zeros(sizes.shape)
        hist = self.hist[:NBINS - 1].copy()
        hist[0] += self.reads - float(self.hist.sum())
        if self.steady if steady is None else steady:
            hist = self._steady(hist) * self.reads
        below = np.concatenate(([0.0], np.cumsum(hist)))      # hits of caches of _LOW[k]
        k = np.clip(np.searchsorted(_LOW, sizes, side="right") - 1, 0, NBINS - 2)
        part = np.clip((sizes - _LOW[k]) / (_HIGH[k] - _LOW[k]), 0.0, 1.0)
        return np.clip((below[k] + hist[k] * part) / self.reads, 0.0, 1.0)

    def _steady(self, hist: np.ndarray) -> np.ndarray:
        """The share of reads per distance bin in the steady state, for a curve taken over a
        window from a cold start (``steady``): a page's first read in the window was
        perhaps a re-read of a read before it, of a distance over the distinct pages read
        since the start. Those distances are censored, not infinite: the Kaplan-Meier
        estimate over the bins takes each first read as a read still waiting at its bin,
        as the reads whose distance was seen wait until theirs."""
        events = hist
        waiting = np.cumsum((events + self.first[:NBINS - 1])[::-1])[::-1]
        with np.errstate(divide="ignore", invalid="ignore"):
            stay = np.where(waiting > 0, 1.0 - events / waiting, 1.0)
        survive = np.cumprod(np.clip(stay, 0.0, 1.0))
        return -np.diff(np.concatenate(([1.0], survive)))

    def status(self, image_bytes: int, page_size: int, steady: bool | None = None) -> dict:
        """The status's ``curve`` (``[[bytes, hit_ratio], ...]`` at ``CURVE_POINTS`` sizes up
        to the image's) and ``mrc`` (what the curve stands on)."""
        sizes = sorted({max(page_size, (image_bytes >> k) // page_size * page_size)
                        for k in range(CURVE_POINTS)})
        ratios = self.curve([s / page_size for s in sizes], steady)
        return {"curve": [[int(s), round(float(r), 4)] for s, r in zip(sizes, ratios)],
                "mrc": {"reads": round(self.reads), "sample_rate": self.rate,
                        "sampled_pages": self.sampled_pages, "samples_lost": self.lost}}

    def next_gib(self, held_bytes: int, page_size: int, pages_per_second: float) -> dict:
        """What one GiB more than ``held_bytes`` would buy, read from the curve: the hit
        ratio at that size, and the reads a second it adds at ``pages_per_second``."""
        now = self.hit_ratio(held_bytes / page_size)
        then = self.hit_ratio((held_bytes + GiB) / page_size)
        return {"bytes": int(held_bytes + GiB), "hit_ratio": round(then, 4),
                "more_reads_per_second": round(max(0.0, then - now) * pages_per_second, 1)}

    def wants(self, image_bytes: int, page_size: int) -> int:
        """The memory that still pays: the smallest size (in steps of 1/256 of the image, at
        most 64 MiB, up to the image) past which one GiB more would serve less than
        ``WANT_GAIN`` of the reads more. Not every block read: a zone read often, and the
        rest of a large image now and then, wants the zone."""
        step = max(page_size, min(64 << 20, int(image_bytes) // 256 // page_size * page_size))
        sizes = np.append(np.arange(0, int(image_bytes), step), int(image_bytes))
        gain = self.curve((sizes + GiB) / page_size) - self.curve(sizes / page_size)
        enough = np.flatnonzero(gain < WANT_GAIN)
        return int(sizes[enough[0]] if enough.size else image_bytes)
