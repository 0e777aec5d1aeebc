"""charges: the cap on another group's pages and which held blocks to recharge (pure)."""

from __future__ import annotations

import numpy as np

from vmdisktouch.core.charges import GroupFigures, cap, charges, recount, to_recharge

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
        from vmdisktouch.system.cgroup.memcg import Group
        return Group(ino=OWN, path="/daemon", limit=None, usage=0, unevictable=0)

    def page_groups(self, addr, length, step):
        return self.samples[:-(-length // (4096 * step))]


def test_a_block_counts_only_its_foreign_pages():
    from vmdisktouch.system.cgroup.charge_tracker import STEP_PAGES, ChargeTracker

    per_block = MiB // (4096 * STEP_PAGES)                     # 16 samples a block
    block0 = [7] * 6 + [OWN] * 10                              # 6 of 16 pages the guest's
    block1 = [0] * 16                                          # not present
    block2 = [9] * 3 + [7] * 5 + [OWN] * 8                     # mostly group 7
    own_only = ChargeTracker(FakeReader([OWN] * 16 + block1), MiB, 4)
    own_only._sample(0, 2, addr=0, length=2 * MiB)              # nothing foreign
    assert own_only.group.size == 0 and own_only.bytes.size == 0   # no per-block arrays
    t = ChargeTracker(FakeReader(block0 + block1 + block2), MiB, 4)
    t._sample(0, 3, addr=0, length=3 * MiB)
    assert t.group.size == 4
    assert t.ino[:3].tolist() == [7, 0, 7]
    assert t.bytes[:3].tolist() == [6 * MiB // per_block, 0, 5 * MiB // per_block]


def test_held_blocks_are_resampled_in_turn_not_all_at_once():
    """New blocks are sampled at once; the held ones again a rotating share per
    cycle, in proportion to the time passed, so each within RESAMPLE_SECONDS."""
    from vmdisktouch.system.cgroup.charge_tracker import RESAMPLE_SECONDS, ChargeTracker

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
    from vmdisktouch.system.cgroup import charge_tracker
    from vmdisktouch.system.cgroup.charge_tracker import ChargeTracker

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


# ---------------------------------------------------------------------------
# The overshoot's bound (core/charges.py's docstring, "Overshoot"): the cap never
# above its share or the group's free headroom; after the unpaced cede step every
# group within its cap; a paced recharge takes its pace (plus at most one block)
# and at least that much of the excess; ``recount`` keeps the status true.

def random_case(rng):
    n = int(rng.integers(1, 60))
    groups = {}
    for ino in (7, 8, 9):
        limit = int(rng.integers(8, 512)) * MiB
        groups[ino] = GroupFigures(ino, f"/g{ino}", limit, int(rng.integers(0, limit + 1)))
    block_ino = rng.choice(np.array([0, OWN, 7, 8, 9], dtype=np.uint64), n)
    block_bytes = np.where(block_ino != 0, rng.integers(1, 17, n) * (MiB // 16), 0)
    quiet = rng.random(n) < 0.7
    heat = rng.random(n).astype(np.float32)
    return groups, block_ino, block_bytes, quiet, heat


def held_after(block_ino, block_bytes, runs, ino):
    keep = np.ones(block_ino.size, bool)
    for a, b in runs:
        keep[a:b] = False
    return int(block_bytes[(block_ino == ino) & keep].sum())


def test_the_cap_never_exceeds_the_share_or_the_free_headroom():
    rng = np.random.default_rng(31)
    for _ in range(2000):
        limit = int(rng.integers(1, 1 << 12)) * MiB
        pinned = int(rng.integers(0, limit + 1))
        held = int(rng.integers(0, pinned + 1))
        share = float(rng.choice([0.0, 0.05, 0.1, 0.5, 0.999]))
        g = GroupFigures(7, "/vm", limit, pinned)
        c = cap(g, held, share)
        headroom = limit - (pinned - held) - int(limit / 16)
        assert 0 <= c <= max(0, min(int(share * limit), headroom)), (limit, pinned, held, share)
        if limit - pinned < limit / 32:
            assert c == 0


def test_after_the_unpaced_cede_step_every_group_is_within_its_cap():
    rng = np.random.default_rng(9)
    for _ in range(1000):
        groups, block_ino, block_bytes, quiet, heat = random_case(rng)
        share = float(rng.choice([0.0, 0.1, 0.3]))
        over = [c for c in charges(block_ino, block_bytes, groups, OWN, share) if c.excess]
        runs = to_recharge(block_ino, block_bytes, quiet, heat, over, per_cycle=1 << 62)
        for c in charges(block_ino, block_bytes, groups, OWN, share):
            assert held_after(block_ino, block_bytes, runs, c.group.ino) <= c.cap, c
        chosen = np.concatenate([np.arange(a, b) for a, b in runs] or [np.zeros(0, int)])
        assert set(block_ino[chosen].tolist()) <= {c.group.ino for c in over}


def test_a_paced_recharge_takes_its_pace_and_no_more_than_one_block_beyond():
    rng = np.random.default_rng(16)
    for _ in range(1000):
        groups, block_ino, block_bytes, quiet, heat = random_case(rng)
        per_cycle = int(rng.integers(1, 64)) * (MiB // 4)
        over = [c for c in charges(block_ino, block_bytes, groups, OWN, 0.1) if c.excess]
        runs = to_recharge(block_ino, block_bytes, quiet, heat, over, per_cycle)
        took = {c.group.ino: c.held - held_after(block_ino, block_bytes, runs, c.group.ino)
                for c in over}
        at = sum(took[c.group.ino] for c in over if c.at_limit)
        paced = [c for c in over if not c.at_limit]
        moved = sum(took[c.group.ino] for c in paced)
        for c in over:
            if c.at_limit:                               # no pace: all of its excess
                assert c.held - took[c.group.ino] <= c.cap
        if at >= per_cycle:
            assert moved == 0
        else:
            assert moved < per_cycle - at + MiB            # one block at most past the pace
            need = sum(c.excess for c in paced)
            assert moved >= min(need, per_cycle - at)      # the excess shrinks by the pace


def test_recount_after_a_release_counts_what_is_left_and_keeps_the_group_s_own_memory():
    block_ino = np.array([7, 7, 7, 7, 7, 7, 9], dtype=np.uint64)
    block_bytes = np.full(7, MiB)
    g = GroupFigures(7, "/vm", 40 * MiB, pinned=16 * MiB)          # 10 of its own, 6 ours
    last = charges(block_ino, block_bytes, {7: g, 9: GroupFigures(9, "/b", 64 * MiB, MiB)},
                   OWN, 0.1)
    assert [c.held for c in last] == [6 * MiB, MiB] and last[0].excess == 2 * MiB
    block_ino[[0, 1, 6]] = 0                                       # released: ceded
    block_bytes[[0, 1, 6]] = 0
    c, = recount(last, block_ino, block_bytes, 0.1)                # group 9: nothing held
    assert c.group.pinned == 14 * MiB and c.held == 4 * MiB and c.excess == 0
    assert c.cap == cap(GroupFigures(7, "/vm", 40 * MiB, 14 * MiB), 4 * MiB, 0.1)


# -- Recharger.act with a guest that reads blocks again between drop and reload ---------

class Guest:
    """Whose each block's pages are, and a holder and a memcg reader over that."""

    def __init__(self, n, limit, rereads=(), loads=True):
        self.owner = np.full(n, 7, dtype=np.uint64)       # all cached by the guest first
        self.held = np.zeros(n, bool)
        self.limit, self.rereads, self.loads = limit, set(rereads), loads
        self.last_holes, self.lock_cap = [], None
        self.pinned_seen = []                              # group 7's pinned bytes, each apply

    # the holder
    def held_runs(self):
        from vmdisktouch.core.regions import mask_runs
        return mask_runs(self.held)

    def held_bytes(self):
        return int(self.held.sum()) * MiB

    def apply(self, targets):
        from vmdisktouch.system.hold.holder import ApplyResult
        want = np.zeros(self.held.size, bool)
        for a, b in targets:
            want[a:b] = True
        if not self.loads:                                 # the floor: nothing more is locked
            want &= self.held
        released, loaded = int((self.held & ~want).sum()), int((want & ~self.held).sum())
        self.held = want
        self.pinned_seen.append(self.pinned())
        return ApplyResult(loaded * MiB, released * MiB)

    def release(self, runs):
        n = 0
        for a, b in runs:
            n += int(self.held[a:b].sum())
            self.held[a:b] = False
        return n * MiB

    def drop(self, runs):
        n = self.release(runs)
        for a, b in runs:
            for i in range(a, b):            # read back by the daemon, unless the guest was first
                self.owner[i] = 7 if i in self.rereads else OWN
        return n

    def mappings(self, runs):
        for a, b in runs:
            yield a, b, a * MiB, (b - a) * MiB

    # the memcg reader
    def own(self):
        from vmdisktouch.system.cgroup.memcg import Group
        return Group(ino=OWN, path="/daemon", limit=None, usage=0, unevictable=0)

    def pinned(self):
        return int((self.held & (self.owner == 7)).sum()) * MiB

    def group(self, ino):
        from vmdisktouch.system.cgroup.memcg import Group
        if ino != 7:
            return None
        return Group(ino=7, path="/vm", limit=self.limit, usage=0, unevictable=self.pinned(),
                     anon=0)

    def page_groups(self, addr, length, step):
        per_block = MiB // (4096 * step)
        return np.repeat(self.owner[addr // MiB: (addr + length) // MiB], per_block)

    def close(self):
        pass


def act_once(guest, n, tracker=None):
    from types import SimpleNamespace
    from vmdisktouch.core.policy import Plan
    from vmdisktouch.daemon.act import Recharger
    from vmdisktouch.system.cgroup.charge_tracker import ChargeTracker

    tracker = tracker or ChargeTracker(guest, MiB, n)
    config = SimpleNamespace(load_rate=256 * MiB, interval=5.0, foreign_share=0.1)
    plan = Plan([(0, n)], np.zeros(n, np.float32), None, np.ones(n, bool))
    acted = Recharger(guest, tracker, "img").act(plan, guest.held.copy(), 1.0, config,
                                                 holding=True)
    return tracker, acted


def test_a_cycle_ends_with_the_group_within_its_cap_and_the_status_says_so():
    """Ten blocks the guest cached are locked (charged to it: over the 4 MiB cap
    until sampled), six are recharged, two of them the guest read again between
    drop and reload: those are ceded. The group ends within its cap, and the
    figures the status shows are the ones after the cede, not before."""
    n, cap_bytes = 10, 4 * MiB
    guest = Guest(n, limit=40 * MiB, rereads=(0, 1))
    tracker, acted = act_once(guest, n)
    assert guest.pinned_seen[0] == n * MiB                  # the window: all of what was locked
    assert acted.ceded and guest.pinned() <= cap_bytes      # the end of the cycle: within
    c, = tracker.last
    assert c.held == guest.pinned() and c.held <= c.cap == cap_bytes, c
    assert tracker.status()["groups"][0]["held_bytes"] <= cap_bytes


def test_a_recharge_nothing_could_reload_is_shown_as_it_ends():
    """Held blocks over the cap are dropped but the floor lets nothing be locked
    again: the status shows what is still held, not the figures before the drop."""
    from vmdisktouch.system.cgroup.charge_tracker import ChargeTracker

    n = 10
    guest = Guest(n, limit=40 * MiB, loads=False)
    guest.held[:] = True
    tracker = ChargeTracker(guest, MiB, n)
    tracker.update(guest, np.zeros(n, bool), guest.held.copy(), now=0.0)
    tracker, acted = act_once(guest, n, tracker)
    assert acted.result.loaded_bytes == 0 and guest.pinned() == 4 * MiB
    c, = tracker.last
    assert c.held == 4 * MiB and c.excess == 0, c


def test_the_group_codes_of_released_blocks_are_dropped_and_the_others_kept(monkeypatch):
    """A block keeps a 32-bit code of its group (the inode in a table): groups come and go
    on a host, so past ``CODES_KEPT`` codes the unused ones go, and every held block still
    names its group."""
    from vmdisktouch.system.cgroup import charge_tracker
    from vmdisktouch.system.cgroup.charge_tracker import ChargeTracker

    monkeypatch.setattr(charge_tracker, "CODES_KEPT", 4)
    t = ChargeTracker(None, MiB, 8)
    t._made()
    assert t.group.dtype == np.uint32 and t.bytes.dtype == np.uint32
    for block, ino in enumerate([101, 102, 103, 104, 105, 106, 107, 108]):
        if block >= 2:
            t.group[block - 2] = 0                           # released, its group unused
        t.group[block] = t._code(ino)
    assert t.ino.tolist() == [0] * 6 + [107, 108]
    assert len(t._inos) <= 4 + 2
    t.group[3] = t._code(107)                                # a known group: its code
    assert t.ino.tolist() == [0, 0, 0, 107, 0, 0, 107, 108]
