"""The heat map: smoothed, feedback-suppressed, exponentially decaying.

Theory of operation
-------------------
Pure core: numpy only (the smoothing is checked against scipy.ndimage).
No file system, no clock: the measurements and the elapsed time ``dt`` are
passed in, and ``step`` returns a new ``HeatState`` without touching its
inputs. Every parameter comes in through ``HeatParams``; the defaults live
in ``vmdisktouch.settings`` only.

Per block ``i`` the state holds two float32 components,
``heat_resident`` and ``heat_rewritten``; the heat the regions are cut from
is their sum (``HeatState.total``). One cycle (``step``):

1. Evidence of use. ``e_r[i]`` is the block's resident fraction (in [0, 1])
   as the page cache reports it, except for the blocks the daemon holds:
   those are all resident *because we hold them*, so their residency says
   nothing about the guest and is replaced by 0 (feedback suppression;
   without it a held region would keep itself hot for ever, and through
   the smoothing heat its neighbours, and the holds would creep over the
   whole disk). ``e_w[i]`` is the fraction of a block rewritten since the
   last cycle (found by checksums of held blocks), else 0.

2. Smoothing. ``s_r = A_r * G_{sigma_r} * e_r`` and
   ``s_w = A_w * G_{sigma_w} * e_w``, with ``G`` the discrete Gaussian of
   ``scipy.ndimage.gaussian_filter1d`` (radius 4 sigma) in ``mode="constant"``
   (beyond the ends of the image is nothing: the edges do not reflect).
   ``smooth`` computes exactly that kernel with shifted numpy sums, faster
   than scipy's float32 path (docs/benchmarks.md, why-heat); a test checks
   it against scipy.
   Normalisation: the kernel sums to 1, so the filter preserves mass.
   A wide, fully resident region reaches exactly ``A`` in its interior
   (blocks more than 4 sigma from its ends); a single isolated fully
   resident block gets a peak of ``A * w0`` with
   ``w0 = 1 / sum_x exp(-x^2 / 2 sigma^2) ~= 1 / (sigma * sqrt(2 pi))``
   (0.1995 for sigma = 2), its mass ``A`` spread over its neighbours.
   With A_r = 1, sigma_r = 2, a threshold of 0.2 would treat a lone
   resident block as noise (just under it) and two adjacent ones (0.376
   each) as heat. The default threshold is lower, 0.05: under memory
   pressure a guest's hot blocks are only partly resident, and at 0.2 they
   did not reach the threshold (docs/benchmarks.md, why-heat).
   ``sigma = 0`` means no smoothing (``s = A * e``). The cost is
   proportional to sigma (17 taps at sigma 2; docs/benchmarks.md, why-heat).
   Sparse evidence (its reach, ``2r + 1`` blocks around each nonzero block,
   at most a ``SPARSE_RATIO``-th of the map) is smoothed over that reach
   only, gathered end to end (``_reach``): the same values, exactly, for
   the cost of the few thousand blocks a guest has cached in a 1 TiB image
   instead of its million.

3. Folding. With ``k = exp(-decay * dt)`` each component is an exponential
   moving average of its smoothed input,
   ``H <- k * H + (1 - k) * s``; a steady input ``s`` is approached with
   time constant ``1 / decay`` seconds, whatever the cycle length.
   ``decay = 0`` gives ``k = 1``: the map is frozen (nothing heats, nothing
   cools); use a positive decay. Values below ``FLUSH_BELOW`` are set to
   0 so that long-cold blocks do not become float32 subnormals (slow on
   x86) and the map keeps exact zeros.

Blocks the daemon loaded or released
------------------------------------
Held blocks are not the only ones whose residency is the daemon's doing:
blocks it loaded for the guest's neighbours, and blocks it just released,
are suppressed too. Which blocks, and for how long, is the policy's rule
(``policy``: ``self_loaded``, ``RELEASED_GRACE``); ``step`` takes the union
as ``held_mask``.

Held regions: decay, hysteresis and renewal
-------------------------------------------
Because a held block's residency input is 0, its resident heat, absent
other evidence, decays as ``H(t) = H0 * exp(-decay * t)``: a held region
cools over ~1/decay seconds (10 s at the default 0.1/s). Smoothing may
still carry a little heat into a held block's edge from guest-resident
*unheld* neighbours: that is genuine evidence of use nearby. The things
that keep a held region held are

* rewrites: the checksums of held blocks are the one thing we can observe
  of the guest inside a held region. The fraction of a block rewritten
  (in sixteenths, see ``checksums``) feeds ``heat_rewritten`` (A_w = 1 by
  default, so one cycle that rewrites a wide region all over adds
  ``1 - k``, ~0.39 at 5 s cycles; steady rewriting of f of every block
  holds it near f). Not 4, its earlier default: at 4 moved hot zones were
  followed later than at 1 (docs/benchmarks.md, why-heat);
* hysteresis in ``budget.allocate``: a held run stays a candidate while its
  mean heat is at least ``threshold * policy.HOLD_FRACTION``;
* incumbency in ``budget.allocate``: the resident heat of held blocks
  weighs 16 times in the ranking, so equal unheld candidates do not
  displace a hold every cycle.

Rewrites of a block in this cycle or the one before also put its region in
the first class of ``budget.allocate``; once the guest stops writing there,
the region competes on its (decaying) heat like any other.

A held region that is only read, never written, therefore cools from ~A_r
to threshold/2 (ln(40)/decay = 37 s at the defaults; ~17 s for the ~0.14
mean of a lone cached block's region) and is released. Release does not
evict it: munlock leaves the pages in the page cache, and from the next
cycle the residency of its guest-cached blocks counts again (its
self-loaded shoulders stay suppressed). If the guest still uses it (or
memory is plentiful) it stays resident, its heat climbs back over the
threshold within a cycle and it is held again, unless hotter candidates
fill the budget first; relocking cached pages reads nothing from disk,
waits for no pacing (``holder``) and, while the file is unwritten, hashes
nothing (``checksums.baseline``). If
the guest no longer uses it, the kernel evicts it under pressure and it
stays released. So a read-only hold behaves as a lease, renewed about every
40 s by probing the page cache; this trades a short unlocked window per
lease for never holding dead data for ever, and it is the price of a
residency signal we cannot read for held pages.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from vmdisktouch.core.runs import run_indices

DTYPE = np.float32
FLUSH_BELOW = 1e-20   # heat below this is set to 0 (no subnormals; far below any threshold)
SPARSE_RATIO = 4      # smooth only the reach of the evidence when it covers <= 1/4 of the map
TRUNCATE = 4.0        # Gaussian kernel radius in sigmas (gaussian_filter1d's default)


@dataclass(frozen=True)
class HeatParams:
    """Parameters of the heat map. Defaults live in ``vmdisktouch.settings``."""

    amp_resident: float      # A_r: heat of a wide fully resident region at steady state
    sigma_resident: float    # blocks; 0 = no smoothing
    amp_rewritten: float     # A_w: heat of a wide region rewritten every cycle
    sigma_rewritten: float   # blocks; 0 = no smoothing
    decay: float             # 1/s: heat relaxes with time constant 1/decay
    threshold: float         # heat at or above which blocks form candidate regions

    def __post_init__(self):
        for name in ("amp_resident", "sigma_resident", "amp_rewritten",
                     "sigma_rewritten", "decay", "threshold"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float, np.floating, np.integer)):
                raise ValueError(f"heat parameter {name} must be a number, not {v!r}")
            if not math.isfinite(v) or v < 0:
                raise ValueError(f"heat parameter {name} must be finite and >= 0, not {v!r}")
        if self.threshold <= 0:
            raise ValueError(f"heat parameter threshold must be > 0, not {self.threshold!r}")


@dataclass
class HeatState:
    """Per-block heat: two float32 components of equal length."""

    heat_resident: np.ndarray
    heat_rewritten: np.ndarray

    def __post_init__(self):
        self.heat_resident = np.asarray(self.heat_resident, dtype=DTYPE)
        self.heat_rewritten = np.asarray(self.heat_rewritten, dtype=DTYPE)
        if self.heat_resident.shape != self.heat_rewritten.shape or self.heat_resident.ndim != 1:
            raise ValueError("heat components must be 1-D arrays of the same length")

    @property
    def nblocks(self) -> int:
        return int(self.heat_resident.size)

    @property
    def total(self) -> np.ndarray:
        """Heat per block: resident plus rewritten component (a new float32 array)."""
        return self.heat_resident + self.heat_rewritten


def new_state(nblocks: int) -> HeatState:
    """A cold map of ``nblocks`` blocks."""
    n = _count(nblocks)
    return HeatState(np.zeros(n, DTYPE), np.zeros(n, DTYPE))


# Heat loaded from outside the cycle (a warm-restart state file, the summary a domain
# carries) is input like any other file: nothing stops it from being 3e38, which at the
# default decay keeps its blocks above the threshold for 15 minutes unread (10 days at the
# slowest decay). So a loaded block's heat is at most ``loaded_most``: the most reads can
# make (amp_resident + amp_rewritten: each component is a smoothed fraction, times its
# amplitude), or ``ARRIVAL_MAX`` x the threshold where that is more (what a domain's
# summary arrives at, ``domain_heat.arrival``). A block nobody reads then cools as a real
# hot block does. One rule (``cap_loaded``), applied where every load ends
# (``daemon.disk.Watcher.restore``).
ARRIVAL_MAX = 20.0     # x the threshold: the hottest carried region arrives at most at this
LOADED_SLACK = 1e-3    # float32 rounding above the most: not worth a warning


def loaded_most(params: HeatParams) -> float:
    """The most heat a loaded block may have (the comment above)."""
    return max(ARRIVAL_MAX * params.threshold, params.amp_resident + params.amp_rewritten)


def cap_loaded(state: HeatState, params: HeatParams) -> tuple[HeatState, int]:
    """``state`` with each block's heat at most ``loaded_most`` (both components scaled by
    the same factor, so their split is kept), and how many blocks were over it."""
    most = loaded_most(params)
    total = state.heat_resident.astype(np.float64) + state.heat_rewritten
    over = total > most * (1 + LOADED_SLACK)
    n = int(np.count_nonzero(over))
    if n == 0:
        return state, 0
    k = np.ones(total.size)
    k[over] = most / total[over]
    return HeatState((state.heat_resident * k).astype(DTYPE),
                     (state.heat_rewritten * k).astype(DTYPE)), n


def resize_state(state: HeatState, nblocks: int) -> HeatState:
    """The map of an image that grew or shrank: common prefix kept, new blocks cold."""
    n = _count(nblocks)
    keep = min(n, state.nblocks)
    out = new_state(n)
    out.heat_resident[:keep] = state.heat_resident[:keep]
    out.heat_rewritten[:keep] = state.heat_rewritten[:keep]
    return out


def gaussian_weights(sigma: float, truncate: float = TRUNCATE) -> np.ndarray:
    """One side ``w[0..r]`` of the unit-sum discrete Gaussian of ``gaussian_filter1d``.

    Same radius ``r = int(truncate * sigma + 0.5)`` and weights
    ``exp(-x^2 / 2 sigma^2)`` normalised so that ``w[0] + 2 * sum(w[1:]) == 1``.
    """
    r = int(truncate * float(sigma) + 0.5)
    x = np.arange(r + 1, dtype=np.float64)
    w = np.exp(-0.5 * (x / float(sigma)) ** 2) if r else np.ones(1)
    return w / (w[0] + 2.0 * w[1:].sum())


def smooth(evidence: np.ndarray, sigma: float, amp: float) -> np.ndarray:
    """``amp`` times the unit-sum Gaussian of width ``sigma`` (blocks) over ``evidence``.

    Equal (to float32 rounding) to ``amp * scipy.ndimage.gaussian_filter1d(
    evidence, sigma, mode="constant")``: outside the image is cold. It is
    computed as a symmetric sum of shifted copies, which is faster than
    ``gaussian_filter1d`` on float32 (docs/benchmarks.md, why-heat); the
    tests check the two agree. ``sigma == 0``: no
    smoothing. Returns a new float32 array.
    """
    x = np.asarray(evidence, dtype=DTYPE)
    n = x.size
    if sigma <= 0 or n == 0:
        return x * DTYPE(amp)
    w = (gaussian_weights(sigma) * amp).astype(DTYPE)
    r = w.size - 1
    if r == 0:
        return x * w[0]
    support = np.flatnonzero(x != 0)
    if support.size * (2 * r + 1) * SPARSE_RATIO <= n:
        # Sparse evidence: smooth only the blocks within r of it (exact, see _reach).
        out = np.zeros(n, DTYPE)
        if support.size:
            idx = _reach(support, r, n)
            out[idx] = _shifted_sum(x[idx], w)
        return out
    return _shifted_sum(x, w)


def _reach(support: np.ndarray, r: int, n: int) -> np.ndarray:
    """Sorted blocks within ``r`` of the sorted ``support``, clipped to ``[0, n)``.

    They form runs ``[s - r, s + r]`` merged where they overlap or touch.
    Laid end to end, each run keeps the ``r`` zero blocks of evidence next to
    its outermost evidence, so a Gaussian of radius ``r`` over the
    concatenation never reaches across from one run into the next: smoothing
    the gathered blocks gives exactly the full map's values there, and the
    full map is 0 everywhere else.
    """
    lo = np.maximum(support - r, 0)
    hi = np.minimum(support + r + 1, n)
    brk = np.flatnonzero(lo[1:] > hi[:-1]) + 1
    starts = lo[np.concatenate(([0], brk))]
    stops = hi[np.concatenate((brk - 1, [support.size - 1]))]
    return run_indices(starts, stops)


def _shifted_sum(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``sum_j w[|j|] * x[i + j]`` for ``|j| <= r``, zero beyond the ends (float32)."""
    n = x.size
    r = w.size - 1
    padded = np.zeros(n + 2 * r, DTYPE)
    padded[r:r + n] = x
    out = x * w[0]
    pair = np.empty(n, DTYPE)
    for j in range(1, r + 1):
        np.add(padded[r - j:r - j + n], padded[r + j:r + j + n], out=pair)
        pair *= w[j]
        out += pair
    return out


def decay_factor(decay: float, dt: float) -> float:
    """``k = exp(-decay * dt)``: the weight the old heat keeps over ``dt`` seconds."""
    return math.exp(-decay * dt)


def step(state: HeatState, resident_fraction, held_mask, rewritten_mask, dt: float,
         params: HeatParams) -> HeatState:
    """Fold one cycle's measurements into the heat map; returns a new state.

    ``resident_fraction``: per block, in [0, 1]. ``held_mask``: bool per block,
    the blocks the daemon holds (their residency is ignored), or None.
    ``rewritten_mask``: bool (or [0, 1]) per block rewritten since the last
    cycle, or None. ``dt``: seconds since the last step (>= 0).
    """
    n = state.nblocks
    if isinstance(dt, bool) or not isinstance(dt, (int, float, np.floating, np.integer)) \
            or not math.isfinite(dt) or dt < 0:
        raise ValueError(f"dt must be finite and >= 0, not {dt!r}")

    evidence = _per_block(resident_fraction, n, "resident_fraction")
    held = None if held_mask is None else _mask(held_mask, n, "held_mask")
    if held is not None and held.any():
        np.copyto(evidence, 0.0, where=held)

    k = decay_factor(params.decay, float(dt))
    heat_r = fold(state.heat_resident, evidence, params.sigma_resident,
                   params.amp_resident, k)

    if rewritten_mask is None:
        rewritten = None
    else:
        rewritten = _per_block(rewritten_mask, n, "rewritten_mask")
        if not rewritten.any():
            rewritten = None
    heat_w = fold(state.heat_rewritten, rewritten, params.sigma_rewritten,
                   params.amp_rewritten, k)
    return HeatState(heat_r, heat_w)


# -- helpers ---------------------------------------------------------------

def fold(old: np.ndarray, evidence, sigma: float, amp: float, k: float) -> np.ndarray:
    """``k * old + (1 - k) * smooth(evidence)``, float32, subnormals flushed."""
    if evidence is None or amp == 0 or k == 1.0:
        out = old * DTYPE(k)                       # no input: pure decay
    else:
        out = smooth(evidence, sigma, amp * (1.0 - k))
        out += DTYPE(k) * old
    np.multiply(out, out >= FLUSH_BELOW, out=out)   # branch-free flush
    return out


def _count(nblocks) -> int:
    if isinstance(nblocks, bool) or int(nblocks) != nblocks or nblocks < 0:
        raise ValueError(f"nblocks must be a whole number >= 0, not {nblocks!r}")
    return int(nblocks)


def _per_block(values, n: int, name: str) -> np.ndarray:
    """A new float32 per-block array in [0, 1] (NaN -> 0); the caller's is never modified."""
    a = np.array(values, dtype=DTYPE)          # always a copy
    if a.shape != (n,):
        raise ValueError(f"{name} has shape {a.shape}, expected ({n},)")
    np.copyto(a, 0.0, where=~(a >= 0))         # NaN, -inf and negatives
    np.minimum(a, 1.0, out=a)                  # +inf and above 1
    return a


def _mask(values, n: int, name: str) -> np.ndarray:
    a = np.asarray(values, dtype=bool)
    if a.shape != (n,):
        raise ValueError(f"{name} has shape {a.shape}, expected ({n},)")
    return a
