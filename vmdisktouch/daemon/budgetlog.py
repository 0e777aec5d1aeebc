"""The host's budget in the log: one line when it fills or frees, or its split changes.

A host of several disks logs its budget once when it starts holding, then
again only when the sum held moves by more than ``STEP`` (a tenth) of the
budget since the last line, or when one disk's part does (its split between
disks changed materially), in human sizes, naming each disk as the operator
knows it (``reasons.disk_name``). A steady host writes none: its disks'
5-minute summaries (``cyclelog``) are its only lines at info.
"""

from __future__ import annotations

import logging

from vmdisktouch.daemon.reasons import disk_name
from vmdisktouch.sizes import format_size

log = logging.getLogger("vmdisktouch")

STEP = 0.1      # of the budget: a change below it is not logged


class BudgetLog:
    """Remembers what the last budget line said."""

    def __init__(self):
        self.last: dict[str, int] | None = None     # disk name -> held bytes

    def note(self, watchers: list, budget: int, above_floor: int | None) -> bool:
        """Log the budget after a cycle when it moved enough; True when a line was written."""
        if len(watchers) < 2 or budget <= 0:
            return False
        now = {disk_name(w): w.holder.held_bytes() for w in watchers}
        total = sum(now.values())
        step = STEP * budget
        if self.last is None:
            if not total:
                return False
        elif (abs(total - sum(self.last.values())) <= step
              and all(abs(v - self.last.get(k, 0)) <= step for k, v in now.items())
              and all(k in now or v <= step for k, v in self.last.items())):
            return False
        self.last = now
        parts = ", ".join(f"{k} {format_size(v)}" for k, v in
                          sorted(now.items(), key=lambda kv: -kv[1]))
        floor = "" if above_floor is None else f"; {format_size(above_floor)} above the floor"
        log.info("budget: held %s of %s (%.0f%%): %s%s", format_size(total),
                 format_size(budget), 100.0 * total / budget, parts, floor)
        return True
