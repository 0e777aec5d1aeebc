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

The host's budget is ``too_small`` when a disk is: the sum of what those
disks want past their shares would still pay; ``too_large`` when every disk
has a verdict and what they all want together leaves more than the margin of
the budget unwanted; else ``right``. ``Steady`` tells a verdict worth saying
(``daemon.alerts`` says it): once it has held ``HOLD_CYCLES`` cycles, so a
curve that wavers at the edge writes no line a cycle.
"""

from __future__ import annotations

from dataclasses import dataclass

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


def host_verdict(disks: list[tuple[int, int | None]], budget: int) -> Verdict | None:
    """The budget's verdict from every disk's (share, wants) (module docstring); None when
    no disk has a verdict."""
    verdicts = [disk_verdict(s, w, budget) for s, w in disks]
    if all(v is None for v in verdicts):
        return None
    short = sum(v.bytes for v in verdicts if v is not None and v.verdict == TOO_SMALL)
    if short:
        return Verdict(TOO_SMALL, short)
    wanted = sum(w for _, w in disks if w is not None)
    if all(v is not None for v in verdicts) and budget > wanted + margin(budget, wanted, budget):
        return Verdict(TOO_LARGE, budget - wanted)
    return Verdict(RIGHT, 0)


class Steady:
    """A verdict said once it held ``HOLD_CYCLES`` cycles in a row (per key: a disk, or the
    host): ``note`` returns the new verdict to say, else None."""

    def __init__(self):
        self.said: dict = {}          # key -> the verdict last said (its name)
        self._seen: dict = {}         # key -> (verdict name, cycles in a row)

    def note(self, key, v: Verdict | None) -> Verdict | None:
        name = None if v is None else v.verdict
        last, n = self._seen.get(key, (None, 0))
        n = n + 1 if name == last else 1
        self._seen[key] = (name, n)
        if name is None or name == self.said.get(key) or n < HOLD_CYCLES:
            return None
        self.said[key] = name
        return v

    def forget(self, keys) -> None:
        """Drop the keys not in ``keys`` (disks no longer served)."""
        for d in (self.said, self._seen):
            for k in [k for k in d if k not in keys]:
                del d[k]
