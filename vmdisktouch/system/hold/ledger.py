"""The host's one budget, kept where memory is locked.

Theory of operation
-------------------
Every holder of a host draws from one ``Ledger``: the budget (``max_hold``,
bytes) and the holders that lock against it. Before each chunk it locks, a
holder asks the ledger for the room left, the budget less what all of the
host's holders hold now (``room``), and locks no more than that. So the sum
held over the disks never exceeds the budget, not even for one chunk in the
middle of a cycle, whatever the policy asks for: the policy chooses what to
hold, the ledger bounds how much.

The budget is one number, changed in one place (``set_budget``, a reload):
when it falls below what is held, the excess is released at once, from the
holders in the reverse of the order they joined, each from its
lowest-priority holds, and the next cycle's selection spreads the budget over
the disks again. A holder joins a ledger of its own when it is made, the
host's when the host adopts it (``adopt``), and leaves when it is closed.
"""

from __future__ import annotations


class Ledger:
    """The bytes the holders of one host may lock, summed (``budget``)."""

    def __init__(self, budget: int):
        self.budget = int(budget)
        self.holders: list = []

    def join(self, holder) -> None:
        self.holders.append(holder)

    def adopt(self, holder) -> None:
        """``holder``, made with a ledger of its own, draws from this one from now on."""
        if holder.ledger is not self:
            holder.ledger.leave(holder)
            holder.ledger = self
            self.join(holder)

    def leave(self, holder) -> None:
        if holder in self.holders:
            self.holders.remove(holder)

    def held(self) -> int:
        """Bytes locked now by every holder of the host."""
        return sum(h.held_bytes() for h in self.holders)

    def room(self) -> int:
        """Bytes any one holder may still lock now (never below 0)."""
        return max(0, self.budget - self.held())

    def over(self) -> int:
        """Bytes held beyond the budget (0 when within it)."""
        return max(0, self.held() - self.budget)

    def set_budget(self, budget: int) -> int:
        """A new budget; the excess released at once. Returns bytes released."""
        self.budget = int(budget)
        released = 0
        for holder in reversed(self.holders):
            excess = self.over()
            if excess <= 0:
                break
            released += holder.release_lowest(min(excess, holder.held_bytes()))
        return released
