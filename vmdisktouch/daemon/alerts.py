"""The host's events an operator alerts on: one line when each starts, none while it lasts.

Each is a line at its own priority with a fixed ``MESSAGE_ID`` in the journal
(``adapters.systemd.journal``; docs/logging.md), written by ``Host.tick`` after every
cycle, whatever the host serves:

* the budget is full (notice, ``BUDGET_FULL``): the disks hold ``max_hold``, to
  within a block, and want more (the status's ``wanted_bytes`` above its
  ``held_bytes``). It is news once: said again only after the demand or the
  holding fell a tenth (``STEP``) below the budget, so a working set the size of
  the budget does not write a line a cycle;
* shedding under the floor (warning, ``FLOOR_SHED``): held memory was given back
  because MemAvailable fell under ``min_free``, with how much and from which
  disks (``floor_took``): what a holder shed (``Holder``: floor shedding), or what
  it released and could not take again because of the floor (a renewal whose
  reload the floor refused gives the memory back before any shedding is needed).
  The episode lasts while cycles give memory back or are held back by the floor
  (``reasons``: ``floor``); the next one is said again.

* the budget's verdict changed (notice, ``BUDGET_ADVICE``; ``core.advice``):
  a disk's share, or the host's ``max_hold``, is too small (its curve still
  climbs there), too large (flat well before it) or right, said once the new
  verdict has held ``VERDICT_CONFIRM_SECONDS`` and then not changed for
  ``VERDICT_HOLD_SECONDS`` unless the disk's share moved (``advice.Verdicts``);
  a disk whose curve is not evidence yet (``advice.evidence``) gets none. The
  host's verdict is made from the disks' said ones: a cycle never says two that
  contradict each other. One disk served: its line alone (the host's verdict is
  the same).

The budget full line says what the curves say of more memory (the host's
verdict said), not "raise max_hold" against a curve that says more would not
pay, and no size while no curve is evidence yet.

A disk dropped (``DISK_DROPPED``) is the fourth, logged where it happens
(``Host._drop``). A host-wide line carries a disk's fields only when the host
serves that one disk: the line is then about it.
"""

from __future__ import annotations

import logging
import time

from vmdisktouch.adapters.systemd import journal
from vmdisktouch.core import advice
from vmdisktouch.daemon.reasons import advice_said, disk_name
from vmdisktouch.sizes import format_size

log = logging.getLogger("vmdisktouch")

STEP = 0.1      # of the budget: how far below it a full budget must fall to be news again


class HostAlerts:
    """Remembers which events are going on."""

    def __init__(self, clock=time.monotonic):
        self.full = False
        self.shedding = False
        self.clock = clock                 # seconds: the verdicts' hysteresis
        self.verdicts: dict = {}           # image path -> its ``advice.Verdict`` said (or None)
        self.verdict: advice.Verdict | None = None     # the host budget's, from the disks'
        self._said = advice.Verdicts()

    def note(self, watchers: list, acted: list, budget: int, block_size: int) -> None:
        """After a cycle: the line of an event that starts now (``acted``: this cycle's
        (disk, report) pairs, a disk whose cycle failed left out)."""
        extra = _fields(watchers)
        self._advice(watchers, budget)
        self._budget(watchers, budget, block_size, extra)
        self._floor(acted, extra)

    def _advice(self, watchers: list, budget: int) -> None:
        allotted = [w for w in watchers if w.allotment is not None]
        changed, host = self._said.note(self.clock(), budget, [
            (w.image.path, w.allotment.share, verdict_wants(w)) for w in allotted])
        self.verdicts = {w.image.path: self._said.said.get(w.image.path) for w in allotted}
        self.verdict = self._said.host
        said = dict(changed)
        for w in allotted:
            v = said.get(w.image.path)
            if v is not None:
                a = w.allotment
                log.log(journal.NOTICE, "budget advice: %s: its share %s is %s (its curve "
                        "wants %s)", disk_name(w), format_size(a.share), advice_said(v.to_json()),
                        format_size(a.curve_wants),
                        extra=dict(journal.fields(w.image.path, w.domain, w.target),
                                   MESSAGE_ID=journal.BUDGET_ADVICE))
        v = host
        if v is not None and len(allotted) > 1:
            wanted = [x for x in map(verdict_wants, allotted) if x is not None]
            log.log(journal.NOTICE, "budget advice: max_hold %s is %s (the curves of %d of "
                    "%d disks want %s)", format_size(budget), advice_said(v.to_json()), len(wanted),
                    len(allotted), format_size(sum(wanted)),
                    extra={"MESSAGE_ID": journal.BUDGET_ADVICE})

    def _budget(self, watchers: list, budget: int, block_size: int, extra: dict) -> None:
        allotted = [w for w in watchers if w.allotment is not None]
        held = sum(w.holder.held_bytes() for w in allotted)
        wanted = sum(w.allotment.wanted for w in allotted)
        if not self.full and allotted and held + block_size > budget and wanted > held:
            self.full = True
            curves = any(getattr(w, "curve_evidence", lambda: None)() is not None
                         for w in allotted)
            v = self.verdict
            if not curves or (v is not None and v.verdict == advice.TOO_SMALL):
                more = "" if v is None else f": {format_size(v.bytes)} more would pay"
                text = (f", the {'disk wants' if len(watchers) == 1 else 'disks want'} "
                        f"{format_size(wanted)}: the hottest regions are held, the rest is "
                        f"not (raise max_hold to hold more{more})")
            elif v is None:
                text = (": the hottest regions are held; not enough reads yet to say "
                        "whether more memory would pay")
            else:
                text = (": the hottest regions are held; the curves say more memory would "
                        "not pay (max_hold is " + advice_said(v.to_json()) + ")")
            log.log(journal.NOTICE, "budget full: held %s of max_hold %s%s",
                    format_size(held), format_size(budget), text,
                    extra=dict(extra, MESSAGE_ID=journal.BUDGET_FULL))
        elif self.full and min(held, wanted) < (1 - STEP) * budget:
            self.full = False

    def _floor(self, acted: list, extra: dict) -> None:
        shed = [(w, floor_took(r)) for w, r in acted if floor_took(r)]
        if shed and not self.shedding:
            min_free = acted[0][0].config.min_free
            log.warning("MemAvailable fell under the floor (min_free %s): released %s held "
                        "(%s); MemAvailable now %s", format_size(min_free),
                        format_size(sum(n for _, n in shed)),
                        ", ".join(f"{disk_name(w)} {format_size(n)}" for w, n in shed),
                        format_size(min(r.mem_available_bytes for _, r in acted)),
                        extra=dict(extra, MESSAGE_ID=journal.FLOOR_SHED))
        self.shedding = bool(shed) or (self.shedding and any(
            r.limited_by == "floor" for _, r in acted))


def verdict_wants(w) -> int | None:
    """What disk ``w``'s curve wants, for its budget verdict: its ``curve_wants``, once the
    curve has enough reads to say a size (``advice.evidence``; a disk without a curve's
    figures, as a test's, is taken as it is); None before: no verdict."""
    ev = getattr(w, "curve_evidence", lambda: None)()
    return w.allotment.curve_wants if ev is None or ev["enough"] else None


def floor_took(r) -> int:
    """The bytes cycle report ``r`` gave back to the floor: shed, or released and not
    taken again while the floor held the disk back."""
    kept_back = r.released_bytes - r.loaded_bytes - r.shed_bytes
    return r.shed_bytes + (max(0, kept_back) if r.limited_by == "floor" else 0)


def _fields(watchers: list) -> dict:
    """The fields of the one disk served; none for several (the line is the host's)."""
    if len(watchers) != 1:
        return {}
    w = watchers[0]
    return journal.fields(w.image.path, w.domain, w.target)
