"""Why a disk holds less than it wants: one reason of a small set, the same in every output.

A disk *wants* its candidate regions (the blocks above the threshold, and
held runs kept by hysteresis); the host's selection gives it a *share*
(``Allotment``); the holder then holds what it can of it. When it holds less
than it wants, the first of these that applies is the reason, as a code (the
status key ``limited_by``, the metrics) and a line for humans (the status key
``not_held_reason``, the cycle's log line):

=================  ==========================================================
code               when
=================  ==========================================================
``domain_off``     its libvirt domain is not running, or is arriving: nothing is held
``no_evidence``    no heat at all yet: the guest has not been seen to read it
``below_threshold``  heat, but nothing above the threshold
``budget``         the budget went to hotter regions (naming the disk given the most)
``cap``            its own cap (``[domain.x] cap``) is full
``weight``         the budget went elsewhere and its weight is below 1
``curve``          its share by the curves (``core.shares``) is full: memory saves more
                   reads elsewhere
``floor``          MemAvailable is at the free-memory floor (``min_free``)
``cgroup``         blocks its guest's memory cgroup keeps re-reading are left to it
``lock_limit``     the kernel refused to lock more (RLIMIT_MEMLOCK)
``not_loaded``     a load failed (a read or lock error); retried next cycle
=================  ==========================================================

The checks go in this order: the causes before the selection (off, no heat),
then the holder's (floor, cgroup, lock limit, a failed load: what it was given
and could not hold), then the selection's (cap, weight, budget: what it wanted
and was not given).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from vmdisktouch.report import CODES  # noqa: F401  (the codes given here, listed there)
from vmdisktouch.sizes import format_size
from vmdisktouch.core.advice import TOO_LARGE, TOO_SMALL
from vmdisktouch.core.shares import SLICES


@dataclass(frozen=True)
class Allotment:
    """What the last selection gave one disk (``budget.Allocation``), in bytes."""
    share: int                   # given, plus the free budget it could still take
    wanted: int                  # its candidate regions, no more than its curve's wants
    limit: str | None            # "budget", "cap", "weight" or "curve" when it got less
    top: str | None              # limited by the budget: the disk given the most
    budget: int                  # the host's whole budget
    cap: int | None = None       # its own cap (overrides), if any
    weight: float = 1.0          # its ranking weight (overrides)
    curve_wants: int | None = None   # what its curve says still pays (``mrc.wants``), once
                                     # the curve is evidence (``DiskWatcher.curve_wants``)


def disk_name(w) -> str:
    """A disk as the operator knows it: ``domain/target`` under libvirt, else its path."""
    return f"{w.domain}/{w.target}" if w.domain else w.image.path


@dataclass(frozen=True)
class Facts:
    """What the cycle saw that the reasons need, besides its report."""
    holding: bool                # its domain runs (or it has none)
    allotment: Allotment | None  # None: no selection yet
    heat_max: Callable[[], float]  # the hottest block's heat (a pass over the map: only
                                 # asked when nothing is wanted)
    threshold: float
    lock_refused: str | None     # the kernel's refusal to lock, if any
    ceded_bytes: int = 0         # left to the guest's own cgroup-limited cache now
    arriving: bool = False       # not holding while its domain runs: it is arriving


def _holder_reason(r, c, f: Facts) -> tuple[str, str] | None:
    """The holder's part: what stopped it holding what the selection gave."""
    if r.skipped_bytes and r.mem_available_bytes < c.min_free + c.block_size:
        return "floor", (f"MemAvailable {format_size(r.mem_available_bytes)} is at the "
                         f"free-memory floor (min_free {format_size(c.min_free)})")
    if f.ceded_bytes:
        return "cgroup", (f"{format_size(f.ceded_bytes)} its memory cgroup keeps re-reading "
                          "is left to the guest's own cache")
    if f.lock_refused:
        return "lock_limit", f"the kernel refused to lock more ({f.lock_refused})"
    if r.skipped_bytes:
        return "not_loaded", (f"{format_size(r.skipped_bytes)} targeted was not loaded "
                              "(a lock or read error)")
    return None


def why_not_held(r, c, f: Facts) -> tuple[str, str] | None:
    """(code, line): why cycle report ``r`` (settings ``c``) holds less than the disk
    wants; None when it holds all it wants."""
    a = f.allotment
    if not f.holding:
        if f.arriving:
            return "domain_off", ("its libvirt domain is arriving: nothing is held until "
                                  "QEMU has activated its disks")
        return "domain_off", "its libvirt domain is not running"
    if a is not None and a.wanted == 0 and not r.held_bytes:
        hottest = f.heat_max()
        if hottest <= 0:
            return "no_evidence", "no evidence of use yet"
        return "below_threshold", (f"nothing is above the threshold {f.threshold:g} (the "
                                   f"hottest block has {share_of(hottest, f.threshold)} of it)")
    holder = _holder_reason(r, c, f)
    if holder is not None:
        return holder
    if a is not None and a.limit == "cap" and r.held_bytes < a.wanted:
        return "cap", f"its cap ({format_size(a.cap or 0)}) is full"
    if a is not None and a.limit == "weight" and r.held_bytes < a.wanted:
        return "weight", (f"the host budget went to hotter disks (weight {a.weight:g}"
                          + (f"; most to {a.top})" if a.top else ")"))
    if a is not None and a.limit == "curve" and r.held_bytes < a.wanted:
        # within one of the split's slices of it: the split's resolution
        if a.curve_wants is not None and r.held_bytes + a.budget // SLICES >= a.curve_wants:
            return "curve", (f"its curve says more would not pay (it wants "
                             f"{format_size(a.curve_wants)})")
        return "curve", ("its share of the host budget by the curves is full: memory saves "
                         "more reads elsewhere" + (f" (most to {a.top})" if a.top else ""))
    if a is not None and a.limit == "budget" and r.held_bytes < a.wanted:
        if a.top:
            return "budget", f"the host budget went to hotter disks (most to {a.top})"
        return "budget", (f"the budget ({format_size(a.budget)}) is full of regions at least "
                          "as hot")
    return None


def advice_said(v: dict) -> str:
    """A budget's verdict (``core.advice``, as the status has it) in words, as ``status``
    and the journal say it: "too small: 1.2G more would pay"."""
    n = format_size(int(v.get("bytes") or 0))
    return {TOO_SMALL: f"too small: {n} more would pay",
            TOO_LARGE: f"too large: {n} of it buys almost nothing"}.get(v.get("verdict"),
                                                                        "right")


def share_of(heat: float, threshold: float) -> str:
    """``60 %``, ``under 1 %``: a heat below the threshold as its share of it, because a
    decayed heat printed as such read ``8.22e-15``."""
    pct = 100 * heat / threshold
    return f"{pct:.0f} %" if pct >= 1 else "under 1 %"
