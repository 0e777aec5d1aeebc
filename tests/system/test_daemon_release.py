"""A block the daemon let go is not taken for the guest's while its residency is still our doing.

In process (``DiskWatcher`` with an injected clock) on a real data image and the
real page cache; the guest's region is cached and mlocked by the test (``held``)
so that it stays resident whatever the kernel reclaims.
"""

from __future__ import annotations

from tests.pagecache import data_image, held
from vmdisktouch import daemon, settings
from vmdisktouch.core import heat
from vmdisktouch.system.image import open_image

MiB = 1 << 20
A = slice(8, 16)


def test_released_blocks_do_not_heat_until_the_grace_has_passed(tmp_path):
    path = data_image(tmp_path / "disk.raw", 64 * MiB)
    assert heat.RELEASED_GRACE == 20.0
    with held(path, [(8 * MiB, 8 * MiB)]):
        cfg = settings.resolve({"path": path, "max_hold": "16M", "interval": 5.0, "min_free": 0})
        w = daemon.DiskWatcher(open_image(path), cfg)
        now = [0.0]
        w.clock = lambda: now[0]

        def tick():
            now[0] += 5.0
            w.tick()
            return float(w.state.heat_resident[A].mean())

        try:
            tick()
            tick()
            (s, e), = w.holder.held_runs()
            assert s <= 8 and e >= 16
            w.hold_enabled = False              # e.g. the domain stopped: everything goes
            h = [tick()]                        # t = 15: released in this tick
            assert w.holder.held_runs() == []
            h += [tick() for _ in range(5)]     # t = 20, 25, 30: within the grace; t = 35: past it
            # Still fully resident (the guest's pages are pinned), yet no heat for 20 s:
            # the residency right after a release is the daemon's own doing.
            assert h[1] < h[0] and h[2] < h[1] and h[3] < h[2], h
            assert h[4] > h[3] + 0.2, h             # then the guest's residency counts again
        finally:
            w.close()


def test_a_lease_that_ran_out_is_renewed_on_its_residency_at_once(tmp_path):
    """Released because its heat fell below the hysteresis level: no grace, re-held next cycle."""
    path = data_image(tmp_path / "disk.raw", 64 * MiB)
    with held(path, [(8 * MiB, MiB)]):                     # a lone guest block: a short lease
        cfg = settings.resolve({"path": path, "max_hold": "16M", "interval": 5.0, "min_free": 0})
        w = daemon.DiskWatcher(open_image(path), cfg)
        now = [0.0]
        w.clock = lambda: now[0]
        try:
            held_at = []
            for _ in range(16):
                now[0] += 5.0
                w.tick()
                held_at.append(any(s <= 8 < e for s, e in w.holder.held_runs()))
            gaps = [i for i in range(1, len(held_at)) if not held_at[i] and held_at[i - 1]]
            assert gaps, held_at                             # the lease ran out at least once
            for i in gaps:                                   # and was renewed the next cycle
                assert i + 1 == len(held_at) or held_at[i + 1], held_at
            assert not w.released.blocks.size or 8 not in w.released.blocks.tolist()
        finally:
            w.close()
