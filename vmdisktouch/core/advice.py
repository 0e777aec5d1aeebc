"""Whether a served disk's memory, and the host's budget, is too small, too large or right.

Theory of operation
-------------------
Pure core. A disk's miss-ratio curve (``core.mrc``) says what it still
wants: ``wants``, the size past which one GiB more would serve less than 2 %
more of its reads (``MissRatioCurve.wants``). Its share of the budget is what
the last selection gave it, plus the free budget it could still take
(``reasons.Allotment.share``). Read against each other, with a margin of
``SLACK`` of the larger and at least one of the split's slices (the curves'
own grain: ``shares.SLICES``):

* ``too_small``: it wants more than its share: its curve still climbs there,
  and memory given to it would serve more of its reads;
* ``too_large``: its share is more than it wants: its curve is flat past what
  it wants, and the rest of its share buys almost nothing;
* ``right``: the two agree.

A disk whose curve has not yet seen its reads come back (young, or the
mincore source, which has no curve) gets no verdict: a young curve looks flat
past its age and would call every budget too large.

A curve is evidence once it stands on enough reads (``evidence``): it has
watched ``CURVE_MIN_SECONDS`` at least and seen ``CURVE_MIN_REREADS``
re-reads, and it has seen the reuse of what it read (at most
``CURVE_MAX_UNSEEN`` of its reads first reads not read again yet) or watched
``CURVE_SETTLED_SECONDS``, its half-life. Before, it says "not enough reads
yet", with at most how long to watch, and no size: a curve of a few seconds
wanted the whole image, and a young one counts every first read a miss, so
its wants crept from 9M to 50M over ten minutes of a steady guest.
``advise`` holds its one look to a smaller minimum of the same rule
(``ADVISE``: ``ADVISE_MIN_SECONDS``, ``ADVISE_MIN_REREADS``, no settling)
and one more: the size it says must have been seen read again
(``ADVISE_COVER`` re-reads per page of it). Its curve is the window's steady
state (``core.mrc``: the window's first reads censored, not counted as
misses), so it need not wait for every first read to come back, and no budget
is moved by it every cycle; but a large hot set read once in the window is
not seen yet (docs/benchmarks/advise.md#advise-window).

The verdicts said are steady (``Verdicts``): a curve read every cycle moves
with its sampling noise, and a share at the edge of its margin gave "too
small", "too large" and "right" within seconds. A disk's new verdict is said
once every cycle has given it for ``VERDICT_CONFIRM_SECONDS`` (and
``HOLD_CYCLES`` cycles), and a verdict said stands ``VERDICT_HOLD_SECONDS``
at least, unless its share moved past the margin (a new ``max_hold``, a
disk added or gone: the evidence changed, not the noise). The host's verdict
is made from the disks' verdicts said (``host_of``), never from the cycle's
raw ones, so the host's line and a disk's agree in every cycle: ``too_small``
when a disk is (the sum of what those disks want past their shares would
pay); ``too_large`` when every disk has a verdict, none is too small and one
is too large; ``right`` when every disk is right; else none yet.
"""

from __future__ import annotations

from dataclasses import dataclass

from vmdisktouch.core.rules import (ADVISE_COVER, ADVISE_MIN_REREADS, ADVISE_MIN_SECONDS, CURVE_MAX_UNSEEN,
                                   CURVE_MIN_REREADS, CURVE_MIN_SECONDS, CURVE_SETTLED_SECONDS,
                                   VERDICT_CONFIRM_SECONDS, VERDICT_HOLD_SECONDS)
from vmdisktouch.core.shares import SLICES

TOO_SMALL, TOO_LARGE, RIGHT = "too_small", "too_large", "right"
SLACK = 0.125        # of the larger of the two sizes: within it, they agree
HOLD_CYCLES = 3      # cycles a new verdict must hold before it is said


@dataclass(frozen=True)
class Verdict:
    """One verdict, and the bytes it is about: what more would pay (``too_small``), or
    what is not wanted (``too_large``); 0 for ``right``."""
    verdict: str
    bytes: int

    def to_json(self) -> dict:
        return {"verdict": self.verdict, "bytes": int(self.bytes)}


def margin(a: int, b: int, budget: int) -> int:
    """How far two sizes may differ and still agree: ``SLACK`` of the larger, at least one
    of the split's slices of ``budget``."""
    return max(int(SLACK * max(a, b)), budget // SLICES, 1)


def disk_verdict(share: int, wants: int | None, budget: int) -> Verdict | None:
    """A disk's verdict: its ``share`` of the ``budget`` against what its curve ``wants``
    (None: a curve that is not evidence, or none: no verdict)."""
    if wants is None:
        return None
    slack = margin(share, wants, budget)
    if wants > share + slack:
        return Verdict(TOO_SMALL, wants - share)
    if share > wants + slack:
        return Verdict(TOO_LARGE, share - wants)
    return Verdict(RIGHT, 0)


@dataclass(frozen=True)
class Minimum:
    """What a curve must stand on before it says a size: ``seconds`` watched, ``re_reads``
    seen, ``cover`` re-reads per page of the size it says (the size's own pages seen read
    again), and (``settle``) its first reads read again or ``CURVE_SETTLED_SECONDS``."""
    seconds: float
    re_reads: float
    settle: bool
    cover: float = 0.0

    def to_json(self) -> dict:
        return {"window_seconds": self.seconds, "re_reads": int(self.re_reads),
                "re_reads_per_page_advised": self.cover}


SERVED = Minimum(CURVE_MIN_SECONDS, CURVE_MIN_REREADS, True)     # the daemon's, every cycle
ADVISE = Minimum(ADVISE_MIN_SECONDS, ADVISE_MIN_REREADS, False,  # advise's one look
                 ADVISE_COVER)


def evidence(reads: float, re_reads: float, window_seconds: float,
             minimum: Minimum = SERVED, size_pages: float = 0.0) -> dict:
    """What a curve stands on (``reads``, the ``re_reads`` among them, the
    ``window_seconds`` it has watched), and whether it is enough to say a size of
    ``size_pages`` (``enough``: ``minimum`` met; module docstring); else ``wait_seconds``,
    how much longer to watch at the re-reads' rate so far (None: no re-read seen yet,
    nothing to tell by)."""
    window = max(0.0, float(window_seconds))
    unseen = 1.0 - re_reads / reads if reads > 0 else 1.0
    settled = (not minimum.settle or unseen <= CURVE_MAX_UNSEEN
               or window >= CURVE_SETTLED_SECONDS)
    needed = max(minimum.re_reads, minimum.cover * max(0.0, float(size_pages)))
    enough = window >= minimum.seconds and re_reads >= needed and settled
    wait = None
    if not enough and re_reads > 0:
        rate = re_reads / window if window > 0 else 0.0
        wait = max(minimum.seconds - window,
                   (needed - re_reads) / rate if rate > 0 else 0.0,
                   0.0 if settled else CURVE_SETTLED_SECONDS - window, 0.0)
    return {"reads": int(round(reads)), "re_reads": int(round(re_reads)),
            "window_seconds": round(window, 1), "enough": bool(enough),
            "wait_seconds": 0 if enough else None if wait is None else int(-(-wait // 1)),
            "minimum": {**minimum.to_json(), "re_reads": int(round(needed))}}


def of_curve(mrc, minimum: Minimum = SERVED, size_pages: float = 0.0) -> dict:
    """``evidence`` of a miss-ratio curve (``core.mrc.MissRatioCurve``): the reads it has
    seen (decayed, as its histogram), the re-reads among them within its window, and the
    seconds it has watched."""
    return evidence(mrc.reads, mrc.re_reads, mrc.age, minimum, size_pages)


def not_enough(ev: dict | None) -> str:
    """A curve that is not evidence yet, in words: "not enough reads yet: watch for 40 s
    more" (docs/status.md, "Confidence")."""
    wait = None if ev is None else ev.get("wait_seconds")
    return "not enough reads yet" + ("" if wait is None else f": watch for {wait} s more")


def host_verdict(disks: list[tuple[int, int | None]], budget: int) -> Verdict | None:
    """The budget's verdict from every disk's (share, wants) this cycle, each taken as said
    (``host_of``)."""
    return host_of([disk_verdict(s, w, budget) for s, w in disks],
                   [w for _, w in disks], budget)


def host_of(verdicts: list[Verdict | None], wants: list[int | None],
            budget: int) -> Verdict | None:
    """The budget's verdict from the disks' (module docstring): it never contradicts one of
    them; None while no disk has one, or one has none and none is too small."""
    if all(v is None for v in verdicts):
        return None
    short = sum(v.bytes for v in verdicts if v is not None and v.verdict == TOO_SMALL)
    if short:
        return Verdict(TOO_SMALL, short)
    if any(v is None for v in verdicts):
        return None
    over = [v.bytes for v in verdicts if v.verdict == TOO_LARGE]
    if over:
        unwanted = budget - sum(w for w in wants if w is not None)
        return Verdict(TOO_LARGE, unwanted if unwanted > 0 else max(over))
    return Verdict(RIGHT, 0)


class Verdicts:
    """The verdicts said, disk by disk, and the host's made from them (module docstring).
    ``note`` takes a cycle's (key, share, wants) of every disk; ``said`` and ``host`` are
    what the status shows, ``changed`` what the cycle has to say."""

    def __init__(self):
        self.said: dict = {}          # key -> the Verdict said (its bytes this cycle's)
        self.host: Verdict | None = None
        self._at: dict = {}           # key -> (time said, share then)
        self._new: dict = {}          # key -> (verdict name, since, cycles): a candidate

    def note(self, now: float, budget: int,
             disks: list[tuple[object, int, int | None]]) -> tuple[list, Verdict | None]:
        """One cycle at time ``now`` (seconds): ([(key, Verdict)] newly said, the host's
        Verdict when it changed, else None)."""
        keys = {k for k, _, _ in disks}
        for d in (self.said, self._at, self._new):
            for k in [k for k in d if k not in keys]:
                del d[k]
        changed = []
        for key, share, wants in disks:
            v = disk_verdict(share, wants, budget)
            said = self.said.get(key)
            if v is None or (said is not None and v.verdict == said.verdict):
                self._new.pop(key, None)
                if v is not None:
                    self.said[key] = v             # the same verdict: its bytes now
                continue
            name, since, n = self._new.get(key, (None, now, 0))
            if name != v.verdict:
                since, n = now, 0
            self._new[key] = (v.verdict, since, n + 1)
            if now - since < VERDICT_CONFIRM_SECONDS or n + 1 < HOLD_CYCLES:
                continue
            if said is not None:
                at, then = self._at[key]
                if now - at < VERDICT_HOLD_SECONDS and \
                        abs(share - then) <= margin(share, then, budget):
                    continue
            self.said[key], self._at[key] = v, (now, share)
            del self._new[key]
            changed.append((key, v))
        host = host_of([self.said.get(k) for k, _, _ in disks], [w for _, _, w in disks],
                       budget)
        was, self.host = self.host, host
        news = host is not None and (was is None or was.verdict != host.verdict)
        return changed, host if news else None
