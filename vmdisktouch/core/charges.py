"""Whose memory the held pages are: the cap on other groups' pages, and what to recharge.

Theory of operation
-------------------
The page cache is charged to the memory cgroup of the process that first
faulted each page in, and ``mlock`` by another process does not move the
charge (Documentation/admin-guide/cgroup-v2.rst, "Memory Ownership": "A
memory area is charged to the cgroup which instantiated it and stays
charged to the cgroup until the area is released"). When the daemon locks
pages a VM's QEMU read, they stay charged to the VM's group and become
unevictable there: where that group has a limit (libvirt
``<memtune><hard_limit>``, ``MemoryMax=`` on machine.slice, a KubeVirt pod),
the daemon shrinks the memory the VM can use, and the group's OOM killer
ends up choosing QEMU (docs/benchmarks.md, why-charges and cgroup).

The rule, per memory cgroup ``G`` other than the daemon's own, with an
effective limit ``L`` (its own or an ancestor's), ``P`` bytes of it that
reclaim cannot take (anonymous memory and unevictable pages, from
``memory.stat``; page cache that reclaim can take does not count: a busy
group's cache always fills it to its limit) and ``H`` bytes held by the
daemon while charged to ``G``::

    cap(G) = min(share * L, L - (P - H) - reserve(L))      (never below 0)

``share`` is the setting ``foreign_share`` (default 0.1): the VM may grow
its own memory to ``1 - share`` of its limit without meeting a page it
cannot reclaim. The second term is the group's free headroom: as the VM's
own use ``P - H`` grows, the cap shrinks with it, so the daemon gives the
group back what it needs (``reserve`` keeps ``RESERVE_FRACTION`` of the
limit free for the kernel to reclaim into: docs/rationale.md#reserve-fraction).
A group whose headroom ``L - P`` is under ``AT_LIMIT_FRACTION`` of its limit
is at its limit: its cap is 0 (docs/rationale.md#at-limit-fraction). ``share = 1`` disables the cap
(the behaviour before this module). Unlimited groups and the daemon's own
group have no cap.

Held bytes over a group's cap are *recharged*: released, dropped from the
page cache (``POSIX_FADV_DONTNEED``; the kernel drops only pages nothing
else maps) and loaded again through the daemon's own mapping, which
charges them to the daemon's group. The holder loads them like any other
target, paced and above the free-memory floor; it costs one re-read of
what moves. Quiet blocks go first (no rewrite in the last cycles), at most
``per_cycle`` bytes a cycle, except when the group is at its limit: then
all the excess moves at once, because the VM needs the memory now.

A guest that reads a block again between its drop and the reload faults it
back in charged to its own group (a page has one owner: whoever faults it
first). What is still over the cap right after the reload is released,
not dropped, and left out of the selection for ``policy.CEDE_SECONDS``: the
guest's own cache keeps what it reads that often, where it is charged
anyway (docs/rationale.md#cede-seconds).

Everything here is pure: the charges of the held blocks and the groups'
figures come in (``memcg`` reads them; the daemon samples each block once,
when it is loaded, since a locked page is never evicted and so never
changes hands), the runs to recharge come out.

Overshoot: how far past its cap a group can be, and for how long
------------------------------------------------------------------
Whose a page is can only be read once the daemon has it mapped and
faulted in, that is once it is locked: so a block the guest has cached is
pinned in the guest's group from its ``mlock`` until the daemon samples it
(after ``Holder.apply``) and drops or releases it (the next round of
``Recharger.act``, or its cede step). Such blocks are the ones held for
the first time and the ones the guest read again between a recharge's
drop and reload. Measured (kernel 6.18, cgroup v1, a 64 MiB zone cached
by a guest limited to 256 MiB, cap 25.6 MiB): the group's unevictable rose
to 64 MiB for about 20 ms in the first cycle, then stayed at 25 MiB; a
probe reading ``memory.stat`` every 0.5 s catches such a window now and
then (it caught 29 MiB once). The bound, per group ``G``:

* Bytes: the cap, plus what one ``apply`` newly locks of the pages ``G``
  has cached. Not ``load_rate x interval``: cached pages are neither read
  nor paced (``holder``), so a first cycle may pin all of a guest's cached
  hot zone, up to ``max_hold``, for the window below.
* Time: from the lock to the end of that ``apply`` (its paced reads from
  disk after the block: bytes read / ``load_rate``, at most ``max_hold /
  load_rate`` at a cold start), one sample pass (``charge_tracker``:
  22-25 ms per GiB) and the drop. Never past the cycle: at the end of an
  ``act`` that loaded anything, every group is within its cap in the
  samples' estimate, since the cede step (``to_recharge`` unpaced) takes
  whole blocks until it is. When nothing could be loaded (the floor), the
  drop still released what ``to_recharge`` chose: the excess shrinks by
  ``per_cycle`` a cycle over all groups, all of it for a group at its limit.
* Precision: the estimate counts one page in ``STEP_PAGES`` (16) of each
  block: what the guest cached in aligned 64 KiB units is counted exactly,
  longer runs within 64 KiB at each end, scattered 4 KiB pages within the
  binomial error of 16 samples a block.

The figures the status shows (``last``) were read before the drop and the
cede; ``recount`` counts them again after, so the status no longer shows a
group over its cap for a cycle that brought it back within.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from vmdisktouch.core.rules import AT_LIMIT_FRACTION, RESERVE_FRACTION
from vmdisktouch.core.runs import Run, consecutive_runs


@dataclass(frozen=True)
class GroupFigures:
    """One memory cgroup as the cap needs it (bytes; ``limit`` None = unlimited)."""
    ino: int
    path: str
    limit: int | None
    pinned: int          # what reclaim cannot take: anonymous + unevictable


@dataclass(frozen=True)
class GroupCharge:
    """What the daemon holds charged to one foreign group, and its cap."""
    group: GroupFigures
    held: int
    cap: int | None          # None: no cap (unlimited, or share 1)
    at_limit: bool

    @property
    def excess(self) -> int:
        return 0 if self.cap is None else max(self.held - self.cap, 0)


def at_limit(g: GroupFigures) -> bool:
    return g.limit is not None and g.limit - g.pinned < g.limit * AT_LIMIT_FRACTION


def cap(g: GroupFigures, held: int, share: float) -> int | None:
    """The rule above; None when ``g`` has no limit or the cap is off (share >= 1)."""
    if g.limit is None or share >= 1.0:
        return None
    if at_limit(g):
        return 0
    headroom = g.limit - (g.pinned - held) - int(g.limit * RESERVE_FRACTION)
    return max(0, min(int(share * g.limit), headroom))


def charges(block_ino: np.ndarray, block_bytes: np.ndarray, groups: dict[int, GroupFigures],
            own_ino: int, share: float) -> list[GroupCharge]:
    """Per foreign group: the bytes held charged to it (estimated per block) and its cap.

    ``block_ino[i]``: the group held block ``i`` is (mostly) charged to, 0
    for no block or an unknown charge; ``block_bytes[i]``: how many of its
    bytes are charged there. Groups that ``groups`` does not know (removed)
    are left out: their pages were reparented and are sampled again.
    """
    out = []
    for ino in np.unique(block_ino[block_ino != 0]).tolist():
        g = groups.get(int(ino))
        if g is None or ino == own_ino:
            continue
        held = int(block_bytes[block_ino == ino].sum())
        out.append(GroupCharge(g, held, cap(g, held, share), at_limit(g)))
    return out


def recount(last: list[GroupCharge], block_ino: np.ndarray, block_bytes: np.ndarray,
            share: float) -> list[GroupCharge]:
    """``last`` (``charges``) after held blocks were released: the held bytes counted again.

    What each group pins of its own (``pinned - held``) is as it was read;
    only what the daemon holds there moved, so no group is read again (a
    ``memory.stat`` read right after an ``munlock`` may not show it yet).
    Groups the daemon no longer holds anything of are left out, as in ``charges``.
    """
    out = []
    for c in last:
        held = int(block_bytes[block_ino == c.group.ino].sum())
        if held:
            g = replace(c.group, pinned=max(0, c.group.pinned - c.held + held))
            out.append(GroupCharge(g, held, cap(g, held, share), at_limit(g)))
    return out


def to_recharge(block_ino: np.ndarray, block_bytes: np.ndarray, quiet: np.ndarray,
                heat: np.ndarray, over: list[GroupCharge], per_cycle: int) -> list[Run]:
    """Block runs to move to the daemon's group now: quiet and cool ones first.

    For each group over its cap, its blocks in order (quiet before rewritten,
    then coolest first) until its excess is covered; at most ``per_cycle``
    bytes over all groups, unless the group is at its limit.
    """
    chosen: list[int] = []
    spent = 0
    for c in sorted(over, key=lambda c: not c.at_limit):       # groups at the limit first
        need = c.excess
        if need <= 0:
            continue
        blocks = np.flatnonzero(block_ino == c.group.ino)
        order = np.lexsort((heat[blocks], ~quiet[blocks]))
        for b in blocks[order].tolist():
            if need <= 0 or (spent >= per_cycle and not c.at_limit):
                break
            chosen.append(b)
            need -= int(block_bytes[b])
            spent += int(block_bytes[b])
    if not chosen:
        return []
    return consecutive_runs(np.unique(np.asarray(chosen, dtype=np.intp)))
