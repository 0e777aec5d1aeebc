"""Host: several real images under one budget (mincore source, real holders, real page
cache): the hottest regions of every disk share the budget, the sum held never exceeds it,
and a disk that fails is dropped while the others go on."""

from __future__ import annotations

import itertools
import os

import pytest

from tests.support.clocks import Stepped
from tests.support.pagecache import data_image, held
from vmdisktouch.config import settings
from vmdisktouch.daemon.build import build
from vmdisktouch.daemon.host import Host, NoDiskLeft
from vmdisktouch.system.image import open_image

MiB = 1 << 20


@pytest.fixture
def host(tmp_path):
    made = []

    def make(paths, budget, named=False, **kw):
        """A host of ``paths`` (named ``vmN/vda`` with ``named``); ``kw``: more settings."""
        clock = Stepped()
        cfg = settings.resolve({"max_hold": budget, "interval": 5.0, "min_free": 0,
                                "access_source": "mincore", "load_rate": 0,
                                "sigma_resident": 0, **kw})     # regions exactly the zones
        watchers = [build(open_image(p), cfg, clock=clock, memcg=None) for p in paths]
        for k, w in enumerate(watchers if named else []):
            w.domain, w.target = f"vm{k + 1}", "vda"
        h = Host(watchers, cfg.max_hold, cfg.block_size)
        h.test_clock = clock
        made.append(h)
        return h

    yield make
    for h in made:
        h.close()


def tick(h):
    h.test_clock.t += 5.0
    return h.tick()


def held_of(h, path):
    return next(w.holder.held_bytes() for w in h.watchers if w.image.path == path)


def test_the_hottest_regions_of_all_disks_share_one_budget(tmp_path, host):
    a = data_image(tmp_path / "a.img", 64 * MiB)
    b = data_image(tmp_path / "b.img", 64 * MiB)
    c = data_image(tmp_path / "c.img", 64 * MiB)
    h = host([a, b, c], "20M")
    with held(a, [(8 * MiB, 16 * MiB)]), held(b, [(32 * MiB, 8 * MiB)]):
        for _ in range(3):
            tick(h)
            assert h.held_bytes() <= 20 * MiB
    assert h.held_bytes() == 20 * MiB                       # the budget is used
    # Equally dense zones at the edge of the budget share it by their sizes (before #32:
    # the larger zone whole, 16M, and the smaller one the 4M left).
    ha, hb = held_of(h, a), held_of(h, b)
    assert ha + hb == 20 * MiB and ha >= 10 * MiB and hb >= 6 * MiB
    assert held_of(h, c) == 0
    st = h.report(1.0, 0)
    assert st.budget_bytes == 20 * MiB and st.held_bytes == 20 * MiB
    assert [d.held_bytes for d in st.lines] == [ha, hb, 0]
    # each disk's share is what it was given (nothing of the budget is left free)
    assert [d.share_bytes for d in st.lines] == [ha, hb, 0]
    assert [d.budget_bytes for d in st.disks] == [ha, hb, 0]
    assert [d.wanted_bytes for d in st.disks] == [16 * MiB, 8 * MiB, 0]
    assert [d.limited_by for d in st.disks] == ["budget", "budget", "no_evidence"]
    assert [d.path for d in st.disks] == [a, b, c]


def test_a_failing_disk_is_dropped_and_the_others_go_on(tmp_path, host):
    a = data_image(tmp_path / "a.img", 32 * MiB)
    b = data_image(tmp_path / "b.img", 32 * MiB)
    h = host([a, b], "32M")
    with held(a, [(0, 8 * MiB)]), held(b, [(0, 8 * MiB)]):
        for _ in range(4):
            tick(h)
        assert held_of(h, a) == held_of(h, b) == 8 * MiB
        os.unlink(b)                                        # deleted under the daemon
        data_image(tmp_path / "b.img", 32 * MiB)            # and replaced
        tick(h)
        assert [w.image.path for w in h.watchers] == [a]
        assert b in h.failed and ("replaced" in h.failed[b] or "deleted" in h.failed[b])
        assert held_of(h, a) == 8 * MiB
        tick(h)                                             # and goes on
    os.unlink(a)
    with pytest.raises(NoDiskLeft):
        tick(h)


def test_a_cap_and_a_weight_from_the_overrides(tmp_path, host):
    a = data_image(tmp_path / "a.img", 32 * MiB)
    b = data_image(tmp_path / "b.img", 32 * MiB)
    h = host([a, b], "16M")
    h.set_override(a, cap=4 * MiB)                      # a may hold 4M at most
    h.set_override(b, weight=1.0)
    with held(a, [(0, 12 * MiB)]), held(b, [(0, 8 * MiB)]):
        for _ in range(4):
            tick(h)
        assert held_of(h, a) == 4 * MiB and held_of(h, b) == 8 * MiB
        h.set_override(a)                               # no cap; b weighs 2: b first
        h.set_override(b, weight=2.0)
        tick(h)     # (the polling source's lease then passes the budget around: core/heat)
        assert held_of(h, b) == 8 * MiB and held_of(h, a) == 8 * MiB
        assert [d.weight for d in h.report(1.0, 0).lines] == [1.0, 2.0]


class Ticking(Stepped):
    """Moves by one second at each reading: time passes wherever the clock is read."""

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


def test_a_disks_cycle_time_is_its_own_not_the_other_disks(tmp_path):
    paths = [data_image(tmp_path / f"{n}.img", 16 * MiB) for n in "abc"]
    cfg = settings.resolve({"max_hold": "8M", "interval": 5.0, "min_free": 0,
                            "access_source": "mincore", "load_rate": 0})

    def first_disk_seconds(served):
        clock = Ticking()
        h = Host([build(open_image(p), cfg, clock=clock, memcg=None) for p in served],
                 cfg.max_hold, cfg.block_size)
        try:
            reports = [h.tick() for _ in range(3)]
            assert h.report(1.0, 0).cycle_seconds > 0
            return [r[0].cycle_seconds for r in reports]
        finally:
            h.close()

    alone = first_disk_seconds(paths[:1])
    assert alone[-1] > 0
    assert first_disk_seconds(paths) == alone      # the other two disks' turns not counted


def test_the_sum_held_never_exceeds_the_budget_whatever_the_policy_asks(tmp_path, monkeypatch):
    """The host's ledger bounds the holders where they lock: with the selection forced to
    ask for every block of three 64 MiB disks (a seam over ``host.select``), VmLck summed
    over the disks stays within the 80M budget after every cycle and between every chunk
    of every load (sampled where each chunk reads MemAvailable); a lower budget (a reload)
    cuts it at once."""
    from dataclasses import replace

    from tests.support.procfs import vmlck
    from vmdisktouch.daemon import host as host_mod
    from tests.support.images import evict

    real = host_mod.select

    def over_ask(maps, budget_blocks, factor, spilled):
        alloc, spills = real(maps, budget_blocks, factor, spilled)
        return replace(alloc, runs=[[(0, len(m.total_heat))] for m in maps]), spills

    monkeypatch.setattr(host_mod, "select", over_ask)
    paths = [data_image(tmp_path / f"{n}.img", 64 * MiB) for n in "abc"]
    base, seen = vmlck("self"), []
    clock = Stepped()
    cfg = settings.resolve({"max_hold": "80M", "interval": 5.0, "min_free": 0,
                            "access_source": "mincore", "load_rate": "4G"})

    def sample() -> int:                   # MemAvailable, read before the chunks are locked
        seen.append(vmlck("self") - base)
        return 1 << 50

    watchers = []
    for p in paths:
        evict(p)
        watchers.append(build(open_image(p), cfg, clock=clock, memcg=None, mem_available=sample))
    h = Host(watchers, cfg.max_hold, cfg.block_size)
    try:
        for _ in range(3):
            clock.t += 5.0
            h.tick()
            seen.append(vmlck("self") - base)
        assert max(seen) <= 80 * MiB and h.held_bytes() == 80 * MiB, seen
        assert len(seen) > 6                                  # loads were sampled between chunks
        assert h.set_budget(24 * MiB) == 56 * MiB
        assert vmlck("self") - base == 24 * MiB == h.held_bytes()
        clock.t += 5.0
        h.tick()
        assert vmlck("self") - base <= 24 * MiB
    finally:
        h.close()
    assert vmlck("self") == base


def test_with_a_curve_for_every_disk_the_curves_decide_how_much_and_heat_which_blocks(
        tmp_path, host, monkeypatch):
    """Two equally hot 16M zones, 20M of budget: by heat they share it (10M and 10M, by
    their sizes); with curves where a's zone saves ten times the reads, a holds its zone
    whole and b the 4M left, said as ``curve``; a disk without a curve puts the heat
    back in charge."""
    import numpy as np

    from vmdisktouch.core.shares import Demand
    a = data_image(tmp_path / "a.img", 64 * MiB)
    b = data_image(tmp_path / "b.img", 64 * MiB)
    h = host([a, b], "20M")

    def zone(s):
        return np.where(np.asarray(s) >= 16 * MiB, 0.9, np.asarray(s) / (16 * MiB) * 0.9)
    rates = {a: 10_000.0, b: 1000.0}
    wants = {a: 8 * MiB, b: None}              # what each curve says still pays
    for w in h.watchers:
        monkeypatch.setattr(w, "demand", lambda m, weight=1.0, p=w.image.path:
                            Demand(zone, rates[p], 1.0, weight))
        monkeypatch.setattr(w, "curve_wants", lambda candidates, p=w.image.path: wants[p])
    h.alerts.clock = itertools.count(0.0, 30.0).__next__    # a verdict holds its minute
    with held(a, [(8 * MiB, 16 * MiB)]), held(b, [(32 * MiB, 16 * MiB)]):
        for _ in range(3):
            tick(h)
            assert h.held_bytes() <= 20 * MiB
        assert (held_of(h, a), held_of(h, b)) == (16 * MiB, 4 * MiB)
        st = h.report(1.0, 0)
        assert [d.limited_by for d in st.disks] == [None, "curve"]
        assert "memory saves more reads elsewhere" in st.disks[1].not_held_reason
        # What a disk wants: its candidates, no more than what its curve says pays.
        assert [d.wanted_bytes for d in st.disks] == [8 * MiB, 16 * MiB]
        # Read against its share, a's curve (8M) says too large; b's has no verdict (its
        # curve wants None: young), so the host's cannot be too large (b may want it), nor
        # right beside a's too large: none yet.
        assert st.lines[0].budget_advice == {"verdict": "too_large", "bytes": 8 * MiB}
        assert st.lines[1].budget_advice is None
        assert st.budget_advice is None
        monkeypatch.setattr(h.watchers[1], "demand", lambda m, weight=1.0: None)
        for _ in range(3):
            tick(h)
        assert held_of(h, a) + held_of(h, b) == 20 * MiB and held_of(h, b) >= 6 * MiB
