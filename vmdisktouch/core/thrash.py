"""Thrash: how much each block would refault if the daemon did not hold it (trace source).

Theory of operation
-------------------
Pure core (numpy only). A page the kernel adds back to the cache soon after
it deleted it is a refault (``core.access``): the guest needed a page its
cache had just lost. Per block, ``share`` is the decaying mean (folded like
the heat) of the share of its pages that refaulted each cycle, and ``rate``
the decaying mean of the read events that touched it, held blocks included.

A held block cannot refault, so its own share says nothing while it is held.
Its thrash is instead estimated from its reads: the unheld blocks that
thrash refault ``ratio`` = (sum of their shares) / (sum of their read rates)
per read, and a held block read ``rate`` times a cycle would refault about
``ratio * rate`` if it were let go. While no unheld block thrashes (the
daemon holds all of what did) the last ratio is kept, decaying like the
heat, so the thrash fades if it does not come back. Held and unheld blocks are so compared
on one scale, the expected refaults, and the part of a thrashing hot set
that is read most wins the hold and keeps it: when a hot set twice the
budget thrashes, every block of it is read and refaults every cycle, and
only the intensities tell its hotter part (three reads in four) from the
rest. (An earlier design froze a held block's share at its value when it
was taken, which was about nothing when it had been taken on reads before
the cache began to thrash; the colder part, left refaulting, then took the
hold.) A challenger's share counts ``1 - MARGIN`` of itself, so a hot set
read alike all over is not swapped back and forth
(docs/rationale.md#thrash-margin).

``multiplier`` is the ranking's factor per block, ``1 + WEIGHT * thrash``
(docs/rationale.md#thrash-weight); ``thrashing`` the blocks shown and
reported: not held, share at least ``SHOWN`` (one stray refault,
readahead's pages read back after their eviction, is not:
docs/rationale.md#thrash-shown). ``WEIGHT``, ``MARGIN`` and ``SHOWN`` are
``core.rules``' ``THRASH_*``.
"""

from __future__ import annotations

import numpy as np

from vmdisktouch.core import heat
from vmdisktouch.core.rules import THRASH_MARGIN as MARGIN
from vmdisktouch.core.rules import THRASH_SHOWN as SHOWN
from vmdisktouch.core.rules import THRASH_WEIGHT as WEIGHT
from vmdisktouch.core.sparse import Sparse


class Thrash:
    """Per block: the refault share and the read rate, both decaying."""

    def __init__(self, nblocks: int):
        self.share = np.zeros(int(nblocks), dtype=np.float32)
        self.rate = np.zeros(int(nblocks), dtype=np.float32)
        self.ratio = 0.0      # refault share per read event of the unheld thrashing blocks

    def resize(self, nblocks: int) -> None:
        for name in ("share", "rate"):
            old = getattr(self, name)
            new = np.zeros(int(nblocks), dtype=np.float32)
            k = min(old.size, new.size)
            new[:k] = old[:k]
            setattr(self, name, new)

    def fold(self, refaults: Sparse, reads: Sparse, held: np.ndarray, k: float) -> None:
        """One cycle: ``k`` the decay factor over it; ``reads``: read events per block."""
        k = np.float32(k)
        share = self.share * k
        share[refaults.blocks] += (np.float32(1) - k) * refaults.values
        share[share < heat.FLUSH_BELOW] = 0
        self.share = np.where(held, np.float32(0), share)      # a held block cannot refault
        self.rate *= k
        self.rate[reads.blocks] += (np.float32(1) - k) * reads.values
        self.rate[self.rate < heat.FLUSH_BELOW] = 0
        thrashing = self.share > 0
        reads = float(self.rate[thrashing].sum(dtype=np.float64))
        if reads > 0:
            self.ratio = float(self.share[thrashing].sum(dtype=np.float64)) / reads
        else:
            self.ratio *= float(k)
            if self.ratio < heat.FLUSH_BELOW:
                self.ratio = 0.0

    @property
    def active(self) -> bool:
        return self.ratio > 0 or bool(self.share.any())

    def estimate(self, held: np.ndarray) -> np.ndarray:
        """Per block: the share it refaults (unheld) or would refault if let go (held)."""
        held_est = np.minimum(self.rate * np.float32(self.ratio), np.float32(1))
        return np.where(held, held_est, self.share)

    def multiplier(self, held: np.ndarray) -> np.ndarray:
        """The ranking's factor per block: held blocks at their estimate, challengers
        at ``1 - MARGIN`` of their share."""
        est = self.estimate(held)
        counted = np.where(held, est, est * np.float32(1 - MARGIN))
        return 1 + np.float32(WEIGHT) * counted

    def thrashing(self, held: np.ndarray) -> np.ndarray:
        """The unheld blocks refaulting at least ``SHOWN`` of their pages a cycle."""
        return np.flatnonzero((self.share >= SHOWN) & ~held)
