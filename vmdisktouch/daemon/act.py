"""Act: carry out a plan through the holder, recharging on the way.

Theory of operation
-------------------
``Recharger.act`` gives the plan's targets to the holder (``Holder.apply``:
release first, then load in priority order under the budget and the
floor). Held pages keep the memory cgroup that first faulted them in: a
block the guest had cached when the daemon locked it stays charged to the
guest's group, and locked there it can push a memory-limited VM into its
OOM killer. So, within the same cycle:

1. Held blocks charged to another limited group beyond its cap
   (``core/charges``: the cap; ``ChargeTracker``: the samples, one page in
   16 when a block is loaded) are dropped (``Holder.drop``: munlock,
   ``FADV_DONTNEED``, read back in the daemon's context) before ``apply``,
   which locks them again under the daemon's own charge. Quiet blocks go
   first, at most a cycle's worth of ``load_rate``.
2. Blocks ``apply`` just locked while another group pays for them are
   sampled at once, and those over a cap go straight back out and in again
   (a second round): the group never waits a cycle with more of its memory
   pinned than its cap.
3. What is still over a cap after its reload was faulted back by the guest
   between the drop and the reload: it is released, not dropped, and
   ceded to the guest's own cache (``policy.CEDE_SECONDS``).

The lock-limit refusal of ``apply`` is logged here, once per streak.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from vmdisktouch.core.policy import CEDE_SECONDS, Plan
from vmdisktouch.core.runs import Run, runs_to_mask
from vmdisktouch.sizes import format_size
from vmdisktouch.system.hold.holder import ApplyResult

log = logging.getLogger("vmdisktouch")


@dataclass(frozen=True)
class Acted:
    """What acting on a plan did."""
    result: ApplyResult          # the holder's loads, releases and skips (all rounds)
    held: np.ndarray             # per block: held now
    holes: list[Run]             # target blocks the holder found to be holes
    ceded: list[Run]             # blocks released to the guest's own cache
    released_bytes: int          # the holder's releases and the ceded bytes


class Recharger:
    """Applies plans through one holder; keeps held blocks within other groups' caps."""

    def __init__(self, holder, charges, path: str):
        self.holder = holder
        self.charges = charges           # ChargeTracker
        self.path = path
        self._lock_refused = False

    def act(self, plan: Plan, held_before: np.ndarray, now: float, config, *,
            holding: bool) -> Acted:
        """Apply ``plan``; ``config`` gives the recharge's pace and the groups' share."""
        n = held_before.size
        result: ApplyResult | None = None
        recharge: list[Run] = []
        holes: list[Run] = []
        before = held_before
        held = held_before
        for round_ in range(2):
            recharge = self._recharge(plan, config) if holding else []
            if round_ and not recharge:
                break
            before = before & ~runs_to_mask(recharge, n)
            step = self.holder.apply(plan.targets)
            result = step if result is None else result.plus(step)
            self._note_lock_refusal(step.lock_refused)
            holes.extend(self.holder.last_holes)
            held = runs_to_mask(self.holder.held_runs(), n)
            self.charges.update(self.holder, before, held, now)
            if not step.loaded_bytes:
                break
            before = held
        ceded: list[Run] = []
        released = result.released_bytes
        if result.loaded_bytes and holding:
            ceded, cede_bytes, held = self._cede(plan, held, now, config.foreign_share)
            released += cede_bytes
        elif recharge:                   # dropped after the last figures, nothing reloaded
            self.charges.recount(config.foreign_share)
        return Acted(result, held, holes, ceded, released)

    def _recharge(self, plan: Plan, config) -> list[Run]:
        """Drop the held blocks over another group's cap; ``apply`` reloads them."""
        rate = config.load_rate
        per_cycle = int(rate * config.interval) if rate else 256 << 20
        runs = self.charges.plan(plan.quiet, plan.heat, config.foreign_share, per_cycle)
        if runs:
            moved = self.holder.drop(runs)
            over = ", ".join(f"{c.group.path} (held {format_size(c.held)}, cap "
                             f"{format_size(c.cap or 0)})" for c in self.charges.last
                             if c.excess)
            log.info("%s: recharging %s held for memory cgroups over their cap: %s",
                     self.path, format_size(moved), over)
        return runs

    def _cede(self, plan: Plan, held: np.ndarray, now: float, share: float):
        """Release what is still over a cap right after its reload: the guest faulted it back.

        A page has one owner, whoever faults it first: a guest that reads a
        block again between its drop and the reload keeps it charged to its
        own group. Such blocks are released, not dropped, and the policy
        leaves them out of the selection for ``CEDE_SECONDS``: the guest's
        own cache keeps what it reads that often, and the daemon does not
        churn on it. Returns (runs ceded, bytes released, held now).
        """
        runs = self.charges.plan(plan.quiet, plan.heat, share, per_cycle=1 << 62, count=False)
        if not runs:
            return [], 0, held
        released = self.holder.release(runs)
        log.info("%s: %s the guest keeps re-reading stays its own cache (charged to its "
                 "memory cgroup), not held, for %gs", self.path, format_size(released),
                 CEDE_SECONDS)
        held = held & ~runs_to_mask(runs, held.size)
        self.charges.update(self.holder, held, held, now)
        self.charges.recount(share)      # the status shows what is held now, not before
        return runs, released, held

    def _note_lock_refusal(self, message: str | None) -> None:
        """One line when the lock limit starts refusing, one when loads go through again."""
        if message and not self._lock_refused:
            log.warning("%s: mlock refused after %s held: %s; holding at most that until a "
                        "reload", self.path, format_size(self.holder.held_bytes()), message)
        self._lock_refused = bool(message) or (self._lock_refused
                                               and self.holder.lock_cap is not None)

    def close(self) -> None:
        if self.charges.reader is not None:
            self.charges.reader.close()
