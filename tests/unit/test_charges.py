"""charges: the cap on another group's pages and which held blocks to recharge (pure)."""

from __future__ import annotations

import numpy as np

from vmdisktouch.core.charges import GroupFigures, cap, charges, to_recharge

MiB = 1 << 20
VM = GroupFigures(ino=7, path="/machine/vm1", limit=256 * MiB, pinned=210 * MiB)
OWN = 3


def test_the_cap_is_a_share_of_the_limit_while_the_group_has_room():
    idle = GroupFigures(7, "/vm", 256 * MiB, pinned=200 * MiB)     # 200 of it is ours
    assert cap(idle, 200 * MiB, 0.1) == int(25.6 * MiB)


def test_the_cap_shrinks_as_the_group_s_own_memory_grows():
    # The VM's own use (usage - held) is 200 MiB: only 256 - 200 - 16 = 40 MiB is left.
    g = GroupFigures(7, "/vm", 256 * MiB, pinned=230 * MiB)
    assert cap(g, 30 * MiB, 0.25) == 40 * MiB
    full = GroupFigures(7, "/vm", 256 * MiB, pinned=250 * MiB)    # at its limit
    assert cap(full, 10 * MiB, 0.25) == 0


def test_no_cap_without_a_limit_or_with_share_one():
    assert cap(GroupFigures(7, "/vm", None, 10 * MiB), 5 * MiB, 0.1) is None
    assert cap(VM, 200 * MiB, 1.0) is None


def test_charges_per_foreign_group_skip_own_unknown_and_unlimited_caps():
    block_ino = np.array([7, 7, 7, 3, 9, 0, 11], dtype=np.uint64)
    block_bytes = np.array([MiB, MiB, MiB // 2, MiB, MiB, 0, MiB])
    groups = {7: VM, 3: GroupFigures(3, "/daemon", 64 * MiB, 0),
              9: GroupFigures(9, "/free", None, 5 * MiB)}         # 11: removed meanwhile
    out = {c.group.ino: c for c in charges(block_ino, block_bytes, groups, OWN, 0.1)}
    assert set(out) == {7, 9}
    assert out[7].held == int(2.5 * MiB) and out[7].cap is not None
    assert out[9].cap is None and out[9].excess == 0
    assert out[7].at_limit is False
    at = charges(block_ino, block_bytes, {7: GroupFigures(7, "/vm", 256 * MiB, 255 * MiB)},
                 OWN, 0.1)
    assert at[0].at_limit and at[0].cap == 0


def test_recharge_takes_quiet_cool_blocks_first_up_to_the_excess():
    n = 10
    block_ino = np.full(n, 7, dtype=np.uint64)
    block_bytes = np.full(n, MiB)
    quiet = np.ones(n, dtype=bool)
    quiet[[0, 1]] = False                         # being rewritten: last
    heat = np.linspace(1.0, 0.1, n)               # block 9 coolest
    g = GroupFigures(7, "/vm", 40 * MiB, pinned=12 * MiB)
    c, = charges(block_ino, block_bytes, {7: g}, OWN, 0.1)      # cap 4 MiB: excess 6 MiB
    assert c.cap == 4 * MiB and c.excess == 6 * MiB
    runs = to_recharge(block_ino, block_bytes, quiet, heat, [c], per_cycle=1 << 40)
    assert runs == [(4, 10)]                      # the six coolest quiet blocks
    runs = to_recharge(block_ino, block_bytes, quiet, heat, [c], per_cycle=2 * MiB)
    assert runs == [(8, 10)]                      # paced: two blocks this cycle


def test_a_group_at_its_limit_is_not_paced():
    n = 8
    block_ino = np.full(n, 7, dtype=np.uint64)
    block_bytes = np.full(n, MiB)
    g = GroupFigures(7, "/vm", 32 * MiB, pinned=32 * MiB)
    c, = charges(block_ino, block_bytes, {7: g}, OWN, 0.1)
    assert c.at_limit and c.cap == 0
    runs = to_recharge(block_ino, block_bytes, np.ones(n, bool), np.zeros(n), [c],
                       per_cycle=MiB)
    assert runs == [(0, 8)]


class FakeReader:
    """memcg.MemcgReader at its seam: the charges of the sampled pages are given."""

    def __init__(self, samples):
        self.samples = np.asarray(samples, dtype=np.uint64)

    def own(self):
        from vmdisktouch.system.memcg import Group
        return Group(ino=OWN, path="/daemon", limit=None, usage=0, unevictable=0)

    def page_groups(self, addr, length, step):
        return self.samples[:-(-length // (4096 * step))]


def test_a_block_counts_only_its_foreign_pages():
    from vmdisktouch.system.charge_tracker import STEP_PAGES, ChargeTracker

    per_block = MiB // (4096 * STEP_PAGES)                     # 16 samples a block
    block0 = [7] * 6 + [OWN] * 10                              # 6 of 16 pages the guest's
    block1 = [0] * 16                                          # not present
    block2 = [9] * 3 + [7] * 5 + [OWN] * 8                     # mostly group 7
    t = ChargeTracker(FakeReader(block0 + block1 + block2), MiB, 4)
    t._sample(0, 3, addr=0, length=3 * MiB)
    assert t.ino[:3].tolist() == [7, 0, 7]
    assert t.bytes[:3].tolist() == [6 * MiB // per_block, 0, 5 * MiB // per_block]


def test_held_blocks_are_resampled_in_turn_not_all_at_once():
    """New blocks are sampled at once; the held ones again a rotating share per
    cycle, in proportion to the time passed, so each within RESAMPLE_SECONDS."""
    from vmdisktouch.system.charge_tracker import RESAMPLE_SECONDS, ChargeTracker

    class Holder:
        def __init__(self):
            self.asked = []

        def mappings(self, runs):
            for a, b in runs:
                self.asked.extend(range(a, b))
                yield a, b, a * MiB, (b - a) * MiB

    n, step = 120, RESAMPLE_SECONDS / 12                       # 5 s cycles
    t = ChargeTracker(FakeReader([7] * 16 * n), MiB, n)
    h = Holder()
    held = np.zeros(n, bool)
    held[10:110] = True                                       # 100 held blocks
    t.update(h, np.zeros(n, bool), held, now=0.0)
    assert sorted(h.asked) == list(range(10, 110))             # all new: all sampled
    seen = set()
    for k in range(1, 13):
        h.asked = []
        t.update(h, held, held, now=k * step)
        assert len(h.asked) == 9                               # ceil(100 / 12), not 100
        seen.update(h.asked)
    assert seen == set(range(10, 110))                         # every one within 60 s
    h.asked = []
    more = held.copy()
    more[110:115] = True
    t.update(h, held, more, now=13 * step)                     # 5 new ones, plus a share
    assert set(range(110, 115)) <= set(h.asked) and len(h.asked) == 5 + 9


def test_the_resample_is_bounded_per_cycle_however_much_is_held(monkeypatch):
    from vmdisktouch.system import charge_tracker
    from vmdisktouch.system.charge_tracker import ChargeTracker

    monkeypatch.setattr(charge_tracker, "RESAMPLE_MAX_BYTES", 4 * MiB)

    class Holder:
        asked = 0

        def mappings(self, runs):
            for a, b in runs:
                Holder.asked += b - a
                yield a, b, a * MiB, (b - a) * MiB

    n = 1200
    t = ChargeTracker(FakeReader([7] * 16 * n), MiB, n)
    held = np.ones(n, bool)
    t.update(Holder(), np.zeros(n, bool), held, now=0.0)
    Holder.asked = 0
    t.update(Holder(), held, held, now=5.0)                    # 1/12 would be 100 blocks
    assert Holder.asked == 4
