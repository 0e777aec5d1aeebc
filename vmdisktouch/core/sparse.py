"""A few values of a per-block map, kept sparse: rewrites, releases, blocks shown red.

A guest rewrites or the daemon releases a few blocks of a million in one
cycle; these sets are kept as sorted block numbers with one value each (a
fraction, or the time of the event) rather than as full maps.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vmdisktouch.core.runs import Run, consecutive_edges, consecutive_runs


@dataclass(frozen=True)
class Sparse:
    """Values of a few blocks of a per-block map: block numbers (sorted, unique) and values."""
    blocks: np.ndarray
    values: np.ndarray

    @classmethod
    def empty(cls) -> "Sparse":
        return cls(np.zeros(0, dtype=np.intp), np.zeros(0))

    @classmethod
    def of_mask(cls, mask: np.ndarray, value: float) -> "Sparse":
        """The blocks of ``mask``, each with ``value``."""
        blocks = np.flatnonzero(mask)
        return cls(blocks, np.full(blocks.size, value))

    def where(self, keep: np.ndarray) -> "Sparse":
        return Sparse(self.blocks[keep], self.values[keep])

    def below(self, n: int) -> "Sparse":
        return self.where(self.blocks < n)

    def newer_than(self, now: float, seconds: float) -> "Sparse":
        """The entries whose value (a time) is less than ``seconds`` before ``now``."""
        return self.where(now - self.values < seconds)

    def merged(self, newer: "Sparse") -> "Sparse":
        """Both sets of blocks; ``newer``'s value where both have one."""
        blocks = np.concatenate((newer.blocks, self.blocks))
        values = np.concatenate((newer.values, self.values))
        blocks, first = np.unique(blocks, return_index=True)   # first: newer wins
        return Sparse(blocks, values[first])

    def dense(self, n: int, always: bool = False) -> np.ndarray | None:
        """The full float32 map (0 elsewhere); None when empty unless ``always``."""
        if not self.blocks.size and not always:
            return None
        out = np.zeros(n, dtype=np.float32)
        out[self.blocks] = self.values
        return out

    def runs(self) -> list[Run]:
        """Maximal runs of consecutive blocks."""
        return consecutive_runs(self.blocks)

    def run_edges(self) -> tuple[np.ndarray, np.ndarray]:
        """``runs`` as two arrays, starts and stops."""
        return consecutive_edges(self.blocks)
