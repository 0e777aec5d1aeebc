"""The daemon's view of whose memory cgroup its held blocks are charged to.

Each held block is sampled once, right after it is loaded: its pages are
locked, so reclaim never takes them and their charge cannot change while
they stay held (a removed group's pages move to its parent: so every held
block is sampled again, a rotating share of them each cycle in proportion
to the time since the last, so each within ``RESAMPLE_SECONDS``, but never
more than ``RESAMPLE_MAX_BYTES`` (32 MiB) a cycle: beyond 384 MiB held at
5 s cycles a full pass takes longer, 16 GiB in about 43 minutes, which only
delays noticing a removed group's pages moved to its parent. Every cycle is
then equally cheap and the cost does not grow with what is held; sampling
a large hold at once made the daemon's slowest cycle, and larger shares
made its CPU grow with the bytes held (docs/benchmarks.md,
why-charge-tracker). A block is sampled
every ``STEP_PAGES``-th page through the holder's own mapping
(``memcg.MemcgReader.page_groups``: pagemap and kpagecgroup); it is
attributed to the foreign group (not the daemon's own) most of its samples
are charged to, with the bytes those samples stand for: a block half the
guest's and half the daemon's counts its guest half. The groups' limits and what reclaim cannot
take are read each cycle, for the few groups the held blocks are charged
to. The decision (cap, what to recharge) is ``charges``.
"""

from __future__ import annotations

import logging

import numpy as np

from vmdisktouch.core import charges
from vmdisktouch.system import libc
from vmdisktouch.core.charges import GroupCharge, GroupFigures

log = logging.getLogger("vmdisktouch")

STEP_PAGES = 16            # one sample per 64 KiB
CODES_KEPT = 1024          # group codes kept before the unused ones are dropped
RESAMPLE_SECONDS = 60.0
RESAMPLE_MAX_BYTES = 32 << 20      # per cycle (docs/benchmarks.md, why-charge-tracker)


class ChargeTracker:
    """Per-block charge of the held blocks, and the runs to recharge each cycle."""

    def __init__(self, reader, block_size: int, nblocks: int):
        self.reader = reader           # memcg.MemcgReader, or None when not available
        self.block_size = block_size
        # Per block, a code for its group (0: none foreign; ``_inos[code]`` is the group's
        # inode) and the bytes charged to it, 32 bits each: 8 bytes a block where the
        # inode and a count of 64 bits took 16 (half a MiB of a 64 GiB image). Made at the
        # first foreign charge seen: a disk that holds nothing of another group's (an idle
        # one, or on a host without memory groups) keeps none.
        self.nblocks = nblocks
        self.group = np.zeros(0, dtype=np.uint32)
        self.bytes = np.zeros(0, dtype=np.uint32 if block_size < 1 << 32 else np.uint64)
        self._inos: list[int] = [0]
        self._codes: dict[int, int] = {}
        self.recharged = 0             # bytes dropped to be reloaded under our charge
        self.last: list[GroupCharge] = []
        self._sampled_at: float | None = None
        self._cursor = 0               # the block the next rotating resample starts at
        own = reader.own() if reader is not None else None
        self.own_ino = own.ino if own is not None else 0

    @property
    def active(self) -> bool:
        return self.reader is not None

    @property
    def ino(self) -> np.ndarray:
        """Per block, the inode of the foreign group its bytes are charged to (0: none)."""
        return np.asarray(self._inos, dtype=np.uint64)[self.group]

    def _code(self, ino: int) -> int:
        code = self._codes.get(ino)
        if code is None:
            if len(self._inos) > CODES_KEPT:          # groups come and go on a host
                live = np.unique(self.group)
                inos = [self._inos[c] for c in live.tolist() if c]
                self.group = np.searchsorted(live, self.group).astype(np.uint32)
                if not live.size or live[0]:
                    self.group += 1                   # code 0 stays "none"
                self._inos = [0] + inos
                self._codes = {i: c for c, i in enumerate(self._inos) if c}
            code = self._codes[ino] = len(self._inos)
            self._inos.append(ino)
        return code

    def _made(self) -> None:
        if self.group.size != self.nblocks:
            self.group = np.zeros(self.nblocks, dtype=self.group.dtype)
            self.bytes = np.zeros(self.nblocks, dtype=self.bytes.dtype)

    def resize(self, nblocks: int) -> None:
        self.nblocks = nblocks
        if not self.group.size:
            return
        for name in ("group", "bytes"):
            old = getattr(self, name)
            new = np.zeros(nblocks, dtype=old.dtype)
            k = min(nblocks, old.size)
            new[:k] = old[:k]
            setattr(self, name, new)

    def update(self, holder, held_before: np.ndarray, held_now: np.ndarray, now: float) -> None:
        """Forget released blocks; sample the newly held ones (all of them now and then)."""
        if not self.active:
            return
        charged = np.flatnonzero(self.group)        # a few held blocks of a huge map
        gone = charged[~held_now[charged]]
        self.group[gone] = 0
        self.bytes[gone] = 0
        fresh = held_now & ~held_before
        if self._sampled_at is None or now < self._sampled_at:
            fresh = held_now
        else:
            self._resample_share(held_now, fresh, (now - self._sampled_at) / RESAMPLE_SECONDS)
        self._sampled_at = now
        if fresh.any():
            from vmdisktouch.core.regions import mask_runs
            for a, b, addr, length in holder.mappings(mask_runs(fresh)):
                self._sample(a, b, addr, length)

    def _resample_share(self, held: np.ndarray, fresh: np.ndarray, share: float) -> None:
        """Mark in ``fresh`` the next ``share`` of the held blocks, in turn from the cursor."""
        idx = np.flatnonzero(held)
        if not idx.size or share <= 0:
            return
        k = min(idx.size, int(np.ceil(idx.size * min(share, 1.0))),
                max(1, RESAMPLE_MAX_BYTES // self.block_size))
        start = int(np.searchsorted(idx, self._cursor))
        pick = idx[(start + np.arange(k)) % idx.size]
        fresh[pick] = True
        self._cursor = int(pick[-1]) + 1

    def _sample(self, a: int, b: int, addr: int, length: int) -> None:
        page = libc.PAGE_SIZE
        inos = self.reader.page_groups(addr, length, STEP_PAGES)
        per_block = max(1, self.block_size // (page * STEP_PAGES))
        nb = b - a
        padded = np.zeros(nb * per_block, dtype=np.uint64)
        padded[:min(inos.size, padded.size)] = inos[:padded.size]
        rows = padded.reshape(nb, per_block)
        for k in range(nb):
            row = rows[k][(rows[k] != 0) & (rows[k] != self.own_ino)]   # foreign charges only
            if not row.size:
                if self.group.size:
                    self.group[a + k], self.bytes[a + k] = 0, 0
                continue
            values, counts = np.unique(row, return_counts=True)
            top = int(np.argmax(counts))
            self._made()
            self.group[a + k] = self._code(int(values[top]))
            block_len = min(self.block_size, length - k * self.block_size)
            self.bytes[a + k] = int(block_len * counts[top] / per_block)

    def plan(self, quiet: np.ndarray, heat: np.ndarray, share: float,
             per_cycle: int, count: bool = True) -> list[tuple[int, int]]:
        """The runs over a cap to move now (``charges.to_recharge``); ``last`` keeps the figures.

        ``count``: they will be recharged (counted in ``recharged``), not just released.
        """
        if not self.active:
            return []
        if not self.group.any():                    # the common case: nothing foreign held
            self.last = []
            return []
        block_ino = self.ino
        groups = {}
        for ino in np.unique(block_ino[block_ino != 0]).tolist():
            g = self.reader.group(int(ino))
            if g is not None:
                pinned = (g.anon or 0) + (g.unevictable or 0)
                groups[int(ino)] = GroupFigures(g.ino, g.path, g.limit, pinned)
        self.last = charges.charges(block_ino, self.bytes, groups, self.own_ino, share)
        over = [c for c in self.last if c.excess > 0]
        if not over:
            return []
        runs = charges.to_recharge(block_ino, self.bytes, quiet, heat, over, per_cycle)
        if count:
            self.recharged += sum(int(self.bytes[a:b].sum()) for a, b in runs)
        return runs

    def recount(self, share: float) -> None:
        """``last`` after releases since it was read (``charges.recount``: no group read)."""
        if self.last:
            self.last = charges.recount(self.last, self.ino, self.bytes, share)

    def status(self) -> dict:
        """For the status JSON: held bytes per foreign group, their caps, what was recharged."""
        return {
            "available": self.active,
            "groups": [{"group": c.group.path, "limit_bytes": c.group.limit,
                        "held_bytes": c.held, "cap_bytes": c.cap, "at_limit": c.at_limit}
                       for c in self.last],
            "recharged_bytes": self.recharged,
        }
